"""The two-level exponential race and the prefix top-k / top-p / min-p filter, at vocabularies
past a block and past the filter's prefix: the distribution, seeded reproducibility in any
batch, and the filter against a full-sort torch reference."""

from __future__ import annotations

import pytest
import torch

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.executor.sampler import Sampler
from seq2serve.runtime.executor.sampling_batch import SamplingBatch
from seq2serve.runtime.executor.seeded_race import block_size, exponential_noise, race, row_key
from seq2serve.runtime.executor.token_filter import filter_probs
from seq2serve.runtime.scheduler.req import Req

LLAMA_VOCAB = 128256


def _batch(params: list[dict], vocab: int, steps: list[int] | None = None) -> SamplingBatch:
    reqs = []
    for i, p in enumerate(params):
        r = Req(rid=str(i), encoder_input_ids=[], decoder_input_ids=[0],
                sampling_params=SamplingParams.from_dict(p))
        r.output_ids = [0] * (steps[i] if steps else 0)
        reqs.append(r)
    return SamplingBatch.from_reqs(reqs, vocab, eos_ids=(1,), device="cpu")


def test_race_samples_the_weights_across_blocks_and_the_short_last_block():
    vocab, n = 1000, 4000  # blocks of 32: 31 full ones and one of 8
    assert block_size(vocab) == 32
    tokens = torch.tensor([3, 40, 41, 517, 998])  # the first, one twice, a middle, the last
    p = torch.tensor([0.1, 0.25, 0.15, 0.2, 0.3])
    weights = torch.zeros(n, vocab)
    weights[:, tokens] = p * 7.0  # unnormalized weights are fine
    keys = torch.tensor([row_key(seed, 0) for seed in range(n)])
    freq = torch.bincount(race(weights, keys), minlength=vocab).float() / n
    assert freq.sum() == pytest.approx(1.0) and freq[tokens].sum() == pytest.approx(1.0)
    # within ~4 standard deviations of each probability
    assert torch.all((freq[tokens] - p).abs() < 4 * torch.sqrt(p * (1 - p) / n)), freq[tokens]


def test_noise_is_a_function_of_key_and_index_only():
    keys = torch.tensor([5, 77, 1 << 31])
    a = exponential_noise(keys, 64)
    assert torch.equal(exponential_noise(keys[[2, 0]], 16), a[[2, 0], :16])
    assert (a > 0).all() and torch.isfinite(a).all()
    assert row_key(7, 3) == row_key(7, 3) != row_key(7, 4) != row_key(8, 3)
    assert row_key(1 << 40, 0) != row_key(0, 0)  # a seed's high bits count


def test_seeded_rows_draw_the_same_tokens_in_any_batch_at_128k():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, LLAMA_VOCAB, generator=g) * 2
    seeded = [{"temperature": 0.8, "seed": 11}, {"temperature": 1.3, "seed": 12, "top_k": 40},
              {"temperature": 0.7, "seed": 13, "top_p": 0.5}]
    others = [{"temperature": 0}, {"temperature": 1.0}, {"temperature": 0.9, "min_p": 0.2}]
    sampler = Sampler()
    together = sampler(logits, _batch(seeded + others, LLAMA_VOCAB, [3] * 6)).next_token_ids
    for i, params in enumerate(seeded):  # alone, and behind a different neighbour
        alone = sampler(logits[i:i + 1], _batch([params], LLAMA_VOCAB, [3]))
        mixed = sampler(logits[[4, i]], _batch([others[1], params], LLAMA_VOCAB, [3, 3]))
        assert alone.next_token_ids[0] == together[i] == mixed.next_token_ids[1]
    later = sampler(logits[:1], _batch(seeded[:1], LLAMA_VOCAB, [4] * 1)).next_token_ids
    draws = {int(sampler(logits[:1], _batch([{"temperature": 5.0, "seed": 11}],
                                             LLAMA_VOCAB, [s])).next_token_ids)
             for s in range(8)}
    assert len(draws) > 1 and later.shape == (1,)  # the step moves the stream on
    assert together[3] == logits[3].argmax()  # the greedy row


def _reference(probs: torch.Tensor, params: list[dict]) -> torch.Tensor:
    """Each row on its own: sort all, keep HF's rules' prefix (no rule: the row as it is)."""
    out = probs.clone()
    for i, p in enumerate(params):
        if not {"top_k", "top_p", "min_p"} & p.keys():
            continue
        sp, order = probs[i].sort(descending=True)
        keep = torch.ones_like(sp, dtype=torch.bool)
        keep &= torch.arange(sp.numel()) < p.get("top_k", sp.numel())
        keep &= (sp.cumsum(0) - sp) < p.get("top_p", 1.0)
        keep &= sp >= p.get("min_p", 0.0) * sp[0]
        keep[0] = True
        out[i] = torch.zeros_like(sp).scatter(0, order, sp * keep)
    return out


@pytest.mark.parametrize("sharpness", [8.0, 0.5], ids=["peaked (prefix)", "flat (full sort)"])
def test_filter_matches_a_full_sort_reference(sharpness):
    vocab = 5000  # past the 1024-token prefix
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(7, vocab, generator=g) * sharpness, -1)
    params = [{"top_k": 30}, {"top_p": 0.9}, {"min_p": 0.05}, {"top_k": 2000, "top_p": 0.95},
              {}, {"top_p": 0.6, "min_p": 0.01}, {"top_k": 2}]
    sb = _batch([{"temperature": 1.0, **p} for p in params], vocab)
    assert sb.filter_width is None  # some filtering rows have no top_k
    torch.testing.assert_close(filter_probs(probs, sb), _reference(probs, params),
                               rtol=0, atol=0)
    top_k_only = [{"top_k": 30}, {}, {"top_k": 7}]
    sb = _batch([{"temperature": 1.0, **p} for p in top_k_only], vocab)
    assert sb.filter_width == 30
    torch.testing.assert_close(filter_probs(probs[:3], sb), _reference(probs[:3], top_k_only),
                               rtol=0, atol=0)
