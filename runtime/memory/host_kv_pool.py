"""HostKVPool: the host-memory tier of a paged K/V pool (decoder KV or cross K/V).

Pages evicted from a device pool are copied here and copied back on a later hit, instead of
recomputing a prefix or an encoder output. On CUDA the buffer is pinned and both copies are
queued on the current stream without waiting (`non_blocking`): the stream orders them after
the forwards that wrote the pages and before any that reuse them, so the host never waits.
On the CPU it is a plain second pool.

Ownership contract: as `PageAllocator`: a host page from `alloc` belongs to the caller (a
cache) until it passes it to `free` exactly once.
"""

from __future__ import annotations

import torch

from seq2serve.runtime.memory.device_log import DeviceLog
from seq2serve.runtime.memory.page_allocator import PageAllocator
from seq2serve.runtime.memory.token_to_kv_pool import PagedKVBuffers


class HostKVPool:
    def __init__(self, device_pool: PagedKVBuffers, num_pages: int) -> None:
        self.device_pool = device_pool
        p = device_pool
        self.page_size = p.page_size
        self.allocator = PageAllocator(num_pages)
        pin = p._k.is_cuda
        # page-major ([page, layer, slot, head, dim]): a page is one contiguous block, one copy
        shape = (num_pages, p.num_layers, p.page_size, p.num_kv_heads, p.head_dim)
        self.k = torch.zeros(shape, dtype=p.dtype, pin_memory=pin)
        self.v = torch.zeros(shape, dtype=p.dtype, pin_memory=pin)
        self.log: DeviceLog | None = None  # tensor parallelism: the copies to replay elsewhere
        self.name = ""  # the pool's name in `log`'s records (its owner sets both)

    @staticmethod
    def page_bytes(device_pool: PagedKVBuffers) -> int:
        p = device_pool
        return 2 * p.num_layers * p.page_size * p.num_kv_heads * p.head_dim * p.dtype.itemsize

    def free(self, pages: list[int]) -> None:
        self.allocator.free(pages)

    def _device_pages(self, buf: torch.Tensor, pages: list[int]) -> torch.Tensor:
        """[len(pages), layer, slot, head, dim] view-order gather of device pages."""
        ps, L = self.page_size, buf.shape[0]
        idx = torch.tensor(pages, device=buf.device)
        blocks = buf.view(L, -1, ps, *buf.shape[2:])[:, idx]  # [L, n, ps, H, D]
        return blocks.transpose(0, 1).contiguous()

    def store(self, device_pages: list[int], host_pages: list[int]) -> None:
        """Queue the copy of `device_pages` (every layer, K and V) into `host_pages`."""
        if self.log is not None:
            self.log.record(self.name, "store", list(device_pages), list(host_pages))
        p = self.device_pool
        for buf, host in ((p._k, self.k), (p._v, self.v)):
            blocks = self._device_pages(buf, device_pages)  # one gather on the device
            for i, hp in enumerate(host_pages):  # one async copy per page
                host[hp].copy_(blocks[i], non_blocking=True)

    def load(self, host_pages: list[int], device_pages: list[int]) -> None:
        """Queue the copy of `host_pages` back into `device_pages`."""
        if self.log is not None:
            self.log.record(self.name, "load", list(host_pages), list(device_pages))
        p = self.device_pool
        p.outside_writes += 1
        ps = self.page_size
        for buf, host in ((p._k, self.k), (p._v, self.v)):
            L = buf.shape[0]
            blocks = torch.empty((len(host_pages), *host.shape[1:]), dtype=host.dtype,
                                 device=buf.device)
            for i, hp in enumerate(host_pages):  # one async copy per page
                blocks[i].copy_(host[hp], non_blocking=True)
            idx = torch.tensor(device_pages, device=buf.device)
            buf.view(L, -1, ps, *buf.shape[2:])[:, idx] = blocks.transpose(0, 1)


def host_pools(gigabytes: float, *device_pools: PagedKVBuffers | None) -> list[HostKVPool | None]:
    """One host tier per device pool, `gigabytes` in equal shares among the pools present
    (their device sizes are no guide: a small cross pool evicts as often as a large decoder
    pool); None for a missing pool or with no budget."""
    present = [p for p in device_pools if p is not None]
    share = int(gigabytes * (1 << 30)) // max(len(present), 1)
    out: list[HostKVPool | None] = []
    for p in device_pools:
        pages = 0 if p is None else share // HostKVPool.page_bytes(p)
        out.append(HostKVPool(p, pages) if pages > 0 else None)
    return out
