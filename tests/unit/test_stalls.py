"""`bench serving`'s long gaps: the ones many streams share at one moment (a server-wide
pause) are told apart from the ones scattered over the run (a stream's events coalescing)."""

from __future__ import annotations

import random

from seq2serve.runtime.bench.stalls import stall_moments


def test_a_shared_pause_is_found_among_scattered_gaps():
    rng = random.Random(0)
    start = 1000.0
    scattered = [(start + rng.uniform(0, 10), rng.uniform(0.01, 0.05)) for _ in range(200)]
    pause = [(start + 4.0 + i * 0.0002, 0.090 + i * 0.001) for i in range(20)]  # 20 streams
    small = [(start + 7.0 + i * 0.0003, 0.020) for i in range(9)]  # 9 streams
    found = stall_moments(scattered + pause + small, start, min_streams=8)
    assert found["long_gaps"] == 229
    assert found["largest"][0]["streams"] >= 20 and abs(found["largest"][0]["at_s"] - 4.0) < 0.01
    assert 95 <= found["largest"][0]["gap_p50_ms"] <= 115
    assert found["shared_stalls"] == 2 and abs(found["largest"][1]["at_s"] - 7.0) < 0.006
    assert found["in_shared_stalls"] < 40  # (a scattered gap may fall inside a moment)


def test_no_gaps_no_stalls():
    assert stall_moments([], 0.0) == {"long_gaps": 0, "in_shared_stalls": 0,
                                      "shared_stalls": 0, "largest": []}
