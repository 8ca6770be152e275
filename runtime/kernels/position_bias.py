"""What the attention kernels read of a T5-style relative position bias."""

from __future__ import annotations

from typing import Protocol

import torch


class PositionBias(Protocol):
    """A T5-style relative position bias: a [num_buckets, num_heads] table looked up by the
    bucket of (key_pos - query_pos). Kernels read the fields; the reference calls it."""

    weight: torch.Tensor
    num_buckets: int
    max_distance: int
    bidirectional: bool

    def __call__(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Bias of shape [num_heads, len(q_pos), len(k_pos)] in float32."""
        ...
