"""Dedicated slots for cross-attention K/V: written once by the encoder stage, read every step."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from seq2serve.runtime.memory.token_to_kv_pool import PagedKVBuffers


@dataclass(eq=False)
class CrossKVHandle:
    """The pages holding one encoder output's cross K/V (all cross-attention layers)."""

    pages: list[int]
    length: int  # encoder tokens
    loc: torch.Tensor = field(repr=False)  # CPU int32 slot index of each encoder position
    ready: bool = False  # set once the encoder stage has written the K/V


class CrossKVPool(PagedKVBuffers):
    """K/V of every cross-attention layer, in pages of encoder tokens.

    Ownership contract: `alloc` returns a handle owned by the caller (a request, later the
    encoder cache) until it passes it to `free` exactly once.
    """

    def alloc(self, num_tokens: int) -> CrossKVHandle | None:
        pages = self.allocator.alloc(self.pages_for(num_tokens))
        if pages is None:
            return None
        return CrossKVHandle(pages=pages, length=num_tokens, loc=self.slots(pages, 0, num_tokens))

    def free(self, handle: CrossKVHandle) -> None:
        self.allocator.free(handle.pages)
        handle.pages = []
