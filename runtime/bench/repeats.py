"""Repeated, interleaved runs for `bench offline --repeats N`: on a shared or throttled CPU one
run's tokens/s swings by +-20 %, and so does a ratio of two single runs. Each round runs every
system once, in turn, so that a slow minute slows all of them; each side is summarised by its
median over the rounds, and the ratio is the ratio of the medians."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def interleave(runners: dict[str, Callable[[], dict]], repeats: int,
               on_run: Callable[[int, str, dict], None] | None = None) -> dict[str, list[dict]]:
    """Round r (0 .. repeats-1) calls every runner once, in `runners`' order; returns each
    runner's results in round order. `on_run(r, name, result)` sees each result as it comes."""
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    runs: dict[str, list[dict]] = {name: [] for name in runners}
    for r in range(repeats):
        for name, run in runners.items():
            result = run()
            runs[name].append(result)
            if on_run is not None:
                on_run(r, name, result)
    return runs


def summarize(runs: list[dict], key: str = "tokens_per_s") -> dict:
    """The median of `key` over the runs (as `key`), its min and max, and every run's value."""
    values = [r[key] for r in runs]
    return {key: statistics.median(values), f"{key}_min": min(values),
            f"{key}_max": max(values), f"{key}_runs": values, "repeats": len(values)}


def paired_ratios(ours: list[dict], theirs: list[dict], key: str = "tokens_per_s") -> list:
    """Round by round, ours / theirs (the spread of the ratio itself)."""
    return [a[key] / b[key] for a, b in zip(ours, theirs, strict=True)]
