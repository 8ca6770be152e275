"""Time limits of tests that time the server, scaled by how busy the machine is.

A limit such as "a disconnect aborts the request within 1.5 s" holds on an idle machine by a
wide margin, and is what the code promises there. On a shared CI host running two or three
times more work than it has cores, every process gets a fraction of a core and the same code
takes that much longer; the work a limit stands against (a request left running, a prompt
tokenized on the event loop) slows down alike, so a scaled limit still tells them apart.
"""

from __future__ import annotations

import os


def slack() -> float:
    """How many times slower than idle this machine runs now: the 1-minute load average per
    core, at least 1 and at most 4 (`SEQ2SERVE_TEST_SLACK` sets it)."""
    if "SEQ2SERVE_TEST_SLACK" in os.environ:
        return float(os.environ["SEQ2SERVE_TEST_SLACK"])
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = 1.0
    return min(4.0, max(1.0, load))


def within(seconds: float) -> float:
    """`seconds`, an idle machine's limit, as a limit on this machine now."""
    return seconds * slack()
