"""Pieces every Triton attention kernel shares: tile sizes, the query tiling of ragged batches,
the streaming (flash) softmax update over one key block and its final normalization."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def block_d(head_dim: int) -> int:
    """Head-dim tile: a power of two, masked down to head_dim; tl.dot needs at least 16."""
    return max(16, triton.next_power_of_2(head_dim))


def dot_precision(dtype: torch.dtype) -> str:
    """float32 models get exact float32 dots (not TF32); the setting is moot for bf16/fp16."""
    return "ieee" if dtype == torch.float32 else "tf32"


# Query rows per program of the prefill-style kernels (extend, cross extend, encoder). Fixed
# across head dims because the backend lays out the query blocks once per batch.
BLOCK_M = 64


def block_n(head_dim: int) -> int:
    """Keys per step of the prefill-style kernels."""
    return 64 if head_dim <= 128 else 32


def num_warps(head_dim: int) -> int:
    return 4 if head_dim <= 64 else 8


def num_stages(head_dim: int, dtype: torch.dtype) -> int:
    """Software-pipelining stages of the encoder kernel (which reads K/V contiguously):
    Triton's 3, but 1 in float32 at head sizes from 128 (T5Gemma's 256), whose pipelined K/V
    tiles overflow an A100's shared memory (180 KB at 128, 205 KB at 256, of its 163 KB)."""
    return 1 if dtype == torch.float32 and head_dim >= 128 else 3


def query_blocks(q_lens: list[int], block_m: int = BLOCK_M) -> tuple[list[int], list[int]]:
    """One (request, first query row) pair per program: every request's queries in tiles of
    block_m rows, so ragged batches launch no idle programs."""
    reqs, starts = [], []
    for i, n in enumerate(q_lens):
        for start in range(0, n, block_m):
            reqs.append(i)
            starts.append(start)
    return reqs, starts


@triton.jit
def cap_scores(scores, SOFTCAP: tl.constexpr):
    """Gemma's soft-cap, SOFTCAP * tanh(scores / SOFTCAP) (SOFTCAP 0: unchanged); tanh from
    one exp of a non-positive number (no overflow; the interpreter runs it too)."""
    if SOFTCAP > 0:
        e = tl.exp(-2.0 / SOFTCAP * tl.abs(scores))
        t = (1.0 - e) / (1.0 + e) * SOFTCAP
        scores = tl.where(scores < 0, -t, t)
    return scores


def softcap_constexpr(softcap: float | None) -> float:
    """A layer's soft-cap as the kernels' SOFTCAP (0.0: none)."""
    return float(softcap or 0.0)


@triton.jit
def online_softmax_update(scores, v, m_i, l_i, acc, DOT_PRECISION: tl.constexpr):
    """Fold one key block into the running row max `m_i`, denominator `l_i` and unnormalized
    output `acc`. `scores` [M, N] float32 hold -inf where masked; `v` is [N, D]."""
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    # rows with every key masked so far keep m = -inf; exponentiate against 0 to avoid NaN
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_ref)
    p = tl.exp(scores - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def softmax_finish(m_i, l_i, acc):
    """Normalized output and log-sum-exp of each row; a row that saw no key gets 0 and -inf."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), m_i + tl.log(l_safe))
    return acc / l_safe[:, None], lse

