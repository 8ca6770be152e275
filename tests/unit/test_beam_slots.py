"""`BeamSlots`: the device rules' arena slots a num_beams, the lowest free one taken first (an
arena is as large as the most groups of its num_beams that ran at once), counted while held
(`RequestMemory.check` compares the count with the running groups' slots)."""

from __future__ import annotations

import random

from seq2serve.runtime.scheduler.beam_slots import BeamSlots


def test_lowest_free_slot_first_per_num_beams():
    slots = BeamSlots()
    assert [slots.take(4) for _ in range(3)] == [0, 1, 2]
    assert slots.take(2) == 0  # (each num_beams its own arena)
    slots.give(4, 1)
    slots.give(4, 0)
    assert slots.held == {4: 1, 2: 1}
    assert [slots.take(4), slots.take(4), slots.take(4)] == [0, 1, 3]
    assert slots.held == {4: 4, 2: 1}


def test_slots_in_use_never_exceed_the_most_held_at_once():
    rng, slots, held, most = random.Random(3), BeamSlots(), [], 0
    for _ in range(2000):
        if held and rng.random() < 0.5:
            slots.give(5, held.pop(rng.randrange(len(held))))
        else:
            held.append(slots.take(5))
        assert len(set(held)) == len(held) == slots.held[5]
        most = max(most, len(held))
        assert max(held, default=0) < most
