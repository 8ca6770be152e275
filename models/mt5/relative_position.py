"""T5's bucketed relative position bias: a [num_buckets, num_heads] table indexed by the bucket
of (key_pos - query_pos). Exact buckets for short distances, log-spaced up to max_distance."""

from __future__ import annotations

import math

import torch
from torch import nn

from seq2serve.models import parallel_state


def relative_position_bucket(rel: torch.Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """The bucket of each relative position (key - query), as Mesh TensorFlow and HF define it."""
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).long() * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    large = max_exact + (
        torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, rel, large)


class RelativePositionBias(nn.Module):
    """Computed once per batch by the first layer that asks; every layer of the stack shares it
    (UMT5: each layer has its own). A tensor-parallel rank holds its heads' columns of the
    table."""

    def __init__(self, num_buckets: int, max_distance: int, num_heads: int,
                 bidirectional: bool) -> None:
        super().__init__()
        tp = parallel_state.tensor_parallel()
        num_heads = tp.shard(num_heads, "attention heads")
        self.tp_dims = {"weight": 1} if tp.size > 1 else {}
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.weight = nn.Parameter(torch.empty(num_buckets, num_heads), requires_grad=False)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        rel = k_pos.long()[None, :] - q_pos.long()[:, None]
        bucket = relative_position_bucket(rel, self.bidirectional, self.num_buckets,
                                          self.max_distance)
        return self.weight[bucket].permute(2, 0, 1).float()
