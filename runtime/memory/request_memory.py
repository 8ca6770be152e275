"""The one place that allocates and frees a request's memory in every pool."""

from __future__ import annotations

import torch

from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool
from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool
from seq2serve.runtime.req import Req


class RequestMemory:
    """Ownership contract: a request owns its `req_pool_idx`, its `kv_pages` and its
    `cross_kv` handle from `admit` until `release`. Only this class touches the allocators,
    so `check` can account for every slot: free + owned by live requests = total.
    """

    def __init__(self, req_to_token: ReqToTokenPool, token_to_kv: TokenToKVPool,
                 cross_kv: CrossKVPool | None) -> None:
        self.req_to_token = req_to_token
        self.token_to_kv = token_to_kv
        self.cross_kv = cross_kv
        self.page_size = token_to_kv.page_size

    # --- sizes -------------------------------------------------------------------------------
    def pages_to_grow(self, req: Req, new_len: int) -> int:
        return max(0, self.token_to_kv.pages_for(new_len) - len(req.kv_pages))

    def fits_alone(self, encoder_len: int, max_decoder_len: int) -> str | None:
        """Why a request of these sizes could never run, even alone; None if it can."""
        if max_decoder_len > self.req_to_token.max_context_len:
            return (f"decoder length {max_decoder_len} exceeds the context length "
                    f"{self.req_to_token.max_context_len}")
        if max_decoder_len > self.token_to_kv.capacity_tokens:
            return (f"decoder length {max_decoder_len} exceeds the KV pool "
                    f"({self.token_to_kv.capacity_tokens} tokens)")
        if encoder_len:
            if encoder_len > self.req_to_token.max_encoder_len:
                return (f"encoder input of {encoder_len} tokens exceeds max_encoder_len "
                        f"{self.req_to_token.max_encoder_len}")
            if self.cross_kv is None or encoder_len > self.cross_kv.capacity_tokens:
                cap = 0 if self.cross_kv is None else self.cross_kv.capacity_tokens
                return f"encoder input of {encoder_len} tokens exceeds the cross-KV pool ({cap})"
        return None

    # --- allocation --------------------------------------------------------------------------
    def admit(self, req: Req, reserve_pages: int = 0) -> bool:
        """Give `req` a table row, its cross K/V slots and decoder pages for its whole current
        sequence, keeping `reserve_pages` free for others. All or nothing."""
        need_pages = self.pages_to_grow(req, req.seq_len)
        if self.token_to_kv.allocator.num_free < need_pages + reserve_pages:
            return False
        need_cross = req.encoder_len > 0 and req.cross_kv is None
        if need_cross and (self.cross_kv.allocator.num_free
                           < self.cross_kv.pages_for(req.encoder_len)):
            return False
        if self.req_to_token.num_free == 0:
            return False
        req.req_pool_idx = self.req_to_token.alloc()
        req.kv_pages.extend(self.token_to_kv.allocator.alloc(need_pages))
        if need_cross:
            req.cross_kv = self.cross_kv.alloc(req.encoder_len)
        if req.cross_kv is not None:
            row = self.req_to_token.req_to_cross[req.req_pool_idx]
            row[: req.encoder_len] = req.cross_kv.loc.to(row.device)
        req.kv_len = 0
        return True

    def alloc_tokens(self, req: Req, new_len: int) -> torch.Tensor | None:
        """Slots for decoder positions [req.kv_len, new_len) (CPU int32), growing the request's
        pages as needed; None (and nothing allocated) when the pool is short."""
        grow = self.pages_to_grow(req, new_len)
        if grow:
            pages = self.token_to_kv.allocator.alloc(grow)
            if pages is None:
                return None
            req.kv_pages.extend(pages)
        slots = self.token_to_kv.slots(req.kv_pages, req.kv_len, new_len)
        req.kv_len = new_len
        return slots

    def release(self, req: Req, keep_cross: bool = False) -> None:
        """Free the request's decoder memory (and its cross K/V unless `keep_cross`)."""
        if req.kv_pages:
            self.token_to_kv.allocator.free(req.kv_pages)
            req.kv_pages = []
        req.kv_len = 0
        if req.req_pool_idx is not None:
            self.req_to_token.free(req.req_pool_idx)
            req.req_pool_idx = None
        if req.cross_kv is not None and not keep_cross:
            self.cross_kv.free(req.cross_kv)
            req.cross_kv = None

    # --- integrity ---------------------------------------------------------------------------
    def check(self, live: list[Req]) -> None:
        """Raise AssertionError unless free + owned by `live` = total, in every pool."""
        self.req_to_token.check([r.req_pool_idx for r in live if r.req_pool_idx is not None])
        self.token_to_kv.allocator.check([p for r in live for p in r.kv_pages])
        if self.cross_kv is not None:
            handles = {id(r.cross_kv): r.cross_kv for r in live if r.cross_kv is not None}
            self.cross_kv.allocator.check([p for h in handles.values() for p in h.pages])

    def usage(self) -> dict[str, float]:
        out = {"kv_used_tokens": self.token_to_kv.allocator.num_used * self.page_size,
               "kv_total_tokens": self.token_to_kv.capacity_tokens}
        if self.cross_kv is not None:
            out["cross_used_tokens"] = self.cross_kv.allocator.num_used * self.cross_kv.page_size
            out["cross_total_tokens"] = self.cross_kv.capacity_tokens
        return out
