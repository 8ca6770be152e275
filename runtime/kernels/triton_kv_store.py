"""Writing new tokens' K and V into their pool slots with one kernel (two index_put kernels
otherwise): a decode step does this once per layer."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from seq2serve.runtime.kernels.pdl import gdc_launch_dependents, gdc_wait, pdl_enabled, pdl_launch


@triton.jit
def _store_kv_kernel(k, v, k_buf, v_buf, loc, stride_k, stride_v, stride_kb, stride_vb,
                     WIDTH: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # see runtime/kernels/pdl.py
        gdc_launch_dependents()
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc + t).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    kv = tl.load(k + t * stride_k + cols, mask=mask)
    tl.store(k_buf + slot * stride_kb + cols, kv.to(k_buf.dtype.element_ty), mask=mask)
    vv = tl.load(v + t * stride_v + cols, mask=mask)
    tl.store(v_buf + slot * stride_vb + cols, vv.to(v_buf.dtype.element_ty), mask=mask)


def store_kv(k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """k_buf[loc] = k and v_buf[loc] = v for k, v of shape [tokens, heads, head_dim] whose
    heads and head_dim are contiguous (views of a fused projection are fine)."""
    tokens = k.shape[0]
    width = k.shape[1] * k.shape[2]
    assert k.stride(2) == 1 and k.stride(1) == k.shape[2] and v.stride(1) == v.shape[2]
    if tokens:
        block = min(1024, triton.next_power_of_2(width))
        _store_kv_kernel[(tokens, triton.cdiv(width, block))](
            k, v, k_buf, v_buf, loc, k.stride(0), v.stride(0), k_buf.stride(0),
            v_buf.stride(0), WIDTH=width, BLOCK=block, num_warps=4, PDL=pdl_enabled(),
            **pdl_launch())
