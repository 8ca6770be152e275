"""One RMS norm rounding everywhere: the PyTorch reference (Hugging Face's T5LayerNorm and
LlamaRMSNorm), the Triton `rmsnorm` kernel and the norm in the GEMV's prologue give the same
bits, with and without the residual add, so that a batch of one (the GEMV with the norm fused)
and a batch (the norm kernel, then a GEMM) normalize alike.

Runs the kernels in Triton's interpreter, whose float32 -> bfloat16 cast truncates where a GPU
(and PyTorch) rounds to nearest even: `gpu_bf16_rounding` makes it round as the GPU does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seq2serve.models.ops import TorchOps

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (CPU)")


@pytest.fixture
def gpu_bf16_rounding(monkeypatch):
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    cast = InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16),
                                dst_type.scalar)
        return cast(self, src, dst_type)

    monkeypatch.setattr(InterpreterBuilder, "cast_impl", cast_impl)


def _inputs(rows: int, n: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x, res = ((torch.randn(rows, n, generator=g) * 3).to(dtype) for _ in range(2))
    norm_w = (torch.rand(n, generator=g) + 0.5).to(dtype)
    w = (torch.randn(24, n, generator=g) * n**-0.5).to(dtype)
    return x, res, norm_w, w


@pytest.mark.usefixtures("gpu_bf16_rounding")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, n", [(1, 64), (3, 1000), (4, 1024)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_three_norms_round_alike(dtype, rows, n, with_residual):
    from seq2serve.runtime.kernels.triton_gemv import gemv, norm_gemv
    from seq2serve.runtime.kernels.triton_ops import rmsnorm

    x, res, norm_w, w = _inputs(rows, n, dtype, seed=rows * n + with_residual)
    residual = res if with_residual else None
    reference = TorchOps().rms_norm(x, norm_w, 1e-6, residual)
    kernel = rmsnorm(x, norm_w, 1e-6, residual)
    if with_residual:
        (reference, ref_summed), (kernel, summed) = reference, kernel
        assert torch.equal(summed, ref_summed)
    assert torch.equal(kernel, reference)
    # the prologue's normalized rows, through the same GEMV as the reference's
    blocks = {"block_n": 8, "block_k": 256}
    fused, fused_summed = norm_gemv(x, norm_w, 1e-6, w, None, residual, **blocks)
    assert torch.equal(fused, gemv(reference, w, **blocks))
    assert torch.equal(fused_summed, x + res if with_residual else x)
