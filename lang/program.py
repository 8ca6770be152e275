"""`@function`: a program over a `ProgramState`, and running it (`run`, `run_batch`)."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from seq2serve.lang.backend import Backend
from seq2serve.lang.state import ProgramState

_default_backend: Backend | None = None


def set_default_backend(backend: Any) -> None:
    """The backend of `run` / `run_batch` calls that name none."""
    global _default_backend
    _default_backend = as_backend(backend)


def as_backend(backend: Any) -> Backend:
    """A Backend as is; a `Seq2SeqEngine` wrapped in an `EngineBackend`; None: the default."""
    if backend is None:
        if _default_backend is None:
            raise ValueError("no backend: pass backend=... or call set_default_backend")
        return _default_backend
    if isinstance(backend, Backend):
        return backend
    from seq2serve.lang.engine_backend import EngineBackend
    from seq2serve.runtime.frontend.engine import Seq2SeqEngine

    if isinstance(backend, Seq2SeqEngine):
        if backend not in _engine_backends:
            _engine_backends[backend] = EngineBackend(backend)
        return _engine_backends[backend]
    raise TypeError(f"backend must be a Seq2SeqEngine or a Backend (RuntimeEndpoint), not "
                    f"{type(backend).__name__}")


# one per engine (its model info is fetched once), gone with the engine
_engine_backends: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Program:
    """A function `f(s, *args, **kwargs)` that appends to its state `s`."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        functools.update_wrapper(self, func)

    def run(self, *args: Any, backend: Any = None, stream: bool = False,
            **kwargs: Any) -> ProgramState:
        """Run the program. Without `stream`: when it has finished (an error one of its steps
        raised is raised here). With `stream`: at once, the program running on; read
        `state.text_iter()` as its text comes."""
        state = ProgramState(as_backend(backend), stream=stream)
        if not stream:
            self._execute(state, args, kwargs)
            state._raise()
            return state
        state._owner = -1  # owned by the program's thread from now on (its id comes next)
        threading.Thread(target=self._execute, args=(state, args, kwargs),
                         name="seq2serve-lang-program", daemon=True).start()
        return state

    def run_batch(self, batch_kwargs: list[dict[str, Any]], backend: Any = None,
                  num_threads: int | None = None) -> list[ProgramState]:
        """Run the program once per kwargs dict, concurrently (the runtime batches their
        requests continuously); the states in order, each finished. A program that failed
        has its `error` set (and raises it when read)."""
        b = as_backend(backend)
        if not isinstance(batch_kwargs, list) or not all(isinstance(k, dict)
                                                         for k in batch_kwargs):
            raise ValueError("run_batch takes a list of keyword-argument dicts")
        states = [ProgramState(b) for _ in batch_kwargs]
        workers = max(1, min(num_threads or 64, len(batch_kwargs)))
        with ThreadPoolExecutor(workers, thread_name_prefix="seq2serve-lang-batch") as pool:
            list(pool.map(lambda sk: self._execute(sk[0], (), sk[1]),
                          zip(states, batch_kwargs)))
        return states

    def _execute(self, state: ProgramState, args: tuple, kwargs: dict[str, Any]) -> None:
        state._owner = threading.get_ident()
        try:
            self.func(state, *args, **kwargs)
            state.sync()
        except BaseException as e:  # noqa: BLE001 - kept on the state, raised when read
            if state.error is None:
                state.error = e
        finally:
            state.close()

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)


def function(func: Callable[..., Any]) -> Program:
    """Decorate `def f(s, ...)` into a program: `f.run(...)`, `f.run_batch([...])`."""
    return Program(func)
