"""The slots of the device's beam state (`runtime/executor/beam_rules.py: BeamArena`), one
arena a num_beams: the scheduler hands a group a slot at its first beam step and takes it
back when the group ends (finished, aborted, retracted). The lowest free slot is taken, so an
arena is as large as the most groups of its num_beams that ran at once. A slot given back may
be handed out at once: the device runs a step that enters a new group after every step
already launched that still names the old one."""

from __future__ import annotations

import heapq


class BeamSlots:
    def __init__(self) -> None:
        self._free: dict[int, list[int]] = {}  # num_beams -> a heap of free slots
        self._next: dict[int, int] = {}  # num_beams -> slots handed out so far, at most
        self.held: dict[int, int] = {}  # num_beams -> slots held now

    def take(self, num_beams: int) -> int:
        free = self._free.setdefault(num_beams, [])
        self.held[num_beams] = self.held.get(num_beams, 0) + 1
        if free:
            return heapq.heappop(free)
        slot = self._next.get(num_beams, 0)
        self._next[num_beams] = slot + 1
        return slot

    def give(self, num_beams: int, slot: int) -> None:
        heapq.heappush(self._free[num_beams], slot)
        self.held[num_beams] -= 1
