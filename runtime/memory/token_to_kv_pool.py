"""Paged decoder self-attention K/V for every layer."""

from __future__ import annotations

import numpy as np
import torch

from seq2serve.runtime.memory.device_log import DeviceLog
from seq2serve.runtime.memory.page_allocator import PageAllocator


class PagedKVBuffers:
    """K and V buffers of shape [num_slots, num_kv_heads, head_dim] per layer, handed out in
    pages of `page_size` slots. Page 0 is a scratch page that is never allocated: padded
    entries of a batch (CUDA graphs) write there harmlessly.
    """

    def __init__(self, num_pages: int, page_size: int, num_layers: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: str) -> None:
        self.page_size = page_size
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.allocator = PageAllocator(num_pages, first_page=1)
        num_slots = (num_pages + 1) * page_size
        shape = (num_slots, num_kv_heads, head_dim)
        # zeros, not empty: on a CPU the pages of an untouched buffer are not resident yet, and
        # the server would seem to grow for hours as the caches fill them (a 20,000-request
        # soak: 620 -> 1,938 MB). Written once, the pools' memory is held from the start, as
        # on a GPU, and a host without it fails at start rather than under load.
        # one tensor per K and V for all layers (a layer's buffer is a view): copying slots in
        # every layer is one operation
        self._k = torch.zeros((num_layers, *shape), dtype=dtype, device=device)
        self._v = torch.zeros((num_layers, *shape), dtype=dtype, device=device)
        self.k_buffers, self.v_buffers = list(self._k.unbind(0)), list(self._v.unbind(0))
        self.log: DeviceLog | None = None  # tensor parallelism: the writes to replay elsewhere
        self.name = ""  # the pool's name in `log`'s records (its owner sets both)
        # writes made outside a forward (host-tier loads): a reader that keeps copies of
        # slots across forwards (the CPU backend's decode cross K/V) keys them on it
        self.outside_writes = 0

    @property
    def capacity_tokens(self) -> int:
        return self.allocator.num_pages * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def slots(self, pages: list[int], start: int, end: int) -> torch.Tensor:
        """Slot indices of positions [start, end) of a sequence stored in `pages` (CPU int32)."""
        ps = self.page_size  # (numpy: torch's per-op cost was 75 us a request's prompt)
        first = start // ps
        pos = np.arange(start, end, dtype=np.int32)
        page_ids = np.asarray(pages[first:-(-end // ps)], dtype=np.int32)[pos // ps - first]
        return torch.from_numpy(page_ids * ps + pos % ps)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """K/V of slots `src` copied to slots `dst` (host tensors), in every layer (a beam's
        copied page)."""
        if self.log is not None:
            self.log.record(self.name, "copy_slots", src, dst)
        device = self._k.device
        self.copy_slots_local(src.to(device, non_blocking=True), dst.to(device, non_blocking=True))

    def copy_slots_local(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """`copy_slots` on this rank only (a copy every rank's forward makes itself)."""
        for buf in (self._k, self._v):
            buf[:, dst] = buf[:, src]

    def copy_partial_pages(self, req_to_token: torch.Tensor, table_rows: torch.Tensor,
                           parents: torch.Tensor, shared_end: torch.Tensor,
                           copy_len: torch.Tensor, starts: torch.Tensor, max_beams: int) -> None:
        """A beam step's last-page copies in one kernel (`kernels/triton_beam_copy.beam_copy`,
        CUDA tensors), on this rank only: every tensor-parallel rank moves its own."""
        from seq2serve.runtime.kernels.triton_beam_copy import beam_copy

        beam_copy(self._k, self._v, req_to_token, table_rows, parents, shared_end, copy_len,
                  starts, max_beams)

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        k_buf, v_buf = self.k_buffers[layer_id], self.v_buffers[layer_id]
        if k.is_cuda and k.stride(1) == k.shape[2] and v.stride(1) == v.shape[2]:
            from seq2serve.runtime.kernels.triton_kv_store import store_kv

            store_kv(k_buf, v_buf, loc, k, v)  # one kernel for both
            return
        k_buf[loc] = k.to(self.dtype)
        v_buf[loc] = v.to(self.dtype)


class TokenToKVPool(PagedKVBuffers):
    """Decoder self-attention K/V; one page of decoder tokens at a time."""
