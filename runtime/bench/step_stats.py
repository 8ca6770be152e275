"""What a scheduler did during a timed window, from two snapshots of its counters
(`Scheduler.stats()`: `Engine.stats()` offline, `/debug/stats` served): its forwards by mode,
the device's busy time against the wall time, the host's waits, the encoder, the collector's
pauses. The same figures for the offline engine and for a server under load, so that where a
server loses against the engine it wraps (more forwards, fuller or emptier ones, a slower
device step, an idle device) can be read off one run."""

from __future__ import annotations


def step_times(before: dict, after: dict, elapsed: float, steps: int) -> dict:
    """Per forward: the wall time, and the device's busy time (CUDA events; 0 on a CPU).
    Their gap is time the device sat idle, waiting for the host."""
    device = after["device_busy_seconds"] - before["device_busy_seconds"]
    return {"step_ms": 1e3 * elapsed / max(steps, 1),
            "device_busy_ms_per_step": 1e3 * device / max(steps, 1),
            "device_busy_share": device / elapsed if elapsed else 0.0}


def gc_delta(before: dict, after: dict) -> list[float]:
    """Collector pause time per generation between two `stats()` (empty where not reported:
    an engine without a scheduler process of its own)."""
    b, a = before.get("gc_pause_total_ms"), after.get("gc_pause_total_ms")
    return [round(y - x, 2) for x, y in zip(b, a)] if a and b else []


def window(before: dict, after: dict, elapsed: float) -> dict:
    """The scheduler's work between two `stats()` snapshots `elapsed` seconds apart."""
    modes = sorted(set(before.get("forwards_by_mode", {})) | set(after["forwards_by_mode"]))
    by_mode = {m: after["forwards_by_mode"].get(m, 0) - before.get("forwards_by_mode", {})
               .get(m, 0) for m in modes}
    steps = after["forwards"] - before["forwards"]
    return {"seconds": elapsed, "forwards": steps, "forwards_by_mode": by_mode,
            **step_times(before, after, elapsed, steps),
            "host_wait_seconds": after["host_wait_seconds"] - before["host_wait_seconds"],
            "encoder_seconds": after["encoder_seconds"] - before["encoder_seconds"],
            "encoder_inputs": after["encoder_inputs"] - before["encoder_inputs"],
            "gc_pause_ms": gc_delta(before, after)}


def describe(w: dict) -> str:
    """One line of `window`'s figures."""
    modes = ", ".join(f"{n} {m}" for m, n in w["forwards_by_mode"].items() if n)
    return (f"{w['forwards']} forwards ({modes}), {w['step_ms']:.2f} ms of wall time a "
            f"forward, device busy {w['device_busy_ms_per_step']:.2f} ms a forward "
            f"({w['device_busy_share']:.0%}), host waiting for the device "
            f"{w['host_wait_seconds']:.2f} s, encoder {w['encoder_seconds']:.2f} s "
            f"({w['encoder_inputs']} inputs), collector pauses {w['gc_pause_ms']} ms")
