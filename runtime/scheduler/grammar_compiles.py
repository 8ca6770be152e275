"""Grammars compiled off the scheduler's loop.

A request whose grammar is already compiled gets its matcher when it arrives. Any other waits
here while one thread compiles it (xgrammar releases the GIL while it compiles, so the loop
keeps stepping the running batch: a new JSON schema costs 2-90 ms to compile, some take
seconds, and the first grammar of a process also reads the vocabulary, ~0.7 s for 128k
tokens); then it joins the queue, or, if the grammar is bad, ends with the error naming the
problem. One thread: compiles run one at a time, in arrival order, and the cache
(`GrammarCache`) is shared with the loop under its lock.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from seq2serve.runtime.scheduler.grammar_rows import Grammars
from seq2serve.runtime.scheduler.req import Req


@dataclass
class Compiling:
    req: Req
    group: str  # its fairness group, for the queue
    future: Future


class GrammarCompiles:
    def __init__(self, grammars: Grammars) -> None:
        self.grammars = grammars
        self.pending: list[Compiling] = []
        self._pool: ThreadPoolExecutor | None = None  # made at the first compile

    def __len__(self) -> int:
        return len(self.pending)

    def __iter__(self):
        return (c.req for c in self.pending)

    def start(self, req: Req, group: str) -> bool:
        """True when `req` has its matcher now (its grammar is compiled, or it has none; a
        ValueError if its grammar is bad beyond compiling, e.g. the model has no tokenizer);
        False when its grammar is being compiled: the request waits here."""
        sp = req.sampling_params
        if sp.grammar is None:
            return True
        ready = self.grammars.cached_row(sp)
        if ready is not None:
            req.grammar = ready
            return True
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self.pending.append(Compiling(req, group, self._pool.submit(self.grammars.row, sp)))
        return False

    def finished(self) -> list[tuple[Compiling, ValueError | None]]:
        """The compiles that have ended, in arrival order: each request with its matcher set,
        or with the error that refuses it."""
        done = [c for c in self.pending if c.future.done()]
        if not done:
            return []
        self.pending = [c for c in self.pending if not c.future.done() or c not in done]
        out = []
        for c in done:
            try:
                c.req.grammar = c.future.result()
            except ValueError as e:
                out.append((c, e))
                continue
            out.append((c, None))
        return out

    def wait(self, timeout: float) -> None:
        """Block until a compile ends or `timeout` seconds pass (the loop has nothing else)."""
        if self.pending:
            wait([c.future for c in self.pending], timeout, return_when=FIRST_COMPLETED)

    def drop(self, req: Req) -> bool:
        """Forget a waiting request (aborted); its compile still ends in the cache."""
        kept = [c for c in self.pending if c.req is not req]
        found, self.pending = len(kept) < len(self.pending), kept
        return found
