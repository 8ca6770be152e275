"""Starting, watching and stopping the scheduler and detokenizer processes (one scheduler per
data-parallel replica, `--dp-size`; one detokenizer for all of them).

Children are fresh interpreters (`python -m seq2serve.runtime.frontend.child`), not multiprocessing
spawns: they never re-import the caller's __main__, so a plain script, a notebook or a
REPL can start an engine without an `if __name__ == "__main__"` guard.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.frontend.replica_layout import plan_replicas
from seq2serve.runtime.messages.ipc import IpcNames
from seq2serve.runtime.messages.model_limits import ModelLimits

logger = logging.getLogger(__name__)


@dataclass
class ChildProcess:
    name: str
    proc: subprocess.Popen
    replica: int | None = None  # a data-parallel replica's scheduler: its index

    @property
    def pid(self) -> int:
        return self.proc.pid

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.proc.poll()

    @property
    def label(self) -> str:
        """How messages name it: the scheduler process (of replica 1, with several)."""
        of = "" if self.replica is None else f" of replica {self.replica}"
        return f"the {self.name} process{of}"


@dataclass
class RuntimeProcesses:
    ipc: IpcNames
    schedulers: list[ChildProcess]  # one per data-parallel replica
    detokenizer: ChildProcess
    # what the scheduler reported when ready; with several replicas, replica 0's with each
    # request limit the strictest of all (a request any replica could refuse is refused)
    info: dict[str, Any]
    replicas: list[dict[str, Any]] = field(default_factory=list)  # each replica's own report

    @property
    def scheduler(self) -> ChildProcess:
        return self.schedulers[0]

    @property
    def children(self) -> list[ChildProcess]:
        return [*self.schedulers, self.detokenizer]

    def dead_child(self) -> str | None:
        """A message naming the child process that has died, or None while all run."""
        for c in self.children:
            if not c.is_alive():
                return f"{c.label} (pid {c.pid}) died with exit code {c.exitcode}"
        return None

    def layout(self) -> dict[str, Any]:
        """The replicas (a scheduler each), their processes and devices: /debug/stats."""
        return {"dp_size": len(self.schedulers),
                "replicas": [{"replica": i, "pid": c.pid, "device": r.get("device"),
                              "gpus": r.get("gpus", [])}
                             for i, (c, r) in enumerate(zip(self.schedulers, self.replicas))]}

    def describe_layout(self) -> str:
        """The replicas and their devices, for the start-up line ("" with one replica)."""
        if len(self.schedulers) == 1:
            return ""
        where = ", ".join(f"{r['replica']}: {r['device']}"
                          + (f" (GPU {','.join(r['gpus'])})" if r["gpus"] else "")
                          for r in self.layout()["replicas"])
        return f"{len(self.schedulers)} data-parallel replicas ({where})"

    def shutdown(self, timeout: float = 5.0) -> None:
        stop_children(self.children, timeout)
        self.ipc.cleanup()


def launch_processes(args: ServerArgs) -> RuntimeProcesses:
    """Start the children (one scheduler per data-parallel replica and the detokenizer) and
    wait until they are ready. A child's start-up error (say, a model directory without
    weights) is raised here with its message (ValueError stays one)."""
    placements = plan_replicas(args)
    ipc = IpcNames.new(len(placements), args.api_server_count)
    several = len(placements) > 1
    started: list[tuple[ChildProcess, int]] = []
    try:
        for p in placements:
            started.append(start_child("scheduler", p.args, ipc.for_replica(p.index), p.env,
                                  p.index if several else None))
        started.append(start_child("detokenizer", args, ipc))
        reports = [wait_ready(child, fd).get("info", {}) for child, fd in started]
    except BaseException:
        stop_children([c for c, _ in started], timeout=2.0)
        ipc.cleanup()
        raise
    finally:
        for _, fd in started:
            os.close(fd)
    replicas = [{**info, "gpus": list(p.gpus)} for info, p in zip(reports, placements)]
    info = _combined(replicas)
    info.update(reports[-1])  # the detokenizer's (nothing today)
    return RuntimeProcesses(ipc, [c for c, _ in started[:-1]], started[-1][0], info, replicas)


def _combined(replicas: list[dict[str, Any]]) -> dict[str, Any]:
    info = {k: v for k, v in replicas[0].items() if k != "gpus"}
    for f in dataclasses.fields(ModelLimits):
        if f.type == "int":  # sizes: the smallest replica's
            info[f.name] = min(r[f.name] for r in replicas)
    if len(replicas) > 1:
        info["dp_size"] = len(replicas)
    return info


def start_child(name: str, args: ServerArgs, ipc: IpcNames, env: dict[str, str] | None = None,
                replica: int | None = None, extra: dict[str, Any] | None = None,
                pass_fds: tuple[int, ...] = (),
                new_session: bool = False) -> tuple[ChildProcess, int]:
    """Start child `name` (child.py's kinds); returns it and the fd its ready report comes
    on (`wait_ready`). `extra`: more keyword arguments of its run function; `pass_fds`: more
    fds it inherits; `new_session`: out of the terminal's process group (its Ctrl-C)."""
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq2serve.runtime.frontend.child", name],
        stdin=subprocess.PIPE, pass_fds=(write_fd, *pass_fds),
        env={**os.environ, **env} if env else None, start_new_session=new_session,
    )
    os.close(write_fd)
    proc.stdin.write(pickle.dumps({"args": args, "ipc": ipc, "ready_fd": write_fd,
                                   "parent_pid": os.getpid(), "extra": extra or {}}))
    proc.stdin.close()
    return ChildProcess(name, proc, replica), read_fd


def wait_ready(child: ChildProcess, fd: int) -> dict[str, Any]:
    """The child's ready report (a start-up error raised with its message). The report is
    whole once it unpickles: the pipe may stay open after it (an HTTP process's forked
    body-parsing workers hold its end)."""
    data = b""
    msg = None
    while msg is None:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
            msg = _whole(data)
        elif not child.is_alive():
            break
    if msg is None:
        raise RuntimeError(f"{child.label} exited during start-up "
                           f"(exit code {child.exitcode})")
    if msg["status"] != "ready":
        logger.debug("%s start-up failed:\n%s", child.label, msg.get("traceback", ""))
        exc = ValueError if msg.get("type") == "ValueError" else RuntimeError
        raise exc(msg["message"])
    return msg


def _whole(data: bytes) -> dict[str, Any] | None:
    try:
        return pickle.loads(data)
    except (EOFError, pickle.UnpicklingError):
        return None


def stop_children(children: list[ChildProcess], timeout: float) -> None:
    for c in children:
        if c.is_alive():
            c.proc.terminate()
    deadline = time.monotonic() + timeout
    for c in children:
        try:
            c.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait(2.0)
