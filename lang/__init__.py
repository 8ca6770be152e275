"""seq2serve's frontend language: SGLang-style programs (`function`, `gen`, `select`, roles,
`image`, `fork`) over a `Seq2SeqEngine` or a server (`RuntimeEndpoint`), with encoder-decoder
semantics: for T5 the state is the encoder input and `select` scores each choice as the
decoder's whole output. See README's "Programs" section and notebooks/05_programs.ipynb."""

from __future__ import annotations

from seq2serve.lang.backend import Backend, Scores
from seq2serve.lang.expr import (
    assistant,
    assistant_end,
    gen,
    image,
    select,
    system,
    system_end,
    user,
    user_end,
)
from seq2serve.lang.program import Program, function, set_default_backend
from seq2serve.lang.runtime_endpoint import RuntimeEndpoint
from seq2serve.lang.state import ForkGroup, ProgramState

__all__ = ["Backend", "EngineBackend", "ForkGroup", "Program", "ProgramState",
           "RuntimeEndpoint", "Scores", "assistant", "assistant_end", "function", "gen",
           "image", "select", "set_default_backend", "system", "system_end", "user",
           "user_end"]


def __getattr__(name: str):
    # imported lazily: the engine backend imports torch, programs over HTTP need none of it
    if name == "EngineBackend":
        from seq2serve.lang.engine_backend import EngineBackend

        return EngineBackend
    raise AttributeError(f"module 'seq2serve.lang' has no attribute {name!r}")
