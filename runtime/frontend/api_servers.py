"""Several HTTP processes on one port (`--api-server-count N`, vLLM's flag): the HTTP work
(parsing, tokenizing, SSE) spread over N cores in front of the same schedulers.

The main process starts the schedulers and the detokenizer as with one HTTP process, then N
HTTP processes (`python -m ...child api`: `http_server.run_api_server_process`), each a
whole FastAPI app with its own tokenizer manager, and supervises them; it serves nothing
itself. Each HTTP process binds the port with
SO_REUSEPORT, so the kernel shares new connections out among them. Request keys and control
tags carry their process's index (`request_ids.py`) and the detokenizer sends each output to
its process. What is per process: the connection limit (`--max-connections` is shared out),
the data-parallel router's counts and affinity (each process routes its own requests), the
uniqueness of a user's rids (an abort reaches the request whatever process it runs in).
`/metrics` adds up every process's counters and histograms (prometheus_client's multiprocess
mode, in a directory the main process makes and removes).

Signals: SIGINT / SIGTERM to the main process are passed on to every HTTP process, which
drains as one HTTP process does (a second signal stops at once); the HTTP processes run in
their own session, so a terminal's Ctrl-C reaches them once, through the main process. When a
scheduler or the detokenizer dies, the main process tells every HTTP process (a pipe each),
which answers 503 and ends its streams with an error for a second, as one process does; when
an HTTP process dies, the others are stopped too. Either way the exit code is 1.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.frontend.launch import (
    ChildProcess,
    RuntimeProcesses,
    start_child,
    stop_children,
    wait_ready,
)
from seq2serve.runtime.messages.ipc import IpcNames, parent_alive

logger = logging.getLogger(__name__)

_POLL_S = 0.2
_STOP_S = 10.0  # after a runtime child died: how long the HTTP processes get to wind down


def run_api_servers(args: ServerArgs, procs: RuntimeProcesses, startup_line: str) -> int:
    """Start `args.api_server_count` HTTP processes over `procs` and supervise them until
    they stop (0 after a signal, 1 when any process died or one could not start); print
    `startup_line` once they all serve. Each runs `http_server.run_api_server_process`."""
    n = args.api_server_count
    metrics_dir = tempfile.mkdtemp(prefix="seq2serve-metrics-")
    servers: list[ChildProcess] = []
    deaths: list[int] = []  # the write end of each HTTP process's death pipe
    signals: list[int] = []
    previous = {s: signal.signal(s, lambda sig, _: signals.append(sig))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        started = []
        for i in range(n):
            read_end, write_end = os.pipe()
            deaths.append(write_end)
            extra = {"server": i, "info": procs.info, "layout": procs.layout(),
                     "describe_layout": procs.describe_layout(), "death_fd": read_end}
            child, fd = start_child("api", args, procs.ipc.for_api_server(i),
                                    {"PROMETHEUS_MULTIPROC_DIR": metrics_dir}, extra=extra,
                                    pass_fds=(read_end,), new_session=True)
            os.close(read_end)
            child.name = f"HTTP server {i}"
            started.append((child, fd))
            servers.append(child)
        try:
            for child, fd in started:
                wait_ready(child, fd)
        finally:
            for _, fd in started:
                os.close(fd)
        print(startup_line, file=sys.stderr, flush=True)
        return _supervise(procs, servers, deaths, signals)
    finally:
        stop_children(servers, timeout=_STOP_S)
        for fd in deaths:
            os.close(fd)
        for s, handler in previous.items():
            signal.signal(s, handler)
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _supervise(procs: RuntimeProcesses, servers: list[ChildProcess], deaths: list[int],
               signals: list[int]) -> int:
    passed = 0
    while True:
        for sig in signals[passed:]:  # each signal once to each HTTP process
            for c in servers:
                if c.is_alive():
                    c.proc.send_signal(sig)
        passed = len(signals)
        if not any(c.is_alive() for c in servers):
            return 0 if all(c.exitcode == 0 for c in servers) else 1
        reason = procs.dead_child()
        if reason is not None:
            logger.error("%s; the server can no longer serve and will exit", reason)
            for fd in deaths:
                try:
                    os.write(fd, reason.encode()[:4096])
                except OSError:  # that HTTP process has gone already
                    pass
            _wait(servers, _STOP_S)
            return 1
        gone = next((c for c in servers if not c.is_alive()), None)
        if gone is not None and gone.exitcode != 0:
            logger.error("%s (pid %d) died with exit code %s; stopping the server",
                         gone.label, gone.pid, gone.exitcode)
            return 1
        time.sleep(_POLL_S)


def _wait(children: list[ChildProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(c.is_alive() for c in children) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


@dataclass
class RuntimeView:
    """What an HTTP process knows of the runtime's processes (`create_app`'s `procs`): their
    IPC names, the scheduler's report and layout; a child's death comes from the main
    process through `death_fd`."""

    ipc: IpcNames
    info: dict[str, Any]
    replica_layout: dict[str, Any]
    layout_line: str
    death_fd: int
    parent_pid: int

    @property
    def schedulers(self) -> list[None]:
        return [None] * self.replica_layout["dp_size"]

    def layout(self) -> dict[str, Any]:
        return self.replica_layout

    def describe_layout(self) -> str:
        return self.layout_line

    def dead_child(self) -> str | None:
        try:
            reason = os.read(self.death_fd, 4096)
        except BlockingIOError:
            reason = None
        if reason:
            return reason.decode(errors="replace")
        if reason == b"" or not parent_alive(self.parent_pid):
            return "the server's main process exited"
        return None


def shared_port(host: str, port: int) -> socket.socket:
    """A listening socket on host:port that the other HTTP processes bind too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock
