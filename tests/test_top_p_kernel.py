"""The threshold kernel of the CUDA filter (runtime/kernels/triton_top_p.py) against the
sort-and-cumsum rules of token_filter.py's `_keep`, and the filter's CUDA path
(`threshold_filter`) against its sort path, output for output. Without a GPU the kernel runs
in Triton's interpreter (conftest.py), so vocabularies stay small but for one 128k case."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.executor.sampling_batch import SamplingBatch
from seq2serve.runtime.executor.token_filter import _keep, filter_probs, threshold_filter
from seq2serve.runtime.kernels.triton_top_p import top_p_threshold
from seq2serve.runtime.scheduler.req import Req

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
TOP_PS = [0.1, 0.5, 0.9, 0.99, 1.0]


def _probs(rows: int, vocab: int, scale: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, vocab, generator=g) * scale, -1)


def _sorted_keep(probs: torch.Tensor, top_ps: list[float], top_ks: list[int] | None = None,
                 min_ps: list[float] | None = None) -> torch.Tensor:
    """token_filter's `_keep` over a full sort, back in vocabulary order (P = 1: no rule)."""
    def col(values, dtype=torch.float32):
        return None if values is None else torch.tensor(values, dtype=dtype)[:, None]

    sorted_p, order = probs.sort(dim=-1, descending=True)
    rules = SimpleNamespace(top_ps=col([p if p < 1.0 else float("inf") for p in top_ps]),
                            top_ks=None if top_ks is None else torch.tensor(top_ks),
                            min_ps=col(min_ps))
    return torch.zeros_like(sorted_p, dtype=torch.bool).scatter(1, order, _keep(sorted_p, rules))


def _kernel_keep(probs: torch.Tensor, top_ps: list[float], top_ks: list[int] | None = None,
                 min_ps: list[float] | None = None) -> torch.Tensor:
    def dev(values, dtype=torch.float32):
        return None if values is None else torch.tensor(values, dtype=dtype, device=DEVICE)

    probs = probs.to(DEVICE)
    threshold = top_p_threshold(probs, dev(top_ps)[:, None], dev(top_ks, torch.int64),
                                dev(min_ps))
    return (probs >= threshold[:, None]).cpu()


@pytest.mark.parametrize("scale", [0.3, 10.0], ids=["near-uniform", "peaked"])
def test_kept_set_is_the_sort_rules(scale):
    """Each row of one batch its own top_p (1.0: no filter)."""
    probs = _probs(len(TOP_PS), 4000, scale, seed=int(scale * 10))
    keep = _kernel_keep(probs, TOP_PS)
    assert torch.equal(keep, _sorted_keep(probs, TOP_PS))
    assert keep[-1].all()
    if scale < 1.0:  # the flat rows keep most of the vocabulary at 0.9
        assert keep[2].sum() > 2000 and keep[0].sum() > 100


def test_one_token_over_p_is_all_that_survives():
    probs = _probs(3, 1000, 0.5, seed=3) * 0.05
    probs[:, 17] += 0.95  # rows still sum to 1
    keep = _kernel_keep(probs, [0.9, 0.5, 0.96])
    assert keep[:2].sum(-1).tolist() == [1, 1] and keep[:2, 17].all()
    assert keep[2].sum() > 1  # 0.95 < 0.96: more than the one
    assert torch.equal(keep, _sorted_keep(probs, [0.9, 0.5, 0.96]))


def test_top_k_and_min_p_rules_in_the_same_search():
    probs = _probs(6, 3000, 1.0, seed=5)
    top_ps = [0.9, 1.0, 1.0, 0.5, 0.99, 1.0]
    top_ks = [3000, 40, 3000, 1000, 5, 3000]
    min_ps = [0.0, 0.0, 0.3, 0.05, 0.0, 0.0]  # the last row: no rule at all
    keep = _kernel_keep(probs, top_ps, top_ks, min_ps)
    assert torch.equal(keep, _sorted_keep(probs, top_ps, top_ks, min_ps))
    assert keep[1].sum() == 40 and keep[4].sum() == 5 and keep[5].all()


