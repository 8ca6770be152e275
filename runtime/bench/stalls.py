"""Where a streamed load's long inter-token gaps come from: gaps that end at the same moment in
many streams are a server-wide pause (the scheduler, or one HTTP process for its share of the
streams); gaps scattered in time are one stream's events coalescing or a client falling
behind. ITL p99 alone cannot tell the two apart."""

from __future__ import annotations

import statistics


def stall_moments(gaps: list[tuple[float, float]], start: float, window: float = 0.005,
                  min_streams: int = 8, most: int = 10) -> dict:
    """`gaps`: (wall time the gap ended, its length in s) of every long gap of every stream.
    A moment is the gaps ending within `window` of the first of them; the fullest moments
    are taken first, each gap in one at most; those of `min_streams` gaps or more are shared
    stalls, reported largest first (seconds into the run)."""
    gaps = sorted(gaps)
    ends = [e for e, _ in gaps]
    spans, j = [], 0
    for i, end in enumerate(ends):  # the gaps in [end, end + window]: [i, j)
        j = max(j, i)
        while j < len(ends) and ends[j] - end <= window:
            j += 1
        spans.append((j - i, i, j))
    taken = [False] * len(gaps)
    shared = []
    for count, i, j in sorted(spans, reverse=True):
        if count < min_streams:
            break
        if any(taken[i:j]):
            continue
        taken[i:j] = [True] * (j - i)
        shared.append(gaps[i:j])
    return {
        "long_gaps": len(gaps),
        "in_shared_stalls": sum(len(m) for m in shared),
        "shared_stalls": len(shared),
        "largest": [{"at_s": round(m[0][0] - start, 3), "streams": len(m),
                     "gap_p50_ms": round(statistics.median(g for _, g in m) * 1e3, 1)}
                    for m in shared[:most]],
    }
