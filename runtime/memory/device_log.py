"""DeviceLog: the device writes the scheduler makes to its pools between forwards, recorded so
that the other tensor-parallel ranks make the same writes to their own pools.

Rank 0's scheduler owns the books of every pool (which slots hold what) and writes some
device state itself: a request's table rows at admission (its cached prefix, its cross K/V
slots) and a beam step's table and page copies. Each rank holds its own tables and its heads'
slice of the K/V pools, so those writes must happen on every rank. A pool with a `log` records
each such call (its name, the method, host-side arguments) as well as making it; the executor
sends the records with the next batch, and each other rank replays them on its pools before
that batch's forward: the same writes in the same order relative to the forwards.
"""

from __future__ import annotations

from typing import Any


class DeviceLog:
    def __init__(self) -> None:
        self.records: list[tuple[str, str, tuple]] = []

    def record(self, target: str, method: str, *args: Any) -> None:
        self.records.append((target, method, args))

    def take(self) -> list[tuple[str, str, tuple]]:
        records, self.records = self.records, []
        return records


def replay(records: list[tuple[str, str, tuple]], targets: dict[str, Any]) -> None:
    """Make the recorded writes on this rank's pools (`targets` by name; none has a log)."""
    for target, method, args in records:
        getattr(targets[target], method)(*args)
