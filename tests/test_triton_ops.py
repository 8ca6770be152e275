"""The fused norm and activation kernels against their PyTorch references (interpreted on the
CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

from seq2serve.models.mlp import ACTIVATIONS
from seq2serve.models.norm import RMSNorm
from seq2serve.models.triton_ops import gated_activation, rmsnorm

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
        torch.testing.assert_close(normed, ref._norm(x + res), atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(rmsnorm(x, ref.weight, 1e-6), ref._norm(x), atol=1e-5,
                                   rtol=1e-5)


@pytest.mark.parametrize("activation", ["silu", "gelu_new", "gelu", "relu"])
@pytest.mark.parametrize("rows, n", [(1, 16), (4, 1500)])
def test_gated_activation_matches_torch(activation, rows, n):
    g = torch.Generator().manual_seed(n)
    gate_up = (torch.randn(rows, 2 * n, generator=g) * 3).to(DEVICE)
    gate, up = gate_up.split(n, dim=-1)
    ref = ACTIVATIONS[activation](gate) * up
    torch.testing.assert_close(gated_activation(gate_up, activation), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads, dim", [(4, 16), (3, 7), (16, 64)])
def test_store_kv_matches_index_put(heads, dim):
    from seq2serve.runtime.memory.triton_kv_store import store_kv

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
