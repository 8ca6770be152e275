"""The rows of cuBLAS's GEMMs in an eager forward padded to a few counts (models/ops.py's
`TritonOps._bucketed`, models/row_buckets.py): on by default on CUDA only, forced on here on
the CPU. Every product equals the unpadded one (F.linear, the oracle): plain, with a bias, an
odd output count (a padded weight) and the LM head's logits with BART's bias; the padding
really ran (the GEMM saw a bucket's rows); row counts that are a bucket's, the small-row
kernels' and 3-D inputs are left alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2serve.models import ops as ops_module
from seq2serve.models.ops import TritonOps
from seq2serve.models.row_buckets import bucket_rows

ROWS = [17, 100, 200, 513, 1000]


@pytest.fixture
def seen(monkeypatch):
    """The row counts F.linear is called with inside models/ops.py."""
    rows = []
    real = F.linear

    def linear(x, w, b=None):
        rows.append(x.shape[0])
        return real(x, w, b)

    monkeypatch.setattr(ops_module.F, "linear", linear)
    yield rows
    monkeypatch.setattr(ops_module.F, "linear", real)


def _ops(pad: bool) -> TritonOps:
    ops = TritonOps(gemv_blocks=(16, 16))
    ops.pad_rows = pad
    return ops


@pytest.mark.parametrize("n", [96, 61])  # (61: an odd output count, its weight padded)
def test_padded_products_equal_the_unpadded(seen, n):
    g = torch.Generator().manual_seed(n)
    w, b = torch.randn(n, 48, generator=g), torch.randn(n, generator=g)
    ops = _ops(True)
    for m in ROWS:
        x = torch.randn(m, 48, generator=g)
        for bias in (None, b):
            want = F.linear(x, w, bias)  # (F.linear is patched for the whole process: the
            seen.clear()  # oracle's own call forgotten)
            got = ops.linear(x, w, bias)
            assert got.shape == (m, n)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            assert seen and all(r == bucket_rows(m) for r in seen), (m, seen)
            assert bucket_rows(m) > m or m == bucket_rows(m)


def test_logits_padded_equal_the_unpadded(seen):
    g = torch.Generator().manual_seed(0)
    w, bias = torch.randn(501, 32, generator=g), torch.randn(501, generator=g)  # (odd vocab)
    ops = _ops(True)
    for m in ROWS:
        x = torch.randn(m, 32, generator=g)
        want = F.linear(x, w) + bias
        seen.clear()
        got = ops.logits(x, w, bias)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert set(seen) == {bucket_rows(m)}


def test_what_is_left_alone(seen):
    w = torch.randn(64, 32)
    ops = _ops(True)
    ops.linear(torch.randn(128, 32), w)  # a bucket's count already
    ops.linear(torch.randn(3, 5, 32), w)  # 3-D
    assert seen == [128, 3]
    seen.clear()
    _ops(None).linear(torch.randn(100, 32), w)  # default: on CUDA only
    _ops(False).linear(torch.randn(100, 32), w)
    assert seen == [100, 100]


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (CPU)")
@pytest.mark.parametrize("family", ["llama", "marian"])
def test_a_model_with_padded_rows_decodes_as_the_reference(tmp_path, family):
    """Prompts of 21-40 tokens (a prefill and an encoder pass of more rows than the small-row
    kernels take: cuBLAS, padded) through the Triton ops with the padding forced, against the
    PyTorch reference ops, token for token."""
    from seq2serve.runtime.config.model_config import ModelConfig
    from seq2serve.tests.test_ops import _greedy

    long = list(range(20, 40))
    if family == "marian":
        from seq2serve.tests.bart_checkpoints import write_bart_checkpoint

        path = str(write_bart_checkpoint("marian", tmp_path / "marian"))
        pad = ModelConfig.from_path(path).arch.pad_token_id
        prompts = [(long + [0], [pad]), (long[:12] + [0], [pad, 4])]
    else:
        from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

        path = str(write_llama_checkpoint(tmp_path / "llama", init_scale=10.0, seed=1))
        prompts = [([], [1, *long]), ([], [1, *long[:20]])]
    ops = TritonOps(gemv_blocks=(1024, 64))
    ops.pad_rows = True
    padded = []
    bucketed = ops._bucketed
    ops._bucketed = lambda x: padded.append(x.shape[0]) or bucketed(x)
    assert _greedy(path, ops, prompts) == _greedy(path, None, prompts)
    assert any(bucket_rows(m) > m for m in padded)  # (some products were padded)
