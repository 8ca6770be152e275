"""Host tensors onto the model's device without stalling the host.

`tensor.to("cuda", non_blocking=True)` from pageable memory is not asynchronous: the driver
stages it and the host waits until the copy is done, which is after every kernel queued
before it on the stream (an encoder batch's audio or pixels waited behind the decode steps and
encoder layers already launched). From pinned memory the copy is queued like a kernel and the
host goes on. Pinning goes through torch's caching host allocator, so a repeated batch size
costs one host memcpy, not a new page-locked allocation."""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """`t` on `device`: through pinned memory when that is a GPU and `t` is on the host."""
    if torch.device(device).type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)
