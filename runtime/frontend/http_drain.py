"""uvicorn's server with a drain on SIGTERM / Ctrl-C.

Plain uvicorn stops listening at once, so a load balancer probing /health sees refused
connections and requests still running get `timeout_graceful_shutdown` seconds. Here the first
signal starts a drain instead: the tokenizer manager refuses new requests and /health answers
503 (a load balancer stops routing here), requests already running go on, and the server stops
when none is left or `grace_s` has passed. A second signal stops it at once.
"""

from __future__ import annotations

import logging
import time

import uvicorn

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, tm, grace_s: float) -> None:
        super().__init__(config)
        self.tm = tm
        self.grace_s = grace_s
        self.drain_deadline: float | None = None

    def handle_exit(self, sig, frame) -> None:
        if self.drain_deadline is not None or not self.started or not self._busy():
            super().handle_exit(sig, frame)  # idle, not serving yet, or a second signal
            return
        self._captured_signals.append(sig)  # re-raised after shutdown, as uvicorn does
        self.tm.draining = True
        self.drain_deadline = time.monotonic() + self.grace_s
        logger.warning("shutting down: %d running requests get up to %.0f s to finish "
                       "(signal again to stop now)", len(self.tm.states), self.grace_s)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            if not self._busy() or time.monotonic() >= self.drain_deadline:
                self.should_exit = True
        return await super().on_tick(counter)

    def _busy(self) -> bool:
        return bool(self.tm.states)
