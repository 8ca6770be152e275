"""Weights whose row count is not a multiple of 8 (an LM head over OPUS-MT's 58,101 tokens,
NLLB's 256,206, Whisper's 51,866, Florence-2's 51,290), given a storage of a multiple of 64
rows, so that cuBLAS computes their output on aligned kernels.

A GEMM's output [tokens, n] with n odd (or not a multiple of 8) has rows that are not 16-byte
aligned, and cuBLAS falls back to alignment-1 kernels: on an H200 OPUS-MT's head ran on
`cutlass_75_tensorop_bf16_s1688` (an sm75 kernel), 1.35 ms of a 4.0 ms beam step at 2,048
rows (docs/benchmarks.md, twenty-second session). `pad_rows` moves such a weight into a
zero-padded buffer and leaves the parameter a view of its first n rows (same values, same
parameter object: an embedding tied to it sees them too); `padded` is the whole buffer, whose
output the caller slices back to n columns. Only the padding rows are extra memory.
"""

from __future__ import annotations

import torch
from torch import nn

ROWS = 64  # a padded weight's rows: a multiple of this


def needs_padding(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.shape[0] % 8 != 0


def pad_rows(weight: nn.Parameter) -> None:
    """`weight`'s values moved into a buffer of a multiple of ROWS rows, zero past its own."""
    n, k = weight.shape
    with torch.inference_mode(False):  # (a plain tensor, whatever mode the caller is in)
        buf = torch.zeros(-(-n // ROWS) * ROWS, k, dtype=weight.dtype, device=weight.device)
        buf[:n] = weight.data
    weight.data = buf[:n]


def padded(weight: torch.Tensor) -> torch.Tensor | None:
    """The whole padded buffer behind `weight` (`pad_rows`), or None where it has none."""
    n, k = weight.shape
    total = -(-n // ROWS) * ROWS
    if (not weight.is_contiguous() or weight.storage_offset() != 0
            or weight.untyped_storage().nbytes() < total * k * weight.element_size()):
        return None
    return weight.as_strided((total, k), (k, 1))
