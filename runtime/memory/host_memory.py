"""Giving freed heap memory back to the OS (glibc's malloc_trim; a no-op elsewhere).

glibc keeps memory that a thread freed in that thread's arena for reuse. A process that serves
for days (the scheduler running CPU forwards, the preprocessing threads decoding images) then
looks as if it grew for good, although the memory is free: trimming returns it."""

from __future__ import annotations

import ctypes
import ctypes.util
import time


def _libc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


_malloc_trim = _libc_trim()


def release_freed_memory() -> None:
    """Return every arena's free memory to the OS now (a few ms for a GB-sized heap)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


class PeriodicTrim:
    """Trims unless the last trim was less than `interval_s` ago, for loops that free memory
    all the time (a trim costs a few ms, more for a fragmented heap)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def maybe(self, interval_s: float) -> bool:
        now = time.monotonic()
        if now - self.last < interval_s:
            return False
        release_freed_memory()
        self.last = time.monotonic()
        return True
