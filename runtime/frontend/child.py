"""Entry point of a child process: `python -m seq2serve.runtime.frontend.child scheduler|detokenizer|api`.
The parent writes the pickled settings to our stdin; we report readiness on the fd it names."""

from __future__ import annotations

import os
import pickle
import sys


class ReadyPipe:
    """Sends one pickled message to the parent, then closes."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, msg: dict) -> None:
        with os.fdopen(self.fd, "wb") as f:
            f.write(pickle.dumps(msg))


def main() -> None:
    kind = sys.argv[1]
    cfg = pickle.loads(sys.stdin.buffer.read())
    pipe = ReadyPipe(cfg["ready_fd"])
    if kind == "scheduler":
        from seq2serve.runtime.scheduler.scheduler_process import run_scheduler_process as run
    elif kind == "detokenizer":
        from seq2serve.runtime.frontend.detokenizer_manager import run_detokenizer_process as run
    elif kind == "api":
        from seq2serve.runtime.frontend.http_server import run_api_server_process as run
    else:
        raise SystemExit(f"unknown child kind {kind!r}")
    run(cfg["args"], cfg["ipc"], pipe, cfg["parent_pid"], **cfg.get("extra", {}))


if __name__ == "__main__":
    main()
