"""`EngineBackend`: programs run on a `Seq2SeqEngine` in this process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from seq2serve.lang.backend import Backend
from seq2serve.runtime.frontend.engine import Seq2SeqEngine


class EngineBackend(Backend):
    """The engine's own calls, with the /generate body's names (`text` is the prompt)."""

    def __init__(self, engine: Seq2SeqEngine) -> None:
        self.engine = engine

    @staticmethod
    def _kwargs(body: dict[str, Any]) -> dict[str, Any]:
        kwargs = dict(body)
        kwargs["prompt"] = kwargs.pop("text", None)
        return kwargs

    def _generate(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        out = self.engine.generate(**self._kwargs(body))
        return out if isinstance(out, list) else [out]

    def _stream(self, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        for chunk in self.engine.generate(**self._kwargs(body)):
            yield chunk["text"], chunk["meta_info"]

    def _tokenize(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        return self.engine.tokenize(texts, add_special_tokens)

    def _model_info(self) -> dict[str, Any]:
        return self.engine.model_info()
