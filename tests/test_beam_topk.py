"""The fused beam candidates (runtime/kernels/triton_beam_topk.py) against today's torch path:
`_beam_candidates` on log_softmax(logits.float()) with the suppressed tokens at -inf after
the softmax. Buckets as the scheduler lays them out (groups of 1 row keeping 2 x beams, of 4
and 5 rows), vocabularies that end in a partial chunk, bf16 and float32 logits. Without a GPU
in Triton's interpreter (see conftest.py): small chunks stand in for the 8,192-token ones."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from seq2serve.runtime.executor.sampler import _beam_candidates
from seq2serve.runtime.executor.sampling_batch import SamplingBatch
from seq2serve.runtime.kernels.triton_beam_topk import beam_topk
from seq2serve.tests.beam_oracle import lower_id_first

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
# on a GPU, part of the GPU gate (scripts/gpu_check.py runs `-m gpu`); on the CPU, of CI
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []
_seeds = itertools.count(7000)
BUCKETS = [(2, 1, 8), (2, 4, 8), (1, 5, 10)]  # (groups, rows per group, keep)


def _distinct_logits(rows: int, vocab: int, dtype: torch.dtype, gen) -> torch.Tensor:
    """Random logits whose best 16 a row are distinct (bf16 has too few values for randn's
    to be): randn below 4, and 16 tokens a row at distinct values of 4 + j / 32 (exact in
    bf16). The candidates (and, with random float32 scores, across rows too) never tie."""
    logits = torch.randn(rows, vocab, generator=gen).clamp(-4, 3.9)
    for r in range(rows):
        tokens = torch.randperm(vocab, generator=gen)[:16]
        logits[r, tokens] = 4 + torch.randperm(128, generator=gen)[:16].float() / 32
    return logits.to(dtype).to(DEVICE)


def _reference(logits, scores, buckets, suppressed):
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    if suppressed is not None:
        logprobs[:, suppressed] = float("-inf")
    sb = SamplingBatch(**_empty_fields(), **SamplingBatch.beam_layout(scores, buckets, DEVICE))
    return _beam_candidates(logprobs, sb), logprobs + scores


def _empty_fields() -> dict:
    return dict(temperatures=None, greedy=None, all_greedy=True, top_ks=None, top_ps=None,
                min_ps=None, keys=None, penalty_ids=None, output_counts_ids=None,
                repetition=None, frequency=None, presence=None, banned_rows=None,
                banned_cols=None, forced_rows=None, forced_ids=None, want_logprobs=False,
                top_logprobs_num=0)


@pytest.mark.parametrize("dtype,vocab,block,suppress", [
    (torch.bfloat16, 1000, 256, True), (torch.bfloat16, 5003, 2048, False),
    (torch.float32, 5003, 1024, True), (torch.float32, 700, 1024, False)])
def test_against_torch(dtype, vocab, block, suppress):
    gen = torch.Generator().manual_seed(next(_seeds))
    rows = sum(g * r for g, r, _ in BUCKETS)
    logits = _distinct_logits(rows, vocab, dtype, gen)
    scores = (-10 * torch.rand(rows, 1, generator=gen)).to(DEVICE)
    suppressed = None
    if suppress:  # among them each row's best token: the candidates must skip it
        best = logits[:3].float().argmax(-1).tolist()
        suppressed = torch.tensor(sorted({*best, 0, vocab - 1}), device=DEVICE)
    (ref_v, ref_i), ref_all = _reference(logits, scores, BUCKETS, suppressed)
    v, i, best = beam_topk(logits, scores, BUCKETS, suppressed, block=block, argmax=True)
    assert v.dtype == torch.float32 and i.dtype == torch.int64
    torch.testing.assert_close(v, ref_v, rtol=1e-6, atol=1e-5)
    assert torch.equal(i, ref_i)
    assert torch.equal(best, ref_all.argmax(-1))


def test_strided_logits_as_contiguous():
    """A padded LM head's logits come as a view whose rows are wider than the vocabulary
    (`TritonOps.logits`): the candidates are those of the same logits made contiguous."""
    gen = torch.Generator().manual_seed(next(_seeds))
    rows, vocab = sum(g * r for g, r, _ in BUCKETS), 1003
    wide = _distinct_logits(rows, vocab + 61, torch.bfloat16, gen)
    view = wide[:, :vocab]
    assert not view.is_contiguous() and view.stride() == (vocab + 61, 1)
    scores = (-10 * torch.rand(rows, 1, generator=gen)).to(DEVICE)
    want = beam_topk(view.contiguous(), scores, BUCKETS, None, block=256, argmax=True)
    got = beam_topk(view, scores, BUCKETS, None, block=256, argmax=True)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_exact_ties_lower_id_first():
    """Equal values: the lower id (row in group * vocab + token) first, every time; equal
    rows of a group tie across rows too."""
    vocab, block = 600, 256
    gen = torch.Generator().manual_seed(next(_seeds))
    logits = torch.randint(-3, 3, (5, vocab), generator=gen).float().to(DEVICE)  # many ties
    logits[3] = logits[2]  # rows 2 and 3 of one group, identical, equal scores
    scores = torch.zeros(5, 1, device=DEVICE)
    buckets = [(1, 1, 6), (1, 4, 12)]
    v, i = beam_topk(logits, scores, buckets, block=block)
    v2, i2 = beam_topk(logits, scores, buckets, block=block)
    assert torch.equal(v, v2) and torch.equal(i, i2)
    # the rule: by value, best first, then by id
    logprobs = torch.log_softmax(logits, -1) + scores
    cand = 0
    for ids, values in lower_id_first(logprobs, buckets):
        assert i[cand:cand + len(ids)].tolist() == ids
        torch.testing.assert_close(v[cand:cand + len(ids)], torch.tensor(values, device=DEVICE))
        cand += len(ids)


def test_one_chunk_and_keep_beyond_a_partial_chunk():
    """keep larger than the last chunk's tokens (its -inf tail never wins), one chunk."""
    gen = torch.Generator().manual_seed(next(_seeds))
    for vocab, block in [(257, 256), (100, 256)]:
        logits = _distinct_logits(4, vocab, torch.float32, gen)
        scores = torch.zeros(4, 1, device=DEVICE)
        buckets = [(1, 4, 8)]
        (ref_v, ref_i), _ = _reference(logits, scores, buckets, None)
        v, i = beam_topk(logits, scores, buckets, block=block)
        torch.testing.assert_close(v, ref_v, rtol=1e-6, atol=1e-5)
        assert torch.equal(i, ref_i)


