"""The attention backend interface: metadata once per batch, then one call per layer."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Protocol

import torch

from seq2serve.runtime.kernels.position_bias import PositionBias

if TYPE_CHECKING:
    from seq2serve.runtime.attention.forward_batch import EncodeForwardBatch, ForwardBatch


class AttentionKind(enum.Enum):
    ENCODER = "encoder"  # bidirectional over one packed, ragged batch of encoder inputs
    SELF = "self"  # causal decoder self-attention over the paged TokenToKVPool
    CROSS = "cross"  # decoder queries over each request's own encoder K/V in the CrossKVPool


class AttentionLayer(Protocol):
    """What a backend needs to know about one attention call site."""

    kind: AttentionKind
    layer_id: int  # index into the TokenToKVPool (SELF) or the CrossKVPool (CROSS) layers
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    # HF's `sliding_window` (None: every key): a SELF query sees the last `sliding_window`
    # positions, its own included; an ENCODER query the keys at most that far on either side
    sliding_window: int | None
    softcap: float | None  # scores become softcap * tanh(scores / softcap), before masking


class AttentionBackend(ABC):
    """Serves all three attention kinds. `init_forward_metadata` runs once per batch; layers
    then call `forward` with q, k, v of shape [tokens, heads, head_dim] and get
    [tokens, heads * head_dim] back."""

    num_sms = 1  # parallelism the decode kernels split KV for (GPU: streaming multiprocessors)

    @abstractmethod
    def init_forward_metadata(self, fb: ForwardBatch | EncodeForwardBatch) -> None: ...

    def init_graph_metadata(self, fb: ForwardBatch, self_splits: int, cross_splits: int,
                            beams: int = 0) -> None:
        """Decode metadata for a CUDA graph capture: made only of views of `fb`'s static device
        tensors, so each replay reads its own values (`beams`: each beam group's cross K/V
        read once, for groups of up to `beams` rows; the groups are a graph input). Backends
        that cannot be captured keep this default (the model runner captures only with the
        Triton backend)."""
        raise NotImplementedError(f"{type(self).__name__} cannot run in CUDA graphs")

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                layer: AttentionLayer, fb: ForwardBatch,
                position_bias: PositionBias | None = None) -> torch.Tensor:
        if layer.kind is AttentionKind.SELF:
            fb.token_to_kv_pool.set_kv(layer.layer_id, fb.out_cache_loc, k, v)
            return self.forward_self(q, layer, fb, position_bias)
        if layer.kind is AttentionKind.CROSS:
            return self.forward_cross(q, layer, fb)
        return self.forward_encoder(q, k, v, layer, fb, position_bias)

    def store_cross_kv(self, layer: AttentionLayer, k: torch.Tensor, v: torch.Tensor,
                       fb: EncodeForwardBatch) -> None:
        """Write an encoder output's projected K/V into the CrossKVPool (encode stage)."""
        fb.cross_kv_pool.set_kv(layer.layer_id, fb.cross_out_loc, k, v)

    @abstractmethod
    def forward_self(self, q: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
                     position_bias: PositionBias | None) -> torch.Tensor: ...

    @abstractmethod
    def forward_cross(self, q: torch.Tensor, layer: AttentionLayer,
                      fb: ForwardBatch) -> torch.Tensor: ...

    @abstractmethod
    def forward_encoder(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        layer: AttentionLayer, fb: EncodeForwardBatch,
                        position_bias: PositionBias | None) -> torch.Tensor: ...
