"""A few row counts for the GEMMs cuBLAS runs (the encoder's passes, encode_buckets.py).

cuBLAS chooses a GEMM's kernel by its shape, and on the lent H200s (torch 2.11, CUDA 13) the
first product of a row count it has not seen costs 2.5-4 ms of host time against 0.1 ms after
(docs/benchmarks.md, thirtieth session); its cache of choices holds a few thousand shapes. The
row count of an eager forward (an encoder pass's tokens, a prefill's, a decode batch past the
CUDA graphs) takes a new value nearly every time under a served load. Rounded up to one of
~8 counts an octave (at most 1/8 more rows), the shapes stay few: each is paid once.

The same padding of every eager GEMM's rows (`TritonOps`, tried in the thirty-first session)
was taken out again: Llama under ~1,000-token prefills lost 8-15 % of its throughput in three
A/B runs, though a new row count's cost is gone (docs/benchmarks.md).
"""

from __future__ import annotations

MIN_STEP = 64  # row counts below 512 are rounded up to a multiple of this


def bucket_rows(n: int, limit: int | None = None) -> int:
    """`n` rounded up to a multiple of 1/8 of the power of two at or below it (and of
    MIN_STEP): eight counts an octave, at most 1/8 more. Never above max(n, `limit`)."""
    if n <= 0:
        return n
    step = max(MIN_STEP, (1 << (n.bit_length() - 1)) // 8)
    out = -(-n // step) * step
    return out if limit is None else max(n, min(out, limit))
