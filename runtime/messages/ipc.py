"""ZMQ IPC endpoints between the processes, and the small helpers every process uses."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import uuid
from dataclasses import dataclass

import zmq


@dataclass(frozen=True)
class IpcNames:
    # tokenizer manager -> each data-parallel replica's scheduler (one without --dp-size)
    scheduler_inputs: tuple[str, ...]
    detokenizer_input: str  # every scheduler -> detokenizer
    # detokenizer -> each HTTP process's tokenizer manager (one without --api-server-count)
    tokenizer_inputs: tuple[str, ...]

    @classmethod
    def new(cls, dp_size: int = 1, api_servers: int = 1) -> IpcNames:
        base = os.path.join(tempfile.gettempdir(), f"seq2serve-{uuid.uuid4().hex[:12]}")
        inputs = ((f"ipc://{base}-sched",) if dp_size == 1
                  else tuple(f"ipc://{base}-sched{i}" for i in range(dp_size)))
        outputs = ((f"ipc://{base}-tok",) if api_servers == 1
                   else tuple(f"ipc://{base}-tok{i}" for i in range(api_servers)))
        return cls(inputs, f"ipc://{base}-detok", outputs)

    @property
    def tokenizer_input(self) -> str:
        """The input of the one tokenizer manager these names are for."""
        assert len(self.tokenizer_inputs) == 1, "names of several HTTP processes: pick one"
        return self.tokenizer_inputs[0]

    def for_api_server(self, i: int) -> IpcNames:
        """The names as HTTP process i's tokenizer manager sees them: its own input."""
        return dataclasses.replace(self, tokenizer_inputs=(self.tokenizer_inputs[i],))

    @property
    def scheduler_input(self) -> str:
        """The input of the one scheduler these names are for (a replica's view has one)."""
        assert len(self.scheduler_inputs) == 1, "names of several replicas: pick one first"
        return self.scheduler_inputs[0]

    def for_replica(self, i: int) -> IpcNames:
        """The names as replica i's scheduler sees them: its own input, the shared rest."""
        return dataclasses.replace(self, scheduler_inputs=(self.scheduler_inputs[i],))

    def cleanup(self) -> None:
        for name in (*self.scheduler_inputs, self.detokenizer_input, *self.tokenizer_inputs):
            try:
                os.unlink(name.removeprefix("ipc://"))
            except OSError:
                pass


def socket(ctx: zmq.Context, kind: int, endpoint: str, bind: bool) -> zmq.Socket:
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    if kind == zmq.PUSH:
        s.setsockopt(zmq.SNDHWM, 0)
    if kind == zmq.PULL:
        s.setsockopt(zmq.RCVHWM, 0)
    (s.bind if bind else s.connect)(endpoint)
    return s


def parent_alive(parent_pid: int) -> bool:
    """False once the process that started us has gone (we were re-parented)."""
    return os.getppid() == parent_pid
