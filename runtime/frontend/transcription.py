"""Whisper's decoder prompt: the tokens HF's `WhisperForConditionalGeneration.generate` forces
before the text (`<|startoftranscript|>`, the language, the task, `<|notimestamps|>`), read
from the checkpoint's generation_config.json (`lang_to_id`, `task_to_id`,
`no_timestamps_token_id`, `is_multilingual`), as `decoder_input_ids` for generate. The prompt
is forced, not generated: HF counts none of it in a beam's length (`decoder_forced` 0).

A multilingual model's prompt names a language: without one, `whisper_language.py` detects it
first (the endpoints and `Seq2SeqEngine.transcribe` do). Previous text (OpenAI's `prompt`,
HF's `prompt_ids`) goes before the forced tokens: `<|startofprev|>` and the text's tokens
(`previous_ids`, as HF's `WhisperTokenizer.get_prompt_ids`). With timestamps (HF's
`return_timestamps=True`) the prompt ends without `<|notimestamps|>`, and the request's
`timestamps` sampling parameter turns the timestamp rules on
(`runtime/executor/timestamp_rules.py`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

TASKS = ("transcribe", "translate")


@dataclass(frozen=True)
class WhisperPrompt:
    decoder_start_token_id: int
    no_timestamps_token_id: int
    is_multilingual: bool
    lang_to_id: dict[str, int]  # "<|en|>" -> id
    task_to_id: dict[str, int]  # "transcribe" -> id
    max_target_positions: int = 448  # the decoder's positions: prompt and text together
    vocab_size: int = 0  # the model's (config.json): timestamp tokens follow no-timestamps

    @property
    def has_timestamps(self) -> bool:
        """Whether the vocabulary has timestamp tokens (`<|0.00|>` after `<|notimestamps|>`)."""
        return self.no_timestamps_token_id + 1 < self.vocab_size

    def check_timestamps(self, name: str) -> None:
        """A ValueError naming `name` (what asked for timestamps) for a model without them."""
        if not self.has_timestamps:
            raise ValueError(f"{name} needs timestamps: this model has no timestamp tokens "
                             f"(none after <|notimestamps|> in its vocabulary)")

    @classmethod
    def from_model(cls, model_path: str) -> WhisperPrompt:
        """From the model directory's generation_config.json (and config.json's start token)."""
        gen = _json(os.path.join(model_path, "generation_config.json"))
        cfg = _json(os.path.join(model_path, "config.json"))
        if "no_timestamps_token_id" not in gen:
            raise ValueError(f"{model_path}: generation_config.json has no Whisper prompt "
                             f"settings (no_timestamps_token_id, lang_to_id, task_to_id)")
        return cls(
            decoder_start_token_id=int(gen.get("decoder_start_token_id",
                                               cfg.get("decoder_start_token_id", 50258))),
            no_timestamps_token_id=int(gen["no_timestamps_token_id"]),
            is_multilingual=bool(gen.get("is_multilingual", bool(gen.get("lang_to_id")))),
            lang_to_id=dict(gen.get("lang_to_id") or {}),
            task_to_id=dict(gen.get("task_to_id") or {}),
            max_target_positions=int(cfg.get("max_target_positions", 448)),
            vocab_size=int(cfg.get("vocab_size", 0)),
        )

    def tokens(self, language: str | None = None, task: str = "transcribe",
               timestamps: bool = False) -> list[int]:
        """The forced prompt for `language` (a code "en" or "<|en|>", or an English name
        "english") and `task`, ending in `<|notimestamps|>` unless `timestamps`; a ValueError
        naming the choices for anything else."""
        prompt = [self.decoder_start_token_id]
        if self.is_multilingual:
            if language is None:
                raise ValueError("a multilingual model's prompt names a language: give one "
                                 f"(of {', '.join(self.language_codes())}), or let "
                                 f"Seq2SeqEngine.transcribe or /v1/audio/* detect it")
            prompt.append(self.language_id(language))
            if task not in self.task_to_id:
                raise ValueError(f"task {task!r} is not one of "
                                 f"{', '.join(sorted(self.task_to_id))}")
            prompt.append(self.task_to_id[task])
        else:
            if language not in (None, "en", "<|en|>", "english"):
                raise ValueError(f"this model is English-only; language {language!r} "
                                 f"cannot be given")
            if task != "transcribe":
                raise ValueError(f"this model is English-only: it only transcribes "
                                 f"(task {task!r})")
        return prompt if timestamps else prompt + [self.no_timestamps_token_id]

    def previous_ids(self, tokenizer, text: str) -> list[int]:
        """`<|startofprev|>` and `text`'s tokens, as HF's `get_prompt_ids` makes them (the text
        stripped, one leading space); a ValueError if the text holds a special token."""
        ids = tokenizer("<|startofprev|>", " " + text.strip(),
                        add_special_tokens=False)["input_ids"]
        first_special = tokenizer.all_special_ids[0]  # HF's rule: Whisper's specials end it
        bad = next((t for t in ids[1:] if t >= first_special), None)
        if bad is not None:
            raise ValueError(f"the prompt holds the special token "
                             f"{tokenizer.convert_ids_to_tokens(bad)!r}")
        return ids

    def language_code(self, language: str | None) -> str | None:
        """`language` as a code ("german" -> "de"); an English-only model's is "en"."""
        if not self.is_multilingual:
            return "en"
        if language is None:
            return None
        return next(c for c, i in self.lang_to_id.items()
                    if i == self.language_id(language)).strip("<|>")

    def language_codes(self) -> list[str]:
        return sorted(code.strip("<|>") for code in self.lang_to_id)

    def language_id(self, language: str) -> int:
        from transformers.models.whisper.tokenization_whisper import TO_LANGUAGE_CODE

        name = language.lower()
        code = TO_LANGUAGE_CODE.get(name, name).strip("<|>")
        token = f"<|{code}|>"
        if token not in self.lang_to_id:
            raise ValueError(f"language {language!r} is not one of this model's: "
                             f"{', '.join(self.language_codes())}")
        return self.lang_to_id[token]


def _json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)
