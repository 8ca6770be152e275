"""A weight whose row count is not a multiple of 8 (an LM head over an odd vocabulary) in a
zero-padded buffer (models/padded_rows.py): the same values and parameter (a tied embedding
sees them), and `TritonOps.linear` on it equal to the plain GEMM, sliced back and contiguous.
No GPU: the cuBLAS path of TritonOps runs on the CPU's torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seq2serve.models.linear import Linear
from seq2serve.models.ops import TritonOps
from seq2serve.models.padded_rows import ROWS, needs_padding, pad_rows, padded


def test_pad_rows_keeps_the_parameter_its_values_and_a_tied_embedding():
    torch.manual_seed(0)
    embed = nn.Embedding(101, 24)
    head = Linear(24, 101)
    head.weight = embed.weight  # tied, as Marian's
    before = embed.weight.detach().clone()
    param = head.weight
    assert needs_padding(param) and padded(param) is None
    pad_rows(param)
    assert head.weight is param and embed.weight is param and param.shape == (101, 24)
    assert torch.equal(param, before)
    whole = padded(param)
    assert whole.shape == (128, 24) and torch.equal(whole[:101], before)
    assert not whole[101:].any()
    ids = torch.tensor([0, 7, 100])
    assert torch.equal(embed(ids), before[ids])


def test_linear_on_a_padded_weight_equals_the_plain_gemm():
    torch.manual_seed(1)
    ops = TritonOps(gemv_max_m=0, skinny_max_m=0)  # (every row count to the cuBLAS path)
    for n in (101, 58, 8 * ROWS + 3):
        w = nn.Parameter(torch.randn(n, 32), requires_grad=False)
        want = F.linear(x := torch.randn(5, 32), w)
        bias = torch.randn(n)
        pad_rows(w)
        got = ops.linear(x, w)
        assert got.shape == (5, n) and got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ops.linear(x, w, bias), want + bias, rtol=1e-5, atol=1e-5)
        three = ops.linear(x.view(5, 1, 32), w)  # (leading dims kept)
        torch.testing.assert_close(three, want.view(5, 1, n), rtol=1e-5, atol=1e-5)


def test_warm_pads_only_cuda_weights():
    """On the CPU `warm` leaves an odd head as it is (its GEMM has no alignment to gain)."""
    head = Linear(16, 101)
    nn.init.normal_(head.weight)
    ops = TritonOps(gemv_blocks=(8, 16))
    head.ops = ops
    ops.warm(head)
    assert padded(head.weight) is None


def test_logits_of_a_padded_head_are_a_view_with_the_bias_in_the_product():
    """`TritonOps.logits` on a padded head: the padded product's first columns as a strided
    view (no copy), the bias added in the product; equal to HF's head plus bias. Small row
    counts (the GEMV's) and unpadded heads take `linear` plus the bias as before."""
    torch.manual_seed(2)
    ops = TritonOps(gemv_max_m=0, skinny_max_m=0)
    for n in (101, 8 * ROWS + 3):
        w = nn.Parameter(torch.randn(n, 32), requires_grad=False)
        x, bias = torch.randn(6, 32), torch.randn(n)
        want = F.linear(x, w) + bias
        pad_rows(w)
        got = ops.logits(x, w, bias)
        assert got.shape == (6, n) and got.stride() == (padded(w).shape[0], 1)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert ops.logits(x, w, bias).data_ptr() != got.data_ptr()  # (a fresh output)
        plain = ops.logits(x, w)
        assert plain.stride() == (padded(w).shape[0], 1)
        torch.testing.assert_close(plain, F.linear(x, w), rtol=1e-5, atol=1e-5)
    aligned = nn.Parameter(torch.randn(64, 32), requires_grad=False)
    x, bias = torch.randn(6, 32), torch.randn(64)
    out = ops.logits(x, aligned, bias)
    assert out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, aligned) + bias, rtol=1e-5, atol=1e-5)
