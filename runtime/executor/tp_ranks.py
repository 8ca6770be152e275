"""Tensor parallelism's processes: rank 0 is the scheduler's process, ranks 1..N-1 are
started here, one process each, and run every forward rank 0 runs, on their shard.

Rank 0's `ModelWorker` sends each step's batch before running it (`TensorParallelRanks.send`,
over a `BatchChannel`) with the device writes its scheduler made since the last one (the
pools' `DeviceLog`); a rank replays the writes, then runs the same `encode` or `forward` on
its `ModelRunner`: the parallel layers meet in the same collectives in the same order. Every
rank samples from the same full logits with the same seeded generator; only rank 0's tokens
reach the host, and the next step's input tokens come from rank 0 with its batch.

A rank that dies takes the scheduler with it (`_watch`: logged, exit code 1), which the
frontend reports as a dead scheduler; a rank whose scheduler has gone exits.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from seq2serve.models import parallel_state
from seq2serve.models.loader import check_tensor_parallel
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.executor.batch_channel import BatchChannel
from seq2serve.runtime.memory.device_log import DeviceLog, replay
from seq2serve.runtime.memory.host_kv_pool import host_pools

logger = logging.getLogger(__name__)

# an idle server sends nothing for as long as it is idle: the ranks' wait must not time out
_IDLE_TIMEOUT = timedelta(days=365)
_WATCH_S = 0.2


def rank_device(device: str, rank: int) -> str:
    """Rank r's device: the r-th GPU after the one `device` names; the CPU for every rank."""
    if not device.startswith("cuda"):
        return device
    index = int(device.partition(":")[2] or 0) + rank
    if index >= torch.cuda.device_count():
        raise ValueError(f"tensor parallelism: rank {rank} needs cuda:{index}, but this host "
                         f"has {torch.cuda.device_count()} GPU(s)")
    return f"cuda:{index}"


def init_tensor_parallel(rank: int, size: int, init_method: str, device: str) -> None:
    """Join the ranks' process groups (NCCL on CUDA, gloo on the CPU; host messages always
    over gloo) and make this process's parallel layers use them."""
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    else:  # the ranks share the host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                            timeout=_IDLE_TIMEOUT)
    group = dist.group.WORLD
    cpu_group = group if backend == "gloo" else dist.new_group(backend="gloo",
                                                               timeout=_IDLE_TIMEOUT)
    parallel_state.set_tensor_parallel(rank, size, group, cpu_group)
    if backend == "nccl":  # the communicator is made now, before any CUDA graph captures it
        dist.all_reduce(torch.zeros(1, device=device), group=group)
        torch.cuda.synchronize()


class TensorParallelRanks:
    """Rank 0's side: the other ranks' processes and the channel to them."""

    def __init__(self, args: ServerArgs, model_config: ModelConfig) -> None:
        size = args.tp_size
        check_tensor_parallel(model_config, size)  # a clear refusal before anything starts
        device = rank_device(args.resolved_device(), 0)
        rank_device(device, size - 1)  # enough GPUs
        init_method = f"tcp://127.0.0.1:{rendezvous_port(args.dist_init_port)}"
        ctx = mp.get_context("spawn")
        self.procs = [ctx.Process(target=run_rank, name=f"tp-rank-{r}", daemon=True,
                                  args=(r, size, init_method, args, model_config, os.getpid()))
                      for r in range(1, size)]
        for p in self.procs:
            p.start()
        self.stopping = False
        # runs before multiprocessing's own exit handler terminates the ranks (registered
        # later, called first): a rank stopped at exit is not a rank that died
        atexit.register(self.stop)
        threading.Thread(target=self._watch, name="tp-watch", daemon=True).start()
        init_tensor_parallel(0, size, init_method, device)
        self.channel = BatchChannel(parallel_state.tensor_parallel(), device)
        self.log = DeviceLog()
        logger.info("tensor parallel: %d ranks (rank 0 here, pids %s)", size,
                    [p.pid for p in self.procs])

    def mirror(self, pools: dict) -> None:
        """Record the scheduler's writes to rank 0's `pools` for the other ranks."""
        for name, pool in pools.items():
            if pool is not None:
                pool.log, pool.name = self.log, name

    def send(self, kind: str, batch: object) -> None:
        self.channel.send((kind, self.log.take(), batch))

    def stop(self) -> None:
        self.stopping = True
        for p in self.procs:
            p.terminate()

    def _watch(self) -> None:
        while not self.stopping:
            for r, p in enumerate(self.procs, start=1):
                if p.exitcode is not None and not self.stopping:
                    logger.error("tensor-parallel rank %d (pid %d) died with exit code %s: "
                                 "the scheduler exits", r, p.pid, p.exitcode)
                    logging.shutdown()
                    os._exit(1)
            time.sleep(_WATCH_S)


def run_rank(rank: int, size: int, init_method: str, args: ServerArgs,
             model_config: ModelConfig, parent_pid: int) -> None:
    """A rank's process: load its shard, then run what rank 0 sends until it goes."""
    from seq2serve.runtime.executor.model_runner import ModelRunner

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the scheduler: rank 0 decides
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format=f"%(asctime)s tp-rank-{rank} %(name)s: %(message)s")
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    device = rank_device(args.resolved_device(), rank)
    init_tensor_parallel(rank, size, init_method, device)
    runner = ModelRunner(args, model_config, device)
    channel = BatchChannel(parallel_state.tensor_parallel(), runner.device)
    # the host tier's pools, as the scheduler makes rank 0's (the same pages on every rank)
    host_kv, host_cross = host_pools(args.host_cache_gb, runner.token_to_kv_pool,
                                     runner.cross_kv_pool)
    pools = {**runner.pools, "host_token_to_kv": host_kv, "host_cross_kv": host_cross}
    while True:
        try:
            kind, records, batch = channel.recv()
        except RuntimeError as e:  # the collective's peer closed: rank 0 has gone
            logger.debug("tp-rank-%d: rank 0 has gone (%s); exiting", rank, e)
            os._exit(0)
        replay(records, pools)
        if kind == "encode":
            runner.encode(batch)
        elif kind == "forward":
            runner.forward(batch)
        else:
            raise AssertionError(f"unknown tensor-parallel message {kind!r}")


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def rendezvous_port(port: int | None) -> int:
    """The port rank 0 binds for the ranks' rendezvous: `--dist-init-port` when given (a
    ValueError naming it when something else holds it, before any rank starts), else a free
    one the OS picks."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port or 0))
        except OSError as e:
            raise ValueError(f"dist_init_port {port} (the tensor-parallel ranks' rendezvous on "
                             f"127.0.0.1) is in use: {e.strerror}; choose another with "
                             f"--dist-init-port, or leave it unset for a free one") from None
        return s.getsockname()[1]
