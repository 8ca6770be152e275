"""Programmatic dependent launch (Hopper, sm_90+): a kernel may start while the one before it
finishes, doing what does not depend on it (a GEMV streams its weights) until `gdc_wait()`,
which returns once the previous kernel has completed and its writes are visible.

At batch 1 a decode step is ~250 small kernels in a row, each mostly launch latency and a
memory round trip; overlapping each one's start with the previous one's end is where the
remaining time is. The contract for a kernel launched with `pdl_launch()`: touch no memory
another kernel writes (activations, outputs, caches) before `gdc_wait()` — only weights.
Off unless SEQ2SERVE_PDL=1 and the GPU and Triton support it.
"""

from __future__ import annotations

import functools
import os

import triton

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # an older Triton: never called (pdl_enabled() is False)
    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


@functools.cache
def pdl_enabled() -> bool:
    if os.environ.get("SEQ2SERVE_PDL", "0") != "1" or os.environ.get("TRITON_INTERPRET"):
        return False
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in CUDAOptions.__dataclass_fields__


def pdl_launch() -> dict:
    """Launch options of a PDL kernel (none when PDL is off)."""
    return {"launch_pdl": True} if pdl_enabled() else {}


__all__ = ["gdc_launch_dependents", "gdc_wait", "pdl_enabled", "pdl_launch"]
