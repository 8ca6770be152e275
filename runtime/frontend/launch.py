"""Starting, watching and stopping the scheduler and detokenizer processes.

Children are fresh interpreters (`python -m seq2serve.runtime.frontend.child`), not multiprocessing
spawns: they never re-import the caller's __main__, so a plain script, a notebook or a
REPL can start an engine without an `if __name__ == "__main__"` guard.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.messages.ipc import IpcNames

logger = logging.getLogger(__name__)


@dataclass
class ChildProcess:
    name: str
    proc: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.proc.pid

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.proc.poll()


@dataclass
class RuntimeProcesses:
    ipc: IpcNames
    scheduler: ChildProcess
    detokenizer: ChildProcess
    info: dict[str, Any]  # what the scheduler reported when ready

    @property
    def children(self) -> list[ChildProcess]:
        return [self.scheduler, self.detokenizer]

    def dead_child(self) -> str | None:
        """A message naming the child process that has died, or None while all run."""
        for c in self.children:
            if not c.is_alive():
                return f"the {c.name} process (pid {c.pid}) died with exit code {c.exitcode}"
        return None

    def shutdown(self, timeout: float = 5.0) -> None:
        _stop(self.children, timeout)
        self.ipc.cleanup()


def launch_processes(args: ServerArgs) -> RuntimeProcesses:
    """Start both children and wait until they are ready. A child's start-up error (say, a
    model directory without weights) is raised here with its message (ValueError stays one)."""
    ipc = IpcNames.new()
    started: list[tuple[ChildProcess, int]] = []
    try:
        for name in ("scheduler", "detokenizer"):
            started.append(_start(name, args, ipc))
        info: dict[str, Any] = {}
        for child, ready_fd in started:
            info.update(_wait_ready(child, ready_fd).get("info", {}))
    except BaseException:
        _stop([c for c, _ in started], timeout=2.0)
        ipc.cleanup()
        raise
    finally:
        for _, fd in started:
            os.close(fd)
    return RuntimeProcesses(ipc, started[0][0], started[1][0], info)


def _start(name: str, args: ServerArgs, ipc: IpcNames) -> tuple[ChildProcess, int]:
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq2serve.runtime.frontend.child", name],
        stdin=subprocess.PIPE, pass_fds=(write_fd,),
    )
    os.close(write_fd)
    proc.stdin.write(pickle.dumps({"args": args, "ipc": ipc, "ready_fd": write_fd,
                                   "parent_pid": os.getpid()}))
    proc.stdin.close()
    return ChildProcess(name, proc), read_fd


def _wait_ready(child: ChildProcess, fd: int) -> dict[str, Any]:
    data = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
        elif not child.is_alive():
            break
    if not data:
        raise RuntimeError(f"the {child.name} process exited during start-up "
                           f"(exit code {child.exitcode})")
    msg = pickle.loads(data)
    if msg["status"] != "ready":
        logger.debug("%s start-up failed:\n%s", child.name, msg.get("traceback", ""))
        exc = ValueError if msg.get("type") == "ValueError" else RuntimeError
        raise exc(msg["message"])
    return msg


def _stop(children: list[ChildProcess], timeout: float) -> None:
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
