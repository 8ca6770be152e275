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