def test_tied_tokens_survive_together():
    """Exact ties: a token is kept iff the mass (count) strictly above it is < P (< k)."""
    values = torch.tensor([8.0, 5.0, 5.0, 5.0, 3.0, 3.0, 2.0, 1.0, 1.0, 1.0])
    probs = (values / values.sum()).repeat(4, 1)
    top_ps, top_ks = [0.3, 0.5, 1.0, 0.8], [10, 10, 3, 10]
    above = probs[:, None, :] > probs[:, :, None]  # [row, token, other]
    mass = (above * probs[:, None, :]).sum(-1)
    expected = (mass < torch.tensor(top_ps)[:, None]) & \
        (above.sum(-1) < torch.tensor(top_ks)[:, None])
    keep = _kernel_keep(probs, top_ps, top_ks)
    assert torch.equal(keep, expected)
    assert keep.sum(-1).tolist() == [4, 4, 4, 6]  # rows 0-2: all three 5s


def test_llama_vocabulary():
    probs = _probs(2, 128256, 1.0, seed=7)
    assert torch.equal(_kernel_keep(probs, [0.9, 0.5]), _sorted_keep(probs, [0.9, 0.5]))


def _at_the_edge(probs: torch.Tensor, params: list[dict], tol: float = 1e-5) -> torch.Tensor:
    """Tokens whose mass strictly above (in float64) is within `tol` of their row's top_p."""
    sorted_p, order = probs.double().sort(dim=-1, descending=True)
    before = torch.zeros_like(sorted_p).scatter(1, order, sorted_p.cumsum(-1) - sorted_p)
    top_ps = torch.tensor([p.get("top_p", 2.0) for p in params], dtype=torch.float64)
    return (before - top_ps[:, None]).abs() < tol


def _batch(params: list[dict], vocab: int, device: str) -> SamplingBatch:
    reqs = [Req(rid=str(i), encoder_input_ids=[], decoder_input_ids=[0],
                sampling_params=SamplingParams.from_dict({"temperature": 1.0, **p}))
            for i, p in enumerate(params)]
    return SamplingBatch.from_reqs(reqs, vocab, eos_ids=(1,), device=device)


PARAMS = [
    [{"top_p": 0.9}, {"top_p": 0.5}, {}, {"temperature": 0, "top_p": 0.3}, {"top_p": 0.99}],
    [{"top_p": 0.9, "min_p": 0.02}, {"min_p": 0.1}, {}, {"top_p": 0.7}],
    [{"top_k": 50}, {"top_p": 0.8}, {"top_k": 500, "top_p": 0.95, "min_p": 0.01}, {}],
]


@pytest.mark.parametrize("params", PARAMS, ids=["top_p", "top_p+min_p", "with top_k"])
def test_threshold_path_equals_the_sort_path(params):
    """Rows without a rule (a plain and a greedy one) come back as they were."""
    vocab = 3000
    sb = _batch(params, vocab, DEVICE)
    assert sb.filter_width is None  # CUDA takes the threshold path
    probs = _probs(len(params), vocab, 2.0, seed=len(params))
    out = threshold_filter(probs.to(DEVICE), sb).cpu()
    sorted_out = filter_probs(probs, _batch(params, vocab, "cpu"))  # the CPU's sort path
    # the two paths sum the mass above a token in other orders (the kernel by blocks, the
    # sort path by a cumsum, on two devices): only a token whose mass above lies within
    # float32 rounding of its row's top_p may go either way
    differ = (out > 0) != (sorted_out > 0)
    assert not (differ & ~_at_the_edge(probs, params)).any(), differ.nonzero().tolist()
    same = ~differ
    assert torch.equal(out[same], sorted_out[same])
    ruleless = [i for i, p in enumerate(params) if not p or p.get("temperature") == 0]
    assert torch.equal(out[ruleless], probs[ruleless])
    assert ((out == 0).sum(-1) > 0).tolist() == [i not in ruleless for i in range(len(params))]


@pytest.mark.gpu
def test_every_check_on_the_gpu():
    """The gate's run (`-m gpu`) of this file's checks on CUDA."""
    if DEVICE != "cuda":
        pytest.skip("needs CUDA (the CPU suite runs the checks above in the interpreter)")
    for scale in (0.3, 10.0):
        test_kept_set_is_the_sort_rules(scale)
    test_one_token_over_p_is_all_that_survives()
    test_top_k_and_min_p_rules_in_the_same_search()
    test_tied_tokens_survive_together()
    test_llama_vocabulary()
    for params in PARAMS:
        test_threshold_path_equals_the_sort_path(params)
