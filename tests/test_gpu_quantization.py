"""8-bit weights on the GPU (marked `gpu`, run by scripts/gpu_check.py): every kernel path a
quantized Linear takes through TritonOps in bf16 (the GEMV at 1 row, its norm and gated
fusions, the skinny GEMM at 2-16 rows, `torch._scaled_mm` with per-token FP8 activations or the
dequantized weight above) against the float product of the same dequantized weight, at the
sizes of real models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2serve.models.quantized_weight import QuantizedWeight

pytestmark = pytest.mark.gpu

ROWS = [1, 2, 7, 16, 17, 64, 200]
SHAPES = [(1024, 1024), (2816, 1024), (1024, 2816), (4096, 1024)]  # (N, K), mT5-large's


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref).norm() / ref.norm()).item()


def _bound(method: str, rows: int) -> float:
    # int8: weight-only, bf16 output rounding; fp8 above 16 rows: activations in E4M3 too
    return 0.06 if method == "fp8" and rows > 16 else 0.01


@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("n, k", SHAPES)
def test_quantized_linear_paths_in_bf16(method, n, k):
    from seq2serve.models.ops import TritonOps

    ops = TritonOps()
    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16) * k**-0.5
    qw = QuantizedWeight.from_float(w, method)
    deq = qw.dequantize().float()
    for rows in ROWS:
        x = torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16)
        b = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
        ref = F.linear(x.float(), deq, b.float())
        got = ops.linear(x, qw, b)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
        assert _rel(got, ref) < _bound(method, rows), (method, n, k, rows)
        norm_w = (torch.rand(k, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
        res = torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16)
        out, _ = ops.norm_linear(x, norm_w, 1e-6, qw, None, res)
        normed = ops.rms_norm(x + res, norm_w, 1e-6)
        assert _rel(out, F.linear(normed.float(), deq)) < _bound(method, rows), rows
        gate_up = torch.randn(rows, 2 * k, device="cuda", generator=g).to(torch.bfloat16)
        act = (F.silu(gate_up[:, :k].float()) * gate_up[:, k:].float())
        got = ops.gated_linear(gate_up, "silu", qw)
        assert _rel(got, F.linear(act, deq)) < _bound(method, rows) + 0.01, rows


@pytest.mark.parametrize("n", [1024, 2816, 5120, 14336])  # mT5-large, Flan-T5-XL, Mllama
def test_per_token_fp8_quantization_kernel_in_bf16(n):
    """The fused quantization kernel compiled: the same E4M3 values and scales as eager
    `quantize_tokens` (every value: the GPU's cast rounds to nearest even, as torch's), the
    norm and gated fusions the same as the unfused kernels then `quantize`."""
    from seq2serve.models.ops import TritonOps
    from seq2serve.runtime.kernels.fp8_gemm import quantize_tokens
    from seq2serve.runtime.kernels.triton_fp8_quant import (
        gated_quantize,
        norm_quantize,
        quantize,
    )

    ops = TritonOps()
    g = torch.Generator(device="cuda").manual_seed(n)
    x, res = (torch.randn(200, n, device="cuda", generator=g).to(torch.bfloat16) * 3
              for _ in range(2))
    x[0, 7] = 3000.0  # an outlier channel (T5)
    norm_w = (torch.rand(n, device="cuda", generator=g) + 0.5).to(torch.bfloat16)

    def same(got, ref, exact=True):
        if exact:
            assert torch.equal(got[1], ref[1])
            assert torch.equal(got[0].view(torch.uint8), ref[0].view(torch.uint8))
            return
        # fused: the norm's sum may reduce in another order than the norm kernel's, so
        # a rare value may round one E4M3 step the other way
        torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=0)
        a, b = got[0].float() * got[1], ref[0].float() * ref[1]
        assert ((a - b).abs() <= b.abs() * 2**-3 + ref[1] * 2**-9).all()
        assert (a != b).float().mean() < 1e-3

    same(quantize(x), quantize_tokens(x))
    got, summed = norm_quantize(x, norm_w, 1e-6, res)
    normed, ref_summed = ops.rms_norm(x, norm_w, 1e-6, res)
    assert torch.equal(summed, ref_summed)
    same(got, quantize(normed), exact=False)
    gate_up = torch.cat([x, res], dim=1)
    same(gated_quantize(gate_up, "gelu_new"), quantize(ops.gated(gate_up, "gelu_new")),
         exact=False)
