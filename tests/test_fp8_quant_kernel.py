"""The one-kernel per-token FP8 quantization (runtime/kernels/triton_fp8_quant.py) against the
PyTorch reference it replaces: `quantize_tokens` (the same E4M3 values), and the float norm or
gated activation before it (within E4M3's rounding). Interpreted on the CPU;
tests/test_gpu_quantization.py runs it compiled."""

from __future__ import annotations

import pytest
import torch

from seq2serve.models.ops import TorchOps, TritonOps
from seq2serve.models.quantized_weight import QuantizedWeight
from seq2serve.runtime.kernels.fp8_gemm import quantize_tokens
from seq2serve.runtime.kernels.triton_fp8_quant import gated_quantize, norm_quantize, quantize

REF = TorchOps()
DTYPES = [torch.float32, torch.bfloat16]


def _inputs(rows: int, n: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * 3
    x[0, n // 2] = 500.0  # an outlier channel, as T5's activations have: its row's scale
    return [x.to(dtype), torch.randn(rows, n, generator=g).to(dtype),
            (torch.rand(n, generator=g) + 0.5).to(dtype)]


def _interpreter_cast(got: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Where TRITON_INTERPRET's float32 -> E4M3 cast of `exact` differs from a correct one
    (`ref`; triton 3.x's interpreter, not the GPU's `cvt.rn.satfinite`): it drops the carry
    when rounding up crosses a power of two (1.95 becomes 1.0, not 2.0), rounds ties away from
    zero instead of to even, and rounds subnormals (up to 2^-6) by a step of 2^-9 either way.
    All False for values computed on a GPU."""
    if got.device.type != "cpu":
        return torch.zeros_like(got, dtype=torch.bool)
    mantissa, _ = torch.frexp(ref)
    return (((mantissa.abs() == 0.5) & (got == ref / 2))
            | ((exact - ref).abs() == (exact - got).abs())
            | ((ref.abs() <= 2**-6) & ((got - ref).abs() <= 2**-9)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, n", [(1, 16), (5, 1000), (3, 2816)])
def test_quantize_is_quantize_tokens(rows, n, dtype):
    x, _, _ = _inputs(rows, n, dtype, n)
    (xq, scale), (ref_q, ref_scale) = quantize(x), quantize_tokens(x)
    assert xq.dtype == torch.float8_e4m3fn and scale.shape == (rows, 1)
    torch.testing.assert_close(scale, ref_scale, rtol=0, atol=0)
    got, ref = xq.float(), ref_q.float()
    differ = got != ref
    assert _interpreter_cast(got, ref, x.float() / scale)[differ].all()
    assert differ.float().mean() < 0.05


def _within_e4m3(quantized: tuple[torch.Tensor, torch.Tensor], ref: torch.Tensor) -> None:
    """xq * scale against the float reference: the row's scale is max|ref| / 448 (to the
    reference's own rounding in its dtype), each value within one E4M3 step (half a step of
    rounding, plus a value the reference's dtype rounds across a rounding boundary)."""
    xq, scale = quantized
    ref = ref.float()
    torch.testing.assert_close(scale[:, 0], ref.abs().amax(1) / 448, rtol=2**-7, atol=0)
    q_ref = ref / scale
    err = (xq.float() - q_ref).abs()
    step = torch.maximum(q_ref.abs() * 2**-3, torch.full_like(q_ref, 2**-9))
    bad = err > step
    exact_ref = quantize_tokens(ref)[0].float()  # where the interpreter's cast is the cause
    assert (_interpreter_cast(xq.float(), exact_ref, q_ref) | ~bad).all(), err[bad][:5]


# (float32 only here: the interpreter truncates float32 -> bf16 casts, the residual sum's and
# the norm's, where a GPU rounds; tests/test_gpu_quantization.py runs these in bf16 compiled)
@pytest.mark.parametrize("dtype", [torch.float32])
@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_quantize_is_the_norm_within_e4m3_rounding(dtype, with_residual):
    x, res, w = _inputs(4, 1024, dtype, 7)
    got, summed = norm_quantize(x, w, 1e-6, res if with_residual else None)
    if with_residual:
        torch.testing.assert_close(summed, x + res, rtol=0, atol=0)
        _within_e4m3(got, REF.rms_norm(x + res, w, 1e-6))
    else:
        assert summed is None
        _within_e4m3(got, REF.rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32])
@pytest.mark.parametrize("act", ["gelu_new", "silu"])
def test_gated_quantize_is_the_activation_within_e4m3_rounding(dtype, act):
    gate_up, _, _ = _inputs(3, 2 * 1000, dtype, 11)
    _within_e4m3(gated_quantize(gate_up, act), REF.gated(gate_up, act))


def test_triton_ops_fp8_products_of_many_rows_are_the_fused_kernels():
    """Past the skinny GEMM's 16 rows TritonOps quantizes with the fused kernel and calls
    `torch._scaled_mm` (on the CPU too): the products of the unfused path (the norm or
    activation kernel, then `quantize`), and the residual stream exactly. (Against eager
    PyTorch the interpreter's E4M3 cast, above, would be the difference.)"""
    from seq2serve.runtime.kernels.fp8_gemm import scaled_product

    ops = TritonOps(gemv_blocks=(8, 64))
    x, res, w = _inputs(20, 64, torch.float32, 3)
    g = torch.Generator().manual_seed(5)
    qw = QuantizedWeight.from_float(torch.randn(32, 64, generator=g), "fp8")
    bias = torch.randn(32, generator=g)

    def unfused(rows: torch.Tensor, b=None) -> torch.Tensor:
        return scaled_product(*quantize(rows), qw.qweight, qw.scale, b, rows.dtype)

    close = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(ops.linear(x, qw, bias), unfused(x, bias), **close)
    out, summed = ops.norm_linear(x, w, 1e-6, qw, None, res)
    torch.testing.assert_close(summed, x + res, rtol=0, atol=0)
    torch.testing.assert_close(out, unfused(ops.rms_norm(x + res, w, 1e-6)), **close)
    out, same_x = ops.norm_linear(x, w, 1e-6, qw)
    assert same_x is x
    torch.testing.assert_close(out, unfused(ops.rms_norm(x, w, 1e-6)), **close)
    gate_up = torch.cat([x, res], dim=-1)
    torch.testing.assert_close(ops.gated_linear(gate_up, "silu", qw),
                               unfused(ops.gated(gate_up, "silu")), **close)
    assert ops.linear(x.view(4, 5, 64), qw).shape == (4, 5, 32)  # any leading shape
    # and the eager reference's product, to FP8's error
    ref = torch.nn.functional.linear(x, qw.dequantize().float(), bias)
    assert ((ops.linear(x, qw, bias) - ref).norm() / ref.norm()).item() < 0.1
