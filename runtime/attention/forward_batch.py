"""ForwardBatch: the device tensors and metadata of one forward, as every layer sees them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
    from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool
    from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool


class ForwardMode(enum.Enum):
    ENCODE = "encode"  # encoder over new inputs, then cross K/V written to the CrossKVPool
    EXTEND = "extend"  # decoder prompt tokens (prefill), possibly many per request
    DECODE = "decode"  # one token for every running request


@dataclass
class ForwardBatch:
    """Device tensors for one forward. Built once per batch; the model runner then has the
    attention backend add its metadata (`init_forward_metadata`); every layer gets this object
    as an argument."""

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor | None
    positions: torch.Tensor | None
    out_cache_loc: torch.Tensor | None
    req_pool_indices: torch.Tensor | None
    seq_lens: torch.Tensor | None
    extend_lens: torch.Tensor | None
    encoder_lens: torch.Tensor | None
    encoder_input_ids: torch.Tensor | None
    cross_out_loc: torch.Tensor | None
    cross_kv_start: torch.Tensor | None
    cross_kv_end: torch.Tensor | None
    encoder_images: Any  # the model's own encoder input (Mllama: an ImageBatch), or None
    cached_hidden: torch.Tensor | None
    # the same lengths on the host, for backends that loop or size grids
    seq_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    encoder_lens_cpu: list[int]
    req_pool_indices_cpu: list[int]
    # pools and backend
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: TokenToKVPool | None
    cross_kv_pool: CrossKVPool | None
    attn_backend: Any  # the AttentionBackend (base.py imports this module, not the reverse)
    attn_metadata: Any = None  # set by the attention backend
