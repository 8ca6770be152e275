"""The CPU's beam candidates from each row's own top-k (runtime/executor/beam_topk_torch.py)
against the torch chain HF's beam search is: `_beam_candidates` on log_softmax(logits.float())
+ the rows' scores, suppressed tokens at -inf after the softmax. Buckets as the scheduler lays
them out; ties broken as the CUDA kernel breaks them (lower id first)."""

from __future__ import annotations

import pytest
import torch

from seq2serve.runtime.executor.beam_topk_torch import row_topk_beams
from seq2serve.runtime.executor.sampler import _beam_candidates
from seq2serve.runtime.executor.sampling_batch import SamplingBatch
from seq2serve.tests.beam_oracle import lower_id_first

BUCKETS = [(2, 1, 8), (2, 4, 8), (1, 5, 10)]  # (groups, rows per group, keep)


def _reference(logits, scores, buckets, suppressed):
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    if suppressed is not None:
        logprobs[:, suppressed] = float("-inf")
    return _beam_candidates(logprobs, _beam_batch(scores, buckets)), logprobs + scores


def _beam_batch(scores, buckets) -> SamplingBatch:
    """A batch of beam rows only, greedy, no per-row rule."""
    fields = dict(temperatures=None, greedy=None, all_greedy=True, top_ks=None, top_ps=None,
                  min_ps=None, keys=None, penalty_ids=None, output_counts_ids=None,
                  repetition=None, frequency=None, presence=None, banned_rows=None,
                  banned_cols=None, forced_rows=None, forced_ids=None, want_logprobs=False,
                  top_logprobs_num=0)
    return SamplingBatch(**fields, **SamplingBatch.beam_layout(scores, buckets, "cpu"))


@pytest.mark.parametrize("dtype,vocab,suppress", [
    (torch.float32, 5003, True), (torch.float32, 97, False), (torch.bfloat16, 1000, True)])
def test_against_the_log_softmax_chain(dtype, vocab, suppress):
    gen = torch.Generator().manual_seed(vocab)
    rows = sum(g * r for g, r, _ in BUCKETS)
    logits = torch.randn(rows, vocab, generator=gen)
    if dtype == torch.bfloat16:  # bf16 has too few values: each row 16 distinct leaders
        logits = logits.clamp(-4, 3.9)
        for r in range(rows):
            top = torch.randperm(vocab, generator=gen)[:16]
            logits[r, top] = 4 + torch.randperm(128, generator=gen)[:16].float() / 32
    logits = logits.to(dtype)
    scores = -10 * torch.rand(rows, 1, generator=gen)
    suppressed = None
    if suppress:  # each of the first rows' best token among them: the candidates skip it
        best = logits[:3].float().argmax(-1).tolist()
        suppressed = torch.tensor(sorted({*best, 0, vocab - 1}))
    (ref_v, ref_i), ref_all = _reference(logits, scores, BUCKETS, suppressed)
    v, i, best = row_topk_beams(logits, scores, BUCKETS, suppressed)
    assert v.dtype == torch.float32 and i.dtype == torch.int64
    torch.testing.assert_close(v, ref_v, rtol=1e-6, atol=1e-5)
    assert torch.equal(i, ref_i)
    assert torch.equal(best, ref_all.argmax(-1))


def test_exact_ties_lower_id_first():
    vocab = 600
    gen = torch.Generator().manual_seed(1)
    logits = torch.randint(-3, 3, (5, vocab), generator=gen).float()  # many ties
    logits[3] = logits[2]  # rows 2 and 3 of one group, identical, equal scores
    scores = torch.zeros(5, 1)
    buckets = [(1, 1, 6), (1, 4, 12)]
    v, i, best = row_topk_beams(logits, scores, buckets)
    logprobs = torch.log_softmax(logits, -1) + scores
    assert torch.equal(best, logprobs.argmax(-1))  # the first of equal maxima
    cand = 0
    for ids, values in lower_id_first(logprobs, buckets):
        assert i[cand:cand + len(ids)].tolist() == ids
        torch.testing.assert_close(v[cand:cand + len(ids)], torch.tensor(values))
        cand += len(ids)


def test_keep_over_the_vocabulary_and_every_token_but_one_suppressed():
    """A vocabulary smaller than a row's top-k, and suppression of all but one token: the
    -inf tail never outranks a finite candidate."""
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(2))
    scores = torch.zeros(4, 1)
    v, i, _ = row_topk_beams(logits, scores, [(1, 4, 8)], torch.tensor([0, 1, 2, 3, 4]))
    assert torch.isfinite(v[:4]).all() and not torch.isfinite(v[4:]).any()
    assert sorted(x % 6 for x in i[:4].tolist()) == [5, 5, 5, 5]


def test_the_blocked_row_top_k_and_its_ties_on_a_long_vocabulary():
    """Vocabularies long enough for `_row_top`'s blocks (a whole number of blocks and not):
    the same candidates as the log-softmax chain; with many exactly equal logits, the
    lower id first, as on a short vocabulary."""
    from seq2serve.runtime.executor.beam_topk_torch import BLOCK

    for vocab in (64 * BLOCK, 64 * BLOCK + 37):
        gen = torch.Generator().manual_seed(vocab)
        rows = sum(g * r for g, r, _ in BUCKETS)
        logits = 3 * torch.randn(rows, vocab, generator=gen)
        scores = -10 * torch.rand(rows, 1, generator=gen)
        (ref_v, ref_i), _ = _reference(logits, scores, BUCKETS, torch.tensor([5, vocab - 1]))
        v, i, _ = row_topk_beams(logits, scores, BUCKETS, torch.tensor([5, vocab - 1]))
        torch.testing.assert_close(v, ref_v, rtol=1e-6, atol=1e-5)
        assert torch.equal(i, ref_i)
        ties = torch.randint(-3, 3, (5, vocab), generator=gen).float()
        buckets = [(1, 1, 6), (1, 4, 12)]
        v, i, best = row_topk_beams(ties, torch.zeros(5, 1), buckets)
        logprobs = torch.log_softmax(ties, -1)
        assert torch.equal(best, logprobs.argmax(-1))
        assert i[6:].tolist() == lower_id_first(logprobs, buckets)[1][0]


def test_the_cpu_sampler_takes_this_path_without_triton(monkeypatch):
    """A CPU install may lack Triton (a dev dependency): the sampler's beam step on the CPU
    must neither import it nor differ from `row_topk_beams`."""
    import sys

    from seq2serve.runtime.executor.sampler import Sampler

    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises
    monkeypatch.setitem(sys.modules, "seq2serve.runtime.kernels.triton_beam_topk", None)
    gen = torch.Generator().manual_seed(3)
    rows = sum(g * r for g, r, _ in BUCKETS)
    logits = torch.randn(rows, 700, generator=gen)
    scores = -10 * torch.rand(rows, 1, generator=gen)
    _, ref_all = _reference(logits, scores, BUCKETS, None)
    sb = _beam_batch(scores, BUCKETS)
    out = Sampler((7,))(logits, sb)
    v, i, best = row_topk_beams(logits, scores, BUCKETS, torch.tensor([7]))
    assert torch.equal(out.beam_values, v) and torch.equal(out.beam_ids, i)
    assert torch.equal(out.next_token_ids, best)
