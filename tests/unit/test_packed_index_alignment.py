"""The Triton backend's per-batch index tensors come from one copy, each view on a 16-byte
boundary whatever the batch (Triton compiles a kernel variant per pointer alignment)."""

from __future__ import annotations

import random

from seq2serve.runtime.attention.triton_backend import packed_int32


def test_every_view_is_16_byte_aligned_and_holds_its_values():
    rng = random.Random(0)
    for _ in range(200):
        parts = [[rng.randrange(1000) for _ in range(rng.randrange(0, 13))] for _ in range(4)]
        views = packed_int32(parts, "cpu")
        assert [v.tolist() for v in views] == parts
        assert all(v.data_ptr() % 16 == 0 for v in views if v.numel())
