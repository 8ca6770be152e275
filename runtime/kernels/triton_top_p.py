"""Each row's top-p / top-k / min-p cut as one probability threshold, without sorting the row
and without a host sync (the CUDA sampler's filter, runtime/executor/token_filter.py).

Every rule keeps the tokens at or above some value, so together they keep {q_i >= t} for the
smallest float t that passes all of them:
- top-p P (< 1): the mass of the tokens strictly larger than t is < P;
- top-k k (< vocab): fewer than k tokens are strictly larger than t;
- min-p m (> 0): t >= m * max(q) (the same float32 product as the sort path's).
Each holds for t = max(q), so the most likely token always survives. Tokens tied with one
that survives survive too (a sort keeps some prefix of them, in no particular order).

The predicate only turns from false to true as t grows, and non-negative floats order like
their int32 bit patterns, so the kernel searches the bits in [0, bits(+inf)]: each pass over
the row tests CANDIDATES thresholds that split the interval left into CANDIDATES + 1 parts
(8 candidates: 10 passes at most), accumulating each one's mass and count elementwise in
[CANDIDATES, BLOCK] float32 / int32 tiles reduced once per pass. One program per row; a row
without a rule returns 0.0 at once (it keeps everything).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_INF_BITS = tl.constexpr(0x7F800000)  # float32 +inf: every rule holds there


@triton.jit
def _threshold_kernel(probs, top_ps, top_ks, min_ps, out, stride, n, HAS_P: tl.constexpr,
                      HAS_K: tl.constexpr, HAS_MIN_P: tl.constexpr, CANDIDATES: tl.constexpr,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = probs + row * stride
    cols = tl.arange(0, BLOCK)
    if HAS_P:
        p = tl.load(top_ps + row)
    else:
        p = tl.full([], 1.0, tl.float32)
    if HAS_K:
        k = tl.load(top_ks + row)
    else:
        k = n
    if HAS_MIN_P:
        min_p = tl.load(min_ps + row)
    else:
        min_p = tl.full([], 0.0, tl.float32)
    ruled = (p < 1.0) | (k < n) | (min_p > 0.0)
    p = tl.where(p < 1.0, p, float("inf"))  # P >= 1: no top-p rule
    lo = tl.full([], 0, tl.int64)
    hi = tl.where(ruled, _INF_BITS, 0).to(tl.int64)  # the answer's bits lie in [lo, hi]
    steps = tl.arange(1, CANDIDATES + 1).to(tl.int64)
    while lo < hi:
        cand = lo + steps * (hi - lo) // (CANDIDATES + 1)
        t = cand.to(tl.int32).to(tl.float32, bitcast=True)
        mass = tl.zeros([CANDIDATES, BLOCK], tl.float32)
        count = tl.zeros([CANDIDATES, BLOCK], tl.int32)
        top = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            x = tl.load(base + start + cols, mask=start + cols < n, other=0.0).to(tl.float32)
            above = x[None, :] > t[:, None]
            mass += tl.where(above, x[None, :], 0.0)
            if HAS_K:
                count += above.to(tl.int32)
            if HAS_MIN_P:
                top = tl.maximum(top, x)
        ok = (tl.sum(mass, 1) < p) & (tl.sum(count, 1) < k)
        if HAS_MIN_P:
            ok &= min_p * tl.max(top, 0) <= t
        lo = tl.max(tl.where(ok, lo, cand + 1), 0)  # past the last candidate that fails
        hi = tl.min(tl.where(ok, cand, hi), 0)  # at the first one that passes
    tl.store(out + row, lo.to(tl.int32).to(tl.float32, bitcast=True))


def top_p_threshold(probs: torch.Tensor, top_ps: torch.Tensor | None,
                    top_ks: torch.Tensor | None = None, min_ps: torch.Tensor | None = None,
                    candidates: int = 8, block: int = 1024) -> torch.Tensor:
    """[B] float32: each row keeps the tokens with `probs >= threshold` (0.0: all of them).
    `probs` [B, vocab], rows of probabilities (float32 in the sampler; accumulated in
    float32); `top_ps` and `min_ps` [B] or [B, 1] float32 (P >= 1, m <= 0: no rule),
    `top_ks` [B] int (>= vocab: no rule); None where no row has the rule."""
    rows, vocab = probs.shape
    probs = probs.contiguous()
    out = torch.empty(rows, dtype=torch.float32, device=probs.device)
    if rows:
        _threshold_kernel[(rows,)](
            probs, out if top_ps is None else top_ps.reshape(rows),
            out if top_ks is None else top_ks.reshape(rows),
            out if min_ps is None else min_ps.reshape(rows), out, probs.stride(0), vocab,
            HAS_P=top_ps is not None, HAS_K=top_ks is not None, HAS_MIN_P=min_ps is not None,
            CANDIDATES=candidates, BLOCK=block, num_warps=8)
    return out
