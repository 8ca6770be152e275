"""Python's garbage collector in a serving process: what startup allocated (torch, the model's
modules, the tokenizer: a million objects) is frozen out of the collector's passes, and the
pauses that remain are timed so that `/debug/stats` can show them.

A full collection walks every tracked object; in a scheduler process with torch and a model
loaded that is tens of milliseconds, during which no step is launched and every stream waits.
The requests themselves live for hundreds of steps, so they reach the oldest generation and
trigger full collections under a steady load. After `freeze_heap()` a full pass walks only
what was allocated since (vLLM's engine core freezes its heap after startup the same way)."""

from __future__ import annotations

import gc
import time


def freeze_heap() -> None:
    """Collect once, then move every object that survived into the permanent generation."""
    gc.collect()
    gc.freeze()


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
