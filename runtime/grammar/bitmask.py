"""The token bitmask's two ends: allocated and filled on the host, applied on the device.

xgrammar's layout: int32 words, bit t % 32 of word t // 32 set when token t is allowed. The
mask is applied by xgrammar's own kernel (C++ on a CPU, CUDA or Triton on a GPU), in place on
the rows named: 5 ms for 9 rows of Llama 3's 128k logits on one CPU core, where unpacking the
bits with tensor ops took 45 ms. Under tensor parallelism every rank applies the same mask to
the same gathered logits.
"""

from __future__ import annotations

import torch
import xgrammar as xgr

WORD_BITS = 32


def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """A host bitmask of `rows` rows with no token allowed (pinned on a CUDA host: its copy
    to the device is queued without waiting)."""
    words = (vocab_size + WORD_BITS - 1) // WORD_BITS
    return torch.zeros(rows, words, dtype=torch.int32,
                       pin_memory=torch.cuda.is_available())


class _Ring:
    """A few pinned bitmasks used in turn (a step's fresh pinned tensor cost ~0.15 ms): the
    host fills the next one only after it read the step that used the one before (its copy
    to the device and its sampler had run), so with four the one refilled is long done."""

    def __init__(self, size: int = 4) -> None:
        self.buffers: list[torch.Tensor | None] = [None] * size
        self.turn = 0

    def take(self, rows: int, words: int) -> torch.Tensor:
        self.turn = (self.turn + 1) % len(self.buffers)
        buf = self.buffers[self.turn]
        if buf is None or buf.shape[0] < rows or buf.shape[1] != words:
            buf = torch.zeros(max(rows, 64), words, dtype=torch.int32,
                              pin_memory=torch.cuda.is_available())
            self.buffers[self.turn] = buf
        return buf[:rows]


_ring = _Ring()


def step_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """A step's bitmask of `rows` rows, reused: only the rows its grammar rows fill (each in
    full) are meaningful; the others hold an earlier step's bits and are never read."""
    return _ring.take(rows, (vocab_size + WORD_BITS - 1) // WORD_BITS)


def apply_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """Set the disallowed tokens of the batch rows `rows` to -inf, in place (`bitmask` has a
    row per batch row; only those named are read)."""
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1],
                                    indices=None if len(rows) == logits.shape[0] else rows)
