"""`Backend`: how a program's `gen` and `select` become runtime requests, per model family, on
top of a transport (`EngineBackend` in-process, `RuntimeEndpoint` over HTTP). Both build the
same `/generate` bodies here, so a program gives the same results over either.

- Decoder-only (Llama, Mllama): the state is the decoder prompt. `gen` continues it; `select`
  scores each choice's tokens after the prompt's (`input_ids` = prompt + choice,
  `logprob_start_len` = the prompt's length); the radix cache serves the shared prefix.
- Encoder-decoder (T5, mT5): the state is the encoder input. `gen` decodes from it; `select`
  scores each choice as the whole decoder output (start token + the choice's tokens with its
  end token, `logprob_start_len` 1). The choices go in one request, so the encoder runs once
  for all of them (once per state at all: the encoder cache serves repeats).

Either way, one `select` is one batched request: its choices are admitted together and scored
in one extend forward, without generating (max_new_tokens 0).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Prompt:
    """A state's text and its images (in the order of their placeholders)."""

    text: str
    images: list[Any] = field(default_factory=list)


@dataclass
class Scores:
    """One select's result: every choice's summed and per-token mean log-probability."""

    choices: list[str]
    sums: list[float]
    means: list[float]
    token_logprobs: list[list[float]]  # each choice's tokens' log-probs

    def best(self, method: str) -> int:
        values = self.sums if method == "sum" else self.means
        return max(range(len(values)), key=values.__getitem__)  # the first of equals


class Backend:
    """A transport's three calls (`_generate`, `_stream`, `_tokenize`) and `_model_info`, and
    the requests built on them."""

    # --- what a transport provides -----------------------------------------------------------
    def _generate(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """Run one /generate body; one result dict per prompt."""
        raise NotImplementedError

    def _stream(self, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """Run one /generate body with stream: (new text, meta_info) as it comes."""
        raise NotImplementedError

    def _tokenize(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        raise NotImplementedError

    def _model_info(self) -> dict[str, Any]:
        raise NotImplementedError

    # --- the model ---------------------------------------------------------------------------
    @functools.cached_property
    def info(self) -> dict[str, Any]:
        return self._model_info()

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(self.info["is_encoder_decoder"])

    def role_markers(self, role: str) -> tuple[str, str]:
        begin, end = self.info["chat_roles"][role]
        return begin, end

    @property
    def image_token(self) -> str:
        token = self.info.get("image_token")
        if token is None:
            raise ValueError("this model takes no images")
        return token

    # --- requests ----------------------------------------------------------------------------
    def _prompt_body(self, prompt: Prompt) -> dict[str, Any]:
        body: dict[str, Any] = {"text": prompt.text}
        if prompt.images:
            body["image_data"] = list(prompt.images)
        return body

    def generate(self, prompt: Prompt, sampling_params: dict[str, Any]) -> tuple[str, dict]:
        """(text, meta_info) of one generation from the prompt."""
        body = {**self._prompt_body(prompt), "sampling_params": dict(sampling_params)}
        (out,) = self._generate(body)
        return out["text"], out["meta_info"]

    def generate_stream(self, prompt: Prompt, sampling_params: dict[str, Any]
                        ) -> Iterator[tuple[str, dict]]:
        body = {**self._prompt_body(prompt), "sampling_params": dict(sampling_params),
                "stream": True}
        yield from self._stream(body)

    def score(self, prompt: Prompt, choices: list[str]) -> Scores:
        """Every choice's log-probabilities after the prompt, in one batched request."""
        n = len(choices)
        body: dict[str, Any] = {"sampling_params": {"max_new_tokens": 0},
                                "return_logprob": True}
        if self.is_encoder_decoder:
            start = self.info["decoder_start_token_id"]
            ids = self._tokenize(choices, True)  # with the end token: the whole output
            body.update(text=[prompt.text] * n, logprob_start_len=1,
                        decoder_input_ids=[[start] + c for c in ids])
        else:
            (head,) = self._tokenize([prompt.text], True)
            ids = self._tokenize(choices, False)
            for choice, c in zip(choices, ids):
                if not c:
                    raise ValueError(f"select: the choice {choice!r} has no tokens")
            body.update(input_ids=[head + c for c in ids], logprob_start_len=len(head))
        if prompt.images:
            body["image_data"] = [list(prompt.images) for _ in range(n)]
        results = self._generate(body)
        token_logprobs = [[lp for lp, _ in r["meta_info"]["input_token_logprobs"]]
                          for r in results]
        sums = [sum(lp) for lp in token_logprobs]
        return Scores(list(choices), sums, [s / len(lp) for s, lp in zip(sums, token_logprobs)],
                      token_logprobs)
