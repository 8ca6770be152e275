"""What the runtime knows about a checkpoint, read from its config.json."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from seq2serve.models import registry
from seq2serve.models.family import FamilyConfig
from seq2serve.runtime.config.timestamp_tokens import TimestampTokens

_DTYPE_NAMES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16",
                "float16": "float16", "half": "float16"}


@dataclass(frozen=True)
class ModelConfig:
    model_path: str
    architecture: str
    checkpoint_dtype: str  # "float32" | "bfloat16" | "float16"
    arch: FamilyConfig  # the family's frozen config (e.g. models.mt5.config.T5Config)
    generation_eos_ids: tuple[int, ...] = ()  # generation_config.json's eos_token_id, if any
    # generation_config.json's single-token bad_words_ids (OPUS-MT: its pad)
    generation_bad_ids: tuple[int, ...] = ()
    generation_forced_bos: int | None = None  # generation_config.json's forced_bos_token_id
    # generation_config.json's forced_eos_token_id, as ids; None where the file has no such key
    generation_forced_eos: tuple[int, ...] | None = None
    # generation_config.json's suppress_tokens / begin_suppress_tokens (Whisper); None where
    # the file has no such key
    generation_suppress: tuple[int, ...] | None = None
    generation_begin_suppress: tuple[int, ...] | None = None
    # generation_config.json's min_length: the least decoder length, start token included
    # (HF's MinLengthLogitsProcessor; bart-large-cnn's 56)
    generation_min_length: int = 0
    # Whisper's timestamp tokens (generation_config.json's no_timestamps_token_id, ...); None
    # for a model without them
    timestamp_tokens: TimestampTokens | None = None

    @classmethod
    def from_path(cls, model_path: str) -> ModelConfig:
        path = os.path.join(model_path, "config.json")
        if not os.path.isdir(model_path):
            raise ValueError(f"model path {model_path!r} is not a directory")
        if not os.path.isfile(path):
            raise ValueError(f"model path {model_path!r} has no config.json")
        try:
            with open(path) as f:
                hf = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        architecture = registry.architecture_of(hf)
        model_cls = registry.model_class(architecture)
        dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
        arch = model_cls.config_class.from_hf(hf)
        return cls(
            model_path=model_path,
            architecture=architecture,
            checkpoint_dtype=_DTYPE_NAMES.get(str(dtype), "float32"),
            arch=arch,
            generation_eos_ids=_generation_eos(model_path),
            generation_bad_ids=_generation_bad_ids(model_path),
            generation_forced_bos=_generation_config(model_path).get("forced_bos_token_id"),
            generation_forced_eos=_generation_forced_eos(model_path),
            generation_suppress=_generation_ids(model_path, "suppress_tokens"),
            generation_begin_suppress=_generation_ids(model_path, "begin_suppress_tokens"),
            generation_min_length=_generation_min_length(model_path),
            timestamp_tokens=TimestampTokens.from_generation_config(
                _generation_config(model_path), arch.vocab_size,
                arch.eos_token_ids[0] if arch.eos_token_ids else None),
        )

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every token that ends generation: config.json's and generation_config.json's."""
        return tuple(sorted(set(self.arch.eos_token_ids) | set(self.generation_eos_ids)))

    @property
    def suppressed_token_ids(self) -> tuple[int, ...]:
        """Tokens never generated: the model's own (Marian's pad), generation_config.json's
        single-token bad_words_ids, and its suppress_tokens (Whisper; else config.json's) as
        HF's SuppressTokensLogitsProcessor bans them."""
        own = self.arch.suppressed_token_ids
        suppress = (self.generation_suppress if self.generation_suppress is not None
                    else self.arch.suppress_tokens)
        return tuple(sorted(set(own) | set(self.generation_bad_ids) | set(suppress)))

    @property
    def begin_suppressed_token_ids(self) -> tuple[int, ...]:
        """Tokens never a request's first generated token: generation_config.json's
        begin_suppress_tokens (Whisper: the space and EOS), else config.json's."""
        if self.generation_begin_suppress is not None:
            return self.generation_begin_suppress
        return self.arch.begin_suppress_tokens

    @property
    def forced_bos_token_id(self) -> int | None:
        """The first token HF's generate forces when the caller gives no decoder prompt
        (generation_config.json's, else config.json's)."""
        if self.generation_forced_bos is not None:
            return self.generation_forced_bos
        return self.arch.forced_bos_token_id

    @property
    def forced_eos_token_ids(self) -> tuple[int, ...]:
        """Tokens HF's generate forces as the last one when max_new_tokens is reached
        (ForcedEOSTokenLogitsProcessor: generation_config.json's forced_eos_token_id, else
        config.json's; OPUS-MT, mBART and M2M100 checkpoints ship one)."""
        if self.generation_forced_eos is not None:
            return self.generation_forced_eos
        return self.arch.forced_eos_token_ids

    @property
    def is_encoder_decoder(self) -> bool:
        return self.arch.is_encoder_decoder

    @property
    def vocab_size(self) -> int:
        return self.arch.vocab_size


def _generation_config(model_path: str) -> dict:
    path = os.path.join(model_path, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _generation_min_length(model_path: str) -> int:
    value = _generation_config(model_path).get("min_length") or 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{model_path}/generation_config.json: min_length {value!r} is not "
                         f"an integer >= 0")
    return value


def _generation_bad_ids(model_path: str) -> tuple[int, ...]:
    bad = _generation_config(model_path).get("bad_words_ids") or []
    return tuple(int(w[0]) for w in bad if isinstance(w, list) and len(w) == 1)


def _generation_forced_eos(model_path: str) -> tuple[int, ...] | None:
    gen = _generation_config(model_path)
    if "forced_eos_token_id" not in gen:
        return None
    value = gen["forced_eos_token_id"]
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def _generation_ids(model_path: str, key: str) -> tuple[int, ...] | None:
    gen = _generation_config(model_path)
    if key not in gen:
        return None
    return tuple(int(v) for v in gen[key] or ())


def _generation_eos(model_path: str) -> tuple[int, ...]:
    eos = _generation_config(model_path).get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (eos,)
