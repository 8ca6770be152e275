"""Where each data-parallel replica runs: its GPUs, its environment, its share of the host.

A replica is one scheduler process (which may run tensor-parallel ranks of its own: it gets
`tp_size` GPUs and the server args unchanged). On CUDA, replica i sees only its own GPUs
(`CUDA_VISIBLE_DEVICES`, sliced from the caller's), so inside it `cuda` means its first GPU,
as with one replica. On the CPU the replicas share the host: each plans its pools from
1/dp_size of `mem_fraction` and runs cores/dp_size threads. With dp_size 1 nothing changes:
the scheduler gets the caller's environment and args as they are.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from seq2serve.runtime.config.server_args import ServerArgs


@dataclass(frozen=True)
class ReplicaPlacement:
    index: int
    args: ServerArgs  # what its scheduler is started with
    env: dict[str, str]  # set in its environment, over the caller's
    gpus: tuple[str, ...]  # its GPUs as the caller's CUDA_VISIBLE_DEVICES names them; () on CPU


def plan_replicas(args: ServerArgs, environ: dict[str, str] | None = None,
                  gpu_count: int | None = None) -> list[ReplicaPlacement]:
    """One placement per replica. ValueError if the host has too few GPUs for the layout.
    `environ` and `gpu_count` default to this process's (tests pass their own)."""
    environ = dict(os.environ) if environ is None else environ
    dp = args.dp_size
    if dp == 1:
        return [ReplicaPlacement(0, args, {}, ())]
    if not _on_cuda(args, gpu_count):
        threads = environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // dp))
        shared = dataclasses.replace(args, mem_fraction=args.mem_fraction / dp)
        return [ReplicaPlacement(i, _own_port(shared, i), {"OMP_NUM_THREADS": threads}, ())
                for i in range(dp)]
    per = getattr(args, "tp_size", 1)  # a tensor-parallel replica takes tp_size GPUs
    gpus = _visible_gpus(environ, gpu_count)
    if len(gpus) < dp * per:
        raise ValueError(f"dp_size {dp} replicas of {per} GPU(s) each need {dp * per} GPUs, "
                         f"{len(gpus)} visible ({', '.join(gpus) or 'none'})")
    out = []
    for i in range(dp):
        mine = tuple(gpus[i * per:(i + 1) * per])
        out.append(ReplicaPlacement(i, _own_port(args, i),
                                    {"CUDA_VISIBLE_DEVICES": ",".join(mine)}, mine))
    return out


def _own_port(args: ServerArgs, index: int) -> ServerArgs:
    """Replica i's tensor-parallel ranks meet on dist_init_port + i (each replica is its own
    process group)."""
    if getattr(args, "dist_init_port", None) is None or index == 0:
        return args
    return dataclasses.replace(args, dist_init_port=args.dist_init_port + index)


def _on_cuda(args: ServerArgs, gpu_count: int | None) -> bool:
    if args.device is not None:
        return args.device.startswith("cuda")
    if gpu_count is not None:
        return gpu_count > 0
    import torch

    return torch.cuda.is_available()


def _visible_gpus(environ: dict[str, str], gpu_count: int | None) -> list[str]:
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    if gpu_count is None:
        import torch

        gpu_count = torch.cuda.device_count()
    return [str(i) for i in range(gpu_count)]
