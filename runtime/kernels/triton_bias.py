"""T5's relative position bias inside Triton kernels: the bucket of (key_pos - query_pos) and
the table lookup happen per score tile, so no [heads, q, k] bias tensor is ever built."""

from __future__ import annotations

import math

import triton
import triton.language as tl

from seq2serve.runtime.kernels.position_bias import PositionBias


def bias_constexprs(bias: PositionBias | None) -> dict:
    """The compile-time arguments `t5_bias` needs (placeholders when there is no bias)."""
    if bias is None:
        return dict(HAS_BIAS=False, BIDIRECTIONAL=False, NUM_BUCKETS=4, LOG_RATIO=1.0)
    max_exact = (bias.num_buckets // 2 if bias.bidirectional else bias.num_buckets) // 2
    if max_exact < 1 or bias.max_distance <= max_exact:
        raise ValueError(f"unsupported relative position bias: {bias.num_buckets} buckets, "
                         f"max_distance {bias.max_distance}, bidirectional={bias.bidirectional}")
    return dict(HAS_BIAS=True, BIDIRECTIONAL=bias.bidirectional, NUM_BUCKETS=bias.num_buckets,
                LOG_RATIO=math.log(bias.max_distance / max_exact))


@triton.jit
def t5_bucket(rel, BIDIRECTIONAL: tl.constexpr, NUM_BUCKETS: tl.constexpr,
              LOG_RATIO: tl.constexpr):
    """HF's relative_position_bucket of an int32 tile of key_pos - query_pos.

    LOG_RATIO is log(max_distance / max_exact), computed on the host like torch's Python float.
    """
    if BIDIRECTIONAL:
        half: tl.constexpr = NUM_BUCKETS // 2
        base = tl.where(rel > 0, half, 0)
        dist = tl.abs(rel)
    else:
        half: tl.constexpr = NUM_BUCKETS
        base = tl.zeros_like(rel)
        dist = tl.maximum(-rel, 0)
    max_exact: tl.constexpr = half // 2
    # float32 log as in torch; the epsilon sends exact ties (e.g. dist == 2 * max_exact with
    # LOG_RATIO == log(4)) to the bucket torch truncates them to, not one below
    ratio = tl.maximum(dist, max_exact).to(tl.float32) / max_exact
    large = (tl.log(ratio) / LOG_RATIO * (half - max_exact) + 1e-5).to(tl.int32) + max_exact
    large = tl.minimum(large, half - 1)
    return base + tl.where(dist < max_exact, dist, large)


@triton.jit
def t5_bias(table, stride_bucket, stride_head, head, rel, mask, BIDIRECTIONAL: tl.constexpr,
            NUM_BUCKETS: tl.constexpr, LOG_RATIO: tl.constexpr):
    """float32 bias table[bucket(rel), head] for a tile of relative positions; `head` broadcasts
    against `rel` (a scalar or a column of heads) and `mask` guards padded heads."""
    bucket = t5_bucket(rel, BIDIRECTIONAL, NUM_BUCKETS, LOG_RATIO)
    values = tl.load(table + bucket * stride_bucket + head * stride_head, mask=mask, other=0.0)
    return values.to(tl.float32)
