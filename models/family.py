"""What a model family provides the runtime, declared once: its normalized config
(`FamilyConfig`) and its model (`ModelFamily`).

Required members are abstract (a method) or annotated without a value (a config field or
property each family has); optional members have their default here, so the loader, the
runner, the quantizer and the scheduler read them directly instead of probing. `contract_gaps`
names what a family lacks; `tests/test_model_contract.py` runs it on every registered family.
`docs/adding-a-model.md` walks through a family from config to parity test.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

if TYPE_CHECKING:
    from seq2serve.runtime.attention.forward_batch import EncodeForwardBatch, ForwardBatch

# (parameter name, shard of a fused weight or None) pairs a checkpoint tensor fills
WeightTargets = list[tuple[str, int | None]]


class FamilyConfig:
    """A family's config, normalized from HF's config.json by `from_hf`; subclasses are frozen
    dataclasses. Beware: a dataclass field named like an optional member below takes its
    default from here (dataclasses read defaults with getattr)."""

    # --- required: the normalized shape the runtime sizes its pools by --------------------
    vocab_size: int  # the output vocabulary (logits)
    eos_token_ids: tuple[int, ...]
    is_encoder_decoder: bool  # the prompt goes to an encoder (T5, BART) or to the decoder
    num_self_attn_layers: int
    num_cross_attn_layers: int  # 0: no cross-attention pool
    num_kv_heads: int  # before tensor parallelism splits them
    head_dim: int
    max_length: int | None  # the decoder's positions (None: unbounded, T5)

    REQUIRED: ClassVar[tuple[str, ...]] = (
        "vocab_size", "eos_token_ids", "is_encoder_decoder", "num_self_attn_layers",
        "num_cross_attn_layers", "num_kv_heads", "head_dim", "max_length")

    # --- optional, with their defaults ----------------------------------------------------
    decoder_start_token_id: int | None = None  # an encoder-decoder's first decoder token
    forced_bos_token_id: int | None = None  # HF forces it as the first generated token
    forced_eos_token_ids: tuple[int, ...] = ()  # HF forces one as the last (length limit)
    suppressed_token_ids: tuple[int, ...] = ()  # never generated (Marian's pad)
    suppress_tokens: tuple[int, ...] = ()  # config.json's (generation_config.json's win)
    begin_suppress_tokens: tuple[int, ...] = ()  # never a request's first generated token

    @property
    def max_encoder_length(self) -> int | None:
        """Cross K/V tokens per request (an encoder of its own length: Whisper's 1,500)."""
        return self.max_length

    @property
    def input_vocab_size(self) -> int:
        """Token ids a prompt may hold (Mllama's image token lies past the logits)."""
        return self.vocab_size

    def frontend_info(self) -> dict[str, Any]:
        """What the TokenizerManager needs for inputs besides text (images, audio)."""
        return {}

    def default_max_encoder_len(self, max_images: int) -> int:
        """A decoder-only model with cross-attention (Mllama): encoder room per request."""
        raise NotImplementedError(f"{type(self).__name__} has no cross-attention inputs")


class DecoderStacks(FamilyConfig):
    """The pool shape of a config with BART's field names (BART, Whisper): `d_model`,
    `decoder_layers`, `decoder_attention_heads`; every decoder layer has cross-attention."""

    d_model: int
    decoder_layers: int
    decoder_attention_heads: int
    is_encoder_decoder = True

    @property
    def num_self_attn_layers(self) -> int:
        return self.decoder_layers

    @property
    def num_cross_attn_layers(self) -> int:
        return self.decoder_layers

    @property
    def num_kv_heads(self) -> int:
        return self.decoder_attention_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.decoder_attention_heads


class ModelFamily(nn.Module, ABC):
    """A family's model, built on the meta device from its config and filled by
    `models/loader.py`. Layers compute through `models/ops.py`; attention reads the batch
    it is given (`ForwardBatch`, `EncodeForwardBatch`); the model knows nothing of pools."""

    config_class: ClassVar[type[FamilyConfig]]
    tensor_parallel: ClassVar[bool] = False  # its layers split over ranks (parallel_state)
    # optional DecoderInputs fields it reads (attention/forward_batch.py; Mllama's key ranges)
    optional_inputs: ClassVar[tuple[str, ...]] = ()
    # layer-name suffixes kept out of 8-bit weights and activations (T5's `wo`: outliers)
    keep_in_model_dtype: ClassVar[tuple[str, ...]] = ()

    # --- the decoder (required) ---------------------------------------------------------------
    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        """Hidden states [tokens, d] of the decoder's new tokens."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab_size] of some rows of `forward`'s output."""

    # --- weights ------------------------------------------------------------------------------
    @abstractmethod
    def weight_map(self, name: str) -> WeightTargets | None:
        """The parameters (and shards) a checkpoint tensor fills; [] to ignore; None: unknown."""

    def load_priority(self, name: str) -> int:
        """Checkpoint tensors load in this order (lowest first): a fallback loads before the
        tensors that overwrite it."""
        return 0

    def convert_tensor(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A checkpoint tensor as the parameters `weight_map(name)` names hold it (a layout
        that stores a matrix transposed: Florence-2's original projection)."""
        return tensor

    def tie_missing(self, missing: set[str]) -> set[str]:
        """Fill what the checkpoint lacks and the config allows (a tied head); returns the
        parameters still missing."""
        return missing

    def absent_shards(self) -> list[tuple[str, int]]:
        """(parameter, shard) parts no checkpoint has, which `init_buffers` fills."""
        return []

    def init_buffers(self) -> None:
        """Buffers derived from the config, not the checkpoint (sinusoids, rope); after load."""

    # --- the encoder stage (families with cross-attention) ----------------------------------
    def encode(self, fb: EncodeForwardBatch) -> torch.Tensor:
        """The encoder over a packed batch: hidden states [tokens, d]."""
        raise NotImplementedError(f"{type(self).__name__} has no encoder")

    def store_cross_kv(self, encoder_hidden: torch.Tensor, fb: EncodeForwardBatch) -> None:
        """Project encoder states to every cross-attention layer's K/V, once, into the pool."""
        raise NotImplementedError(f"{type(self).__name__} has no cross-attention")

    def compile_encoder(self) -> bool:
        """`torch.compile` the encoder stage's heaviest part where that pays, and run it once
        so no request compiles (`--compile-encoder`); False: the family has nothing to
        compile (the default)."""
        return False

    def warm_encoder_input(self) -> tuple[Any, list[int]] | None:
        """A model-owned encoder input (and its lengths) to compile the encoder with at
        start-up; None: a 2-token text input does."""
        return None

    def tie_lm_head(self, missing: set[str], embedding: nn.Embedding,
                    tie: bool) -> set[str]:
        """The head shares `embedding`'s weight where the checkpoint has none and `tie`."""
        if "lm_head.weight" in missing and tie:
            self.lm_head.weight = embedding.weight
            missing = missing - {"lm_head.weight"}
        return missing


def contract_gaps(model_cls: type, cfg: object) -> list[str]:
    """What `model_cls` and its config `cfg` lack of the contract ([] if nothing)."""
    gaps = []
    if not (isinstance(model_cls, type) and issubclass(model_cls, ModelFamily)):
        return [f"{model_cls!r} is not a ModelFamily"]
    gaps += [f"abstract {name}" for name in sorted(model_cls.__abstractmethods__)]
    if not isinstance(cfg, model_cls.config_class) or not isinstance(cfg, FamilyConfig):
        gaps.append(f"config {type(cfg).__name__} is not its FamilyConfig")
    gaps += [f"config member {name}" for name in FamilyConfig.REQUIRED
             if name not in dir(cfg)]
    return gaps
