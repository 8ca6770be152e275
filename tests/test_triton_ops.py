"""The fused norm and activation kernels against their PyTorch references (interpreted on the
CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from seq2serve.models.norm import RMSNorm
from seq2serve.runtime.kernels.activations import torch_activation
from seq2serve.runtime.kernels.triton_ops import gated_activation, rmsnorm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("rows, n", [(1, 7), (3, 48), (5, 1024), (2, 1000)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_matches_torch(rows, n, with_residual):
    g = torch.Generator().manual_seed(rows * n)
    x = torch.randn(rows, n, generator=g).to(DEVICE)
    res = torch.randn(rows, n, generator=g).to(DEVICE)
    ref = RMSNorm(n, eps=1e-6).to(DEVICE)
    ref.weight.copy_(torch.rand(n, generator=g) + 0.5)
    if with_residual:
        normed, summed = rmsnorm(x, ref.weight, 1e-6, res)
        torch.testing.assert_close(summed, x + res)
        torch.testing.assert_close(normed, ref(x + res), atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(rmsnorm(x, ref.weight, 1e-6), ref(x), atol=1e-5,
                                   rtol=1e-5)


@pytest.mark.parametrize("activation", ["silu", "gelu_new", "gelu", "relu"])
@pytest.mark.parametrize("rows, n", [(1, 16), (4, 1500)])
def test_gated_activation_matches_torch(activation, rows, n):
    g = torch.Generator().manual_seed(n)
    gate_up = (torch.randn(rows, 2 * n, generator=g) * 3).to(DEVICE)
    gate, up = gate_up.split(n, dim=-1)
    ref = torch_activation(activation)(gate) * up
    torch.testing.assert_close(gated_activation(gate_up, activation), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads, dim", [(4, 16), (3, 7), (16, 64)])
def test_store_kv_matches_index_put(heads, dim):
    from seq2serve.runtime.kernels.triton_kv_store import store_kv

    g = torch.Generator().manual_seed(heads * dim)
    fused = torch.randn(5, 3 * heads * dim, generator=g).to(DEVICE)  # q|k|v like a projection
    k = fused[:, heads * dim:2 * heads * dim].view(5, heads, dim)
    v = fused[:, 2 * heads * dim:].view(5, heads, dim)
    loc = torch.tensor([7, 0, 3, 12, 5]).to(DEVICE)
    k_buf = torch.full((16, heads, dim), float("nan")).to(DEVICE)
    v_buf = k_buf.clone()
    store_kv(k_buf, v_buf, loc, k, v)
    ref_k = torch.full_like(k_buf, float("nan"))
    ref_v = ref_k.clone()
    ref_k[loc], ref_v[loc] = k, v
    torch.testing.assert_close(k_buf, ref_k, equal_nan=True)
    torch.testing.assert_close(v_buf, ref_v, equal_nan=True)


@pytest.mark.parametrize("m, n, k, block_n, block_k", [
    (1, 37, 64, 8, 32), (2, 64, 100, 4, 64), (3, 130, 48, 16, 16), (4, 16, 256, 2, 256)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_linear(m, n, k, block_n, block_k, with_bias):
    from seq2serve.runtime.kernels.triton_gemv import gemv

    g = torch.Generator().manual_seed(m * n * k)
    x = torch.randn(m, k, generator=g).to(DEVICE)
    w = torch.randn(n, k, generator=g).to(DEVICE)
    b = torch.randn(n, generator=g).to(DEVICE) if with_bias else None
    ref = torch.nn.functional.linear(x, w, b)
    torch.testing.assert_close(gemv(x, w, b, block_n=block_n, block_k=block_k), ref,
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("m, n, k, block_n, block_k", [
    (1, 37, 64, 8, 32), (3, 130, 48, 16, 16), (4, 16, 256, 2, 256), (2, 20, 100, 4, 64)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_gemv_is_rmsnorm_then_linear(m, n, k, block_n, block_k, with_residual):
    from seq2serve.runtime.kernels.triton_gemv import norm_gemv

    g = torch.Generator().manual_seed(m * n * k + with_residual)
    x, res = (torch.randn(m, k, generator=g).to(DEVICE) for _ in range(2))
    w = torch.randn(n, k, generator=g).to(DEVICE)
    b = torch.randn(n, generator=g).to(DEVICE)
    norm = RMSNorm(k, 1e-6).to(DEVICE)
    norm.weight.data = torch.randn(k, generator=g).to(DEVICE)
    out, summed = norm_gemv(x, norm.weight, norm.eps, w, b, res if with_residual else None,
                            block_n=block_n, block_k=block_k)
    x_ref = x + res if with_residual else x
    torch.testing.assert_close(out, torch.nn.functional.linear(norm(x_ref), w, b),
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(summed, x_ref)


@pytest.mark.parametrize("activation", ["gelu_new", "silu", "relu", "gelu"])
@pytest.mark.parametrize("m, n, k", [(1, 24, 40), (3, 9, 130)])
def test_gated_gemv_is_gated_activation_then_linear(activation, m, n, k):
    from seq2serve.runtime.kernels.triton_gemv import gated_gemv

    g = torch.Generator().manual_seed(m * n * k)
    gate_up = torch.randn(m, 2 * k, generator=g).to(DEVICE)
    w = torch.randn(n, k, generator=g).to(DEVICE)
    act = torch_activation(activation)(gate_up[:, :k]) * gate_up[:, k:]
    torch.testing.assert_close(gated_gemv(gate_up, activation, w, block_n=8, block_k=32),
                               torch.nn.functional.linear(act, w), atol=1e-4, rtol=1e-4)


def test_gemv_refuses_what_it_does_not_handle():
    from seq2serve.runtime.kernels.triton_gemv import gemv

    with pytest.raises(ValueError, match="gemv takes"):
        gemv(torch.zeros(5, 8), torch.zeros(4, 8), block_n=2, block_k=8)
    with pytest.raises(ValueError, match="gemv takes"):
        gemv(torch.zeros(1, 8), torch.zeros(8, 4).t(), block_n=2, block_k=8)


@pytest.mark.parametrize("m, n, k, block_n, block_k", [
    (2, 37, 64, 16, 32), (5, 130, 48, 32, 16), (16, 16, 256, 16, 64), (9, 64, 100, 64, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_gemm_matches_linear(m, n, k, block_n, block_k, with_bias):
    from seq2serve.runtime.kernels.triton_skinny import skinny_gemm

    g = torch.Generator().manual_seed(m * n * k)
    x = torch.randn(m, k, generator=g).to(DEVICE)
    w = torch.randn(n, k, generator=g).to(DEVICE)
    b = torch.randn(n, generator=g).to(DEVICE) if with_bias else None
    ref = torch.nn.functional.linear(x, w, b)
    torch.testing.assert_close(skinny_gemm(x, w, b, block_n=block_n, block_k=block_k), ref,
                               atol=1e-4, rtol=1e-4)
    # a row of a larger tensor (a strided view) reads as the copy would
    wide = torch.randn(m, 2 * k, generator=g).to(DEVICE)
    torch.testing.assert_close(skinny_gemm(wide[:, :k], w, block_n=block_n, block_k=block_k),
                               torch.nn.functional.linear(wide[:, :k], w), atol=1e-4,
                               rtol=1e-4)


def test_skinny_gemm_refuses_what_it_does_not_handle():
    from seq2serve.runtime.kernels.triton_skinny import skinny_gemm

    for x, w in [(torch.zeros(17, 8), torch.zeros(4, 8)), (torch.zeros(0, 8), torch.zeros(4, 8)),
                 (torch.zeros(2, 8), torch.zeros(8, 4).t()), (torch.zeros(8), torch.zeros(4, 8))]:
        with pytest.raises(ValueError, match="skinny_gemm takes"):
            skinny_gemm(x, w, block_n=16, block_k=16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (autotuned path)")
@pytest.mark.parametrize("m, n, k", [(2, 3072, 1024), (8, 5632, 1024), (16, 1024, 2816),
                                     (5, 250112, 1024)])
def test_skinny_gemm_autotuned_bf16(m, n, k):
    from seq2serve.runtime.kernels.triton_skinny import skinny_gemm

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x.float(), w.float(), b.float())
    torch.testing.assert_close(skinny_gemm(x, w, b).float(), ref, atol=2e-2, rtol=2e-2)
    x32, w32 = x.float(), w.float()  # float32: IEEE products, not TF32
    torch.testing.assert_close(skinny_gemm(x32, w32), x32 @ w32.T, atol=1e-4, rtol=1e-4)



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (autotuned path)")
@pytest.mark.parametrize("m, n, k", [(1, 3072, 1024), (2, 5632, 1024), (4, 1024, 2816),
                                     (1, 250112, 1024)])
def test_gemv_autotuned_bf16(m, n, k):
    from seq2serve.runtime.kernels.triton_gemv import gated_gemv, gemv, norm_gemv

    x, res = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    ref = torch.nn.functional.linear(x.float(), w.float())
    torch.testing.assert_close(gemv(x, w).float(), ref, atol=2e-2, rtol=2e-2)
    # the folded prologues, against the unfused kernels in bf16
    norm = RMSNorm(k).cuda().to(torch.bfloat16)
    norm.weight.data.uniform_(0.5, 1.5)
    normed, summed = rmsnorm(x, norm.weight, norm.eps, res)
    out, summed2 = norm_gemv(x, norm.weight, norm.eps, w, None, res)
    assert torch.equal(summed2, summed)
    torch.testing.assert_close(out.float(), gemv(normed, w).float(), atol=2e-2, rtol=2e-2)
    gate_up = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(gated_gemv(gate_up, "gelu_new", w).float(),
                               gemv(gated_activation(gate_up, "gelu_new"), w).float(),
                               atol=2e-2, rtol=2e-2)
