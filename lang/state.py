"""`ProgramState`: a program's text, images, variables and chat messages, and the executor that
runs what the program appends to it, in order, on a thread of its own. Appending returns at
once; reading a variable (`s["name"]`), the text or a fork waits for what it needs, so forks
and the programs of a `run_batch` run side by side and the runtime batches their requests.

Ownership: only the state's executor thread changes the state; readers wait on `_cond`. The
thread running the program (`_owner`) waits for what it appended so far; any other thread (a
caller reading a streamed run) waits for the program's end.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from seq2serve.lang.backend import Backend, Prompt
from seq2serve.lang.expr import Flat, flatten

_CLOSE = object()


class ProgramState:
    def __init__(self, backend: Backend, stream: bool = False) -> None:
        self.backend = backend
        self.stream = stream  # gen streams its text into text_iter as it comes
        self._text = ""
        self._images: list[Any] = []
        self._vars: dict[str, Any] = {}
        self._meta: dict[str, Any] = {}
        self._messages: list[dict[str, str]] = []
        self._role: tuple[str, int] | None = None  # the open role and where its content starts
        self._pieces: list[tuple[str | None, str]] = []  # (variable or None, text) as appended
        self._cond = threading.Condition()
        self._submitted = self._done = 0
        self._closed = False
        self._owner: int | None = None  # the thread running the program (None: any reader)
        self._children: list[ProgramState] = []  # forks: closed with this state
        self.error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="seq2serve-lang-state",
                                        daemon=True)
        self._thread.start()

    # --- what a program does -----------------------------------------------------------------
    def __iadd__(self, expr: Any) -> ProgramState:
        steps = flatten(expr)  # bad expressions fail here, in the program's own thread
        with self._cond:
            if self._closed:
                raise RuntimeError("this program state is closed")
            self._submitted += len(steps)
        for step in steps:
            self._queue.put(step)
        return self

    def __getitem__(self, name: str) -> Any:
        with self._cond:
            self._cond.wait_for(lambda: name in self._vars or self._settled())
            self._raise()
            if name not in self._vars:
                raise KeyError(f"the program set no variable {name!r}")
            return self._vars[name]

    def get_var(self, name: str) -> Any:
        return self[name]

    def set_var(self, name: str, value: Any) -> None:
        self.sync()
        with self._cond:
            self._vars[name] = value

    def get_meta_info(self, name: str) -> dict[str, Any]:
        """The runtime's meta_info of `gen(name)`; for `select(name)`: every choice's scores."""
        self[name]
        with self._cond:
            return self._meta[name]

    def text(self) -> str:
        self.sync()
        return self._text

    def messages(self) -> list[dict[str, str]]:
        """The chat messages so far: role and content (images as their placeholders)."""
        self.sync()
        return [dict(m) for m in self._messages]

    def variables(self) -> dict[str, Any]:
        self.sync()
        return dict(self._vars)

    def sync(self) -> ProgramState:
        """Wait until everything appended so far has run; raise the error one step raised."""
        with self._cond:
            self._cond.wait_for(self._settled)
            self._raise()
        return self

    def fork(self, n: int) -> ForkGroup:
        """`n` copies of this state (once what was appended has run); their steps run in
        parallel. `forks.join()` waits for all of them."""
        if not isinstance(n, int) or n < 1:
            raise ValueError("fork needs a number of branches >= 1")
        self.sync()
        forks = []
        for _ in range(n):
            f = ProgramState(self.backend, self.stream)
            f._text, f._images = self._text, list(self._images)
            f._vars, f._meta = dict(self._vars), dict(self._meta)
            f._messages = [dict(m) for m in self._messages]
            f._role, f._owner = self._role, threading.get_ident()
            forks.append(f)
        self._children += forks
        return ForkGroup(self, forks)

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """The text as it is appended (a stream's tokens as they come), until the program ends;
        with `var_name`, only that variable's."""
        seen = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda n=seen: len(self._pieces) > n or self._finished())
                pieces, seen = self._pieces[seen:], len(self._pieces)
                finished = self._finished() and not pieces
            for var, piece in pieces:
                if var_name is None or var == var_name:
                    yield piece
            if finished:
                with self._cond:
                    self._raise()
                return

    def close(self) -> None:
        """No more steps: the executor thread ends once the queued ones have run."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._queue.put(_CLOSE)
        for child in self._children:
            child.close()

    def __repr__(self) -> str:
        return f"ProgramState({self._text!r})"

    # --- the executor ------------------------------------------------------------------------
    def _idle(self) -> bool:
        return self._done == self._submitted

    def _finished(self) -> bool:
        return self._closed and self._idle()

    def _settled(self) -> bool:
        """Nothing more will run that this reader should wait for."""
        if self._owner is None or self._owner == threading.get_ident():
            return self._idle()
        return self._finished()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while True:
            step = self._queue.get()
            if step is _CLOSE:
                return
            try:
                if self.error is None:  # after an error, the rest is skipped
                    self._execute(step)
            except BaseException as e:  # noqa: BLE001 - handed to the program's readers
                self.error = e
            with self._cond:
                self._done += 1
                self._cond.notify_all()

    def _append(self, text: str, var: str | None = None) -> None:
        with self._cond:
            self._text += text
            self._pieces.append((var, text))
            self._cond.notify_all()

    def _prompt(self) -> Prompt:
        return Prompt(self._text, list(self._images))

    def _execute(self, step: Flat) -> None:
        kind = step.kind
        if kind == "text":
            self._append(step.value)
        elif kind == "image":
            token = self.backend.image_token
            self._images.append(step.value)
            self._append(token)
        elif kind == "role_begin":
            if self._role is not None:
                raise ValueError(f"{step.value}(...) inside {self._role[0]}(...)")
            self._append(self.backend.role_markers(step.value)[0])
            self._role = (step.value, len(self._text))
        elif kind == "role_end":
            if self._role is None or self._role[0] != step.value:
                raise ValueError(f"{step.value}_end() without {step.value}(...)")
            role, start = self._role
            self._messages.append({"role": role, "content": self._text[start:]})
            self._role = None
            self._append(self.backend.role_markers(role)[1])
        elif kind == "gen":
            self._gen(step.value)
        elif kind == "select":
            self._select(step.value)

    def _gen(self, g) -> None:
        if self.stream:
            text, meta = "", {}
            for piece, info in self.backend.generate_stream(self._prompt(), g.sampling_params):
                text, meta = text + piece, info
                if piece:  # (a stream's last event may carry no new text)
                    self._append(piece, g.name)
        else:
            text, meta = self.backend.generate(self._prompt(), g.sampling_params)
            self._append(text, g.name)
        self._set(g.name, text, meta)

    def _select(self, sel) -> None:
        scores = self.backend.score(self._prompt(), sel.choices)
        choice = sel.choices[scores.best(sel.choices_method)]
        self._append(choice, sel.name)
        self._set(sel.name, choice, {"scores": scores.sums, "normalized_scores": scores.means,
                                     "token_logprobs": scores.token_logprobs,
                                     "choices": list(sel.choices)})

    def _set(self, name: str | None, value: Any, meta: dict[str, Any]) -> None:
        if name is None:
            return
        with self._cond:
            self._vars[name], self._meta[name] = value, meta
            self._cond.notify_all()


class ForkGroup:
    """The branches of a fork: index or iterate them; `join` waits for them all."""

    def __init__(self, parent: ProgramState, forks: list[ProgramState]) -> None:
        self.parent = parent
        self.forks = forks
        self._base_vars = set(parent._vars)
        self._base_len = len(parent._text)  # the branches' text starts with the parent's

    def __getitem__(self, i: int) -> ProgramState:
        return self.forks[i]

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.forks)

    def __len__(self) -> int:
        return len(self.forks)

    def join(self, mode: str = "gather_variable") -> list[ProgramState]:
        """Wait for every branch. "gather_variable": each variable the branches set becomes a
        list (one value per branch, None where unset) in the parent; "concate_and_append": the
        branches' new text, in order, is appended to the parent."""
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(f'join mode must be "gather_variable" or "concate_and_append", '
                             f"got {mode!r}")
        for f in self.forks:
            f.sync()
            f.close()
        if mode == "gather_variable":
            names = sorted({n for f in self.forks for n in f._vars} - self._base_vars)
            self.parent.sync()
            with self.parent._cond:
                for n in names:
                    self.parent._vars[n] = [f._vars.get(n) for f in self.forks]
                    self.parent._meta[n] = [f._meta.get(n) for f in self.forks]
        else:
            self.parent += "".join(f._text[self._base_len:] for f in self.forks)
        return self.forks
