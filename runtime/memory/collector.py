"""Python's garbage collector in a serving process: what startup allocated (torch, the model's
modules, the tokenizer: a million objects) is frozen out of the collector's passes, and the
pauses that remain are timed so that `/debug/stats` can show them.

A full collection walks every tracked object; in a scheduler process with torch and a model
loaded that is tens of milliseconds, during which no step is launched and every stream waits.
The requests themselves live for hundreds of steps, so they reach the oldest generation and
trigger full collections under a steady load. After `freeze_heap()` a full pass walks only
what was allocated since (vLLM's engine core freezes its heap after startup the same way).

What is allocated since is the running requests, and a full pass over them finds nothing to
free (their objects are freed by reference counts when they finish; the beam and greedy paths
leave no cycles, tests/test_collector.py), yet costs in proportion to how many run: on an
H200, 4,096 OPUS-MT beam requests at 2,048 rows spent 344 ms of a 7.3 s run in full passes,
8,192 of them at 4,096 or 8,192 rows 1.0-1.1 s of 10-14 s (docs/benchmarks.md). `FullPasses` takes full
collections off the allocation trigger in the scheduler process: one runs when the scheduler
goes idle (at most every `IDLE_GAP_S`), and under a load that never lets up every
`interval_s`, so whatever cycles something does leave are still freed (SGLang's schedulers
moved to periodic full passes for the same pauses)."""

from __future__ import annotations

import gc
import time


def freeze_heap() -> None:
    """Collect once, then move every object that survived into the permanent generation."""
    gc.collect()
    gc.freeze()


_NEVER = 2**31 - 1  # gc.set_threshold's third value: no full pass by the allocation count
IDLE_GAP_S = 5.0  # an idle scheduler's full passes: at most one in this many seconds


class FullPasses:
    """Full collections when the scheduler is idle, or every `interval_s` seconds under load,
    instead of by Python's allocation count (young generations keep theirs). `interval_s` 0:
    Python's own trigger (nothing changed). `close()` restores the thresholds."""

    def __init__(self, interval_s: float, clock=time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.saved = gc.get_threshold()
        self.last = clock()
        self.runs = 0
        if interval_s > 0:
            gc.set_threshold(self.saved[0], self.saved[1], _NEVER)

    def maybe(self, idle: bool) -> bool:
        """A full pass if one is due: the scheduler idle and the young generations have
        promoted objects since the last (none else to walk), or `interval_s` passed."""
        if self.interval_s <= 0:
            return False
        now = self.clock()
        gap = now - self.last
        due = gap >= self.interval_s or (idle and gap >= IDLE_GAP_S and gc.get_count()[2] > 0)
        if not due:
            return False
        gc.collect()
        self.last, self.runs = self.clock(), self.runs + 1
        return True

    def stats(self) -> dict:
        return {"gc_scheduled_full_passes": self.runs}

    def close(self) -> None:
        gc.set_threshold(*self.saved)


class CollectorPauses:
    """Counts and times the collector's passes per generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.total_s = [0.0, 0.0, 0.0]
        self.max_s = [0.0, 0.0, 0.0]
        self._start = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        gen = info["generation"]
        took = time.perf_counter() - self._start
        self.count[gen] += 1
        self.total_s[gen] += took
        self.max_s[gen] = max(self.max_s[gen], took)

    def stats(self) -> dict:
        return {"gc_passes": list(self.count),
                "gc_pause_total_ms": [round(t * 1e3, 2) for t in self.total_s],
                "gc_pause_max_ms": [round(t * 1e3, 2) for t in self.max_s],
                "gc_frozen_objects": gc.get_freeze_count()}

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
