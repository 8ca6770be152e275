"""This process's tensor-parallel rank and the collectives the parallel layers call.

Set once per process, before the model is built (`set_tensor_parallel`, by the executor's
rank start-up); every parallel layer reads it at construction, as SGLang's and vLLM's
`get_tensor_model_parallel_*` do. Unset (the default, and every process at `tp_size` 1), the
size is 1: the layers are plain and no collective is ever called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None  # the device's process group (NCCL on CUDA, gloo on the CPU)
    cpu_group: Any = None  # gloo: host-side messages (the executor's batches, agreements)

    def shard(self, n: int, what: str) -> int:
        """This rank's share of `n` (heads, channels); a ValueError naming `what` if the
        ranks cannot share it evenly."""
        if n % self.size:
            raise ValueError(f"tp_size {self.size} does not divide the model's {n} {what}")
        return n // self.size


_TP = TensorParallel()


def set_tensor_parallel(rank: int, size: int, group: Any = None,
                        cpu_group: Any = None) -> None:
    global _TP
    _TP = TensorParallel(rank, size, group, cpu_group)


def tensor_parallel() -> TensorParallel:
    return _TP


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of each rank's partial `x` (row-parallel outputs), in place."""
    dist.all_reduce(x, group=_TP.group)
    return x


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """The elementwise maximum over ranks, in place (a row-parallel weight's row scales)."""
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=_TP.group)
    return x


def all_gather_last(x: torch.Tensor) -> torch.Tensor:
    """Each rank's slice of the last dimension, concatenated in rank order (vocab-parallel
    logits)."""
    parts = [torch.empty_like(x) for _ in range(_TP.size)]
    dist.all_gather(parts, x.contiguous(), group=_TP.group)
    return torch.cat(parts, dim=-1)