def _sampler_batch(vocab: int, moves: bool, **extra) -> SamplingBatch:
    """Beam groups of 1 row (keep 8) and of 4 rows (keep 8), then a greedy row and two sampled
    ones (top-p, seeded; top-k)."""
    from seq2serve.runtime.config.sampling_params import SamplingParams
    from seq2serve.runtime.executor.beam_step import BeamMoves
    from seq2serve.runtime.scheduler.req import Req

    params = ([{"num_beams": 4, "max_new_tokens": 9}] * 9
              + [{"temperature": 0}, {"temperature": 0.8, "top_p": 0.9, "seed": 3},
                 {"temperature": 1.2, "top_k": 20}])
    reqs = [Req(rid=str(i), encoder_input_ids=[], decoder_input_ids=[0],
                sampling_params=SamplingParams.from_dict(p)) for i, p in enumerate(params)]
    buckets = [(1, 1, 8), (2, 4, 8)]
    scores = [0.0] + [-1.5, -2.0, -2.25, -3.0, -0.5, -0.75, -1.0, -4.0]
    if not moves:  # (the candidates alone)
        beams = SamplingBatch.beam_layout(scores, buckets, DEVICE)
    else:  # the device's rules: three groups entering slots 0-2 (the last at its length limit)
        rows = 9
        beam_moves = BeamMoves(
            table_rows=torch.arange(rows, device=DEVICE),
            shared_end=torch.zeros(rows, dtype=torch.int64, device=DEVICE),
            copy_len=torch.zeros(rows, dtype=torch.int64, device=DEVICE), copy_width=1)
        enter = ((4, [0, 1, 2], [0, 0, 0], [9, 9, 1], [False] * 3, [1.0] * 3,
                  [(), (1,), (1, 2)], [8, 8, 8]),)
        beams = SamplingBatch.beam_layout(scores, buckets, DEVICE, beam_moves, [0, 1, 2],
                                          (4, 4), enter)
    return SamplingBatch.from_reqs(reqs, vocab, eos_ids=(1,), device=DEVICE, beams=beams,
                                   **extra)


@pytest.mark.parametrize("moves", [False, True])
def test_sampler_fused_path_matches_todays(moves):
    """`Sampler._fused_beams` (the CUDA path) gives today's step output: the beam candidates,
    the device's beam choices, every row's next token (sampled rows: the same draws)."""
    from seq2serve.runtime.executor.sampler import Sampler, _plain_beams

    vocab = 1000
    gen = torch.Generator().manual_seed(next(_seeds))
    logits = _distinct_logits(12, vocab, torch.float32, gen)
    logits[:, 1] = 8.5  # the stop token best: groups past their first step skip it
    sb = _sampler_batch(vocab, moves)
    assert _plain_beams(sb)
    sampler = Sampler(suppressed=(3, 7), device=DEVICE)
    kept = logits.clone()
    want = sampler(logits, sb)
    got = sampler._fused_beams(logits, sb)
    assert torch.equal(logits, kept)  # the model's logits untouched
    torch.testing.assert_close(got.beam_values, want.beam_values, rtol=1e-6, atol=1e-5)
    assert torch.equal(got.beam_ids, want.beam_ids)
    assert torch.equal(got.next_token_ids, want.next_token_ids)
    if moves:
        assert torch.equal(got.beam_parents, want.beam_parents)
        torch.testing.assert_close(got.beam_running_scores, want.beam_running_scores,
                                   rtol=1e-6, atol=1e-5)
        assert torch.equal(got.beam_ints, want.beam_ints)
        torch.testing.assert_close(got.beam_floats, want.beam_floats, rtol=1e-6, atol=1e-5)
        assert got.beam_done.tolist() == want.beam_done.tolist() == [False, False, True]
        assert (got.beam_ints[1, 4:8] != 1).all()  # (the stop token: a hypothesis, not a beam)
    else:
        assert got.beam_parents is None and want.beam_parents is None


def test_fused_path_only_for_plain_beams():
    """Log-probs to return, or any per-row rule (here min_new_tokens' bans, a forced EOS):
    today's path."""
    from seq2serve.runtime.executor.sampler import _plain_beams

    sb = _sampler_batch(1000, False)
    sb.want_logprobs = True
    assert not _plain_beams(sb)
    assert not _plain_beams(_sampler_batch(1000, False, forced_eos=(1,), begin_suppressed=(5,)))
