"""ZMQ IPC endpoints between the processes, and the small helpers every process uses."""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass

import zmq


@dataclass(frozen=True)
class IpcNames:
    scheduler_input: str  # tokenizer manager -> scheduler
    detokenizer_input: str  # scheduler -> detokenizer
    tokenizer_input: str  # detokenizer -> tokenizer manager

    @classmethod
    def new(cls) -> IpcNames:
        base = os.path.join(tempfile.gettempdir(), f"seq2serve-{uuid.uuid4().hex[:12]}")
        return cls(f"ipc://{base}-sched", f"ipc://{base}-detok", f"ipc://{base}-tok")

    def cleanup(self) -> None:
        for name in (self.scheduler_input, self.detokenizer_input, self.tokenizer_input):
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
