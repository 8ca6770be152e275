"""The collector's pauses are counted per generation, and a frozen heap leaves full passes
only what was allocated since (runtime/memory/collector.py)."""

import gc

from seq2serve.runtime.memory.collector import CollectorPauses, freeze_heap


def test_pauses_counted_per_generation():
    pauses = CollectorPauses()
    try:
        before = pauses.stats()["gc_passes"][2]
        gc.collect(2)
        gc.collect(0)
        st = pauses.stats()
        assert st["gc_passes"][2] == before + 1
        assert st["gc_passes"][0] >= 1
        assert st["gc_pause_max_ms"][2] > 0
        assert st["gc_pause_total_ms"][2] >= st["gc_pause_max_ms"][2]
    finally:
        pauses.close()
    assert pauses._on_gc not in gc.callbacks


def test_freeze_moves_survivors_out_of_full_passes():
    kept = [[i] for i in range(10_000)]  # tracked containers that outlive the freeze
    try:
        freeze_heap()
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        assert not any(gc.is_tracked(x) and x in gc.get_objects(2) for x in kept[:1])
    finally:
        gc.unfreeze()
