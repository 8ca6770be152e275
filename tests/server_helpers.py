"""Starting a real `seq2serve serve` process on a free loopback port for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


# Each pytest-xdist worker takes ports from its own range, below Linux's ephemeral ports
# (32768 on): two workers asking the OS for a free port could be given the same one (the
# first's socket closed before its server bound it), and a test then talked to the other
# worker's server while its own failed to bind (CI, test_max_n_flag_sets_the_limit).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
_FIRST = 20000 + 500 * (int(_WORKER) % 24 if _WORKER.isdigit() else 0)
_PORTS = iter(range(_FIRST, _FIRST + 500))


def free_port() -> int:
    """A loopback port nothing listens on, from this worker's range."""
    for port in _PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port left in this test worker's range")


class ServerProcess:
    def __init__(self, model_path: str, *extra: str, timeout: float = 120.0) -> None:
        for attempt in range(3):  # (a port taken between the check and the bind: another)
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.log_path = (Path(os.environ.get("TMPDIR", "/tmp"))
                             / f"seq2serve-{self.port}.log")
            self.log = open(self.log_path, "w")
            self.proc = subprocess.Popen(
                [str(BIN / "seq2serve"), "serve", "--model-path", model_path, "--device",
                 "cpu", "--port", str(self.port), *extra],
                stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
            if self._wait_healthy(timeout, retry=attempt < 2):
                return
            self.kill()

    def _wait_healthy(self, timeout: float, retry: bool) -> bool:
        """Until our process answers /health: True; False when it exited because its HTTP
        port was taken and `retry` (the caller tries another); raises on any other failure
        (a port given in the server's arguments that is in use, too)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.output()
                if retry and f"'127.0.0.1', {self.port}): address already in use" in out:
                    return False
                raise RuntimeError(f"server exited early:\n{out}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"server did not become healthy:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def all_children(self) -> list[int]:
        """Every child process: the runtime's and the body-parsing workers."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split()]

    def children(self) -> list[int]:
        """The runtime's children (schedulers, detokenizer), not the HTTP process's forked
        body-parsing workers."""
        out = []
        for pid in self.all_children():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"frontend.child" in f.read():
                        out.append(pid)
            except OSError:
                pass
        return out

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit code. A server still running after `timeout` is killed and
        the failure carries its log's end (a drain that waited on running requests says so
        there: "shutting down: N running requests")."""
        self.proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            tail = "\n".join(self.output().splitlines()[-40:])
            raise AssertionError(f"the server did not exit {time.monotonic() - start:.0f} s "
                                 f"after SIGTERM; its log ends:\n{tail}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
