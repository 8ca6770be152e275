"""What every layer sees of one forward: `ForwardBatch` (a decoder forward) and
`EncodeForwardBatch` (an encoder forward), and `DecoderInputs`, the one description of a
decoder forward's per-token and per-request inputs.

`DecoderInputs` drives everything that moves those inputs: the scheduler fills it on the
host, `upload` queues its copy to the device, the CUDA graph runner makes one static buffer
row per field (padding rows get the field's `pad`), and `decode_rows` recasts an EXTEND as
decode rows by repeating its per-request fields. A new per-token input is one field here and
the line of the scheduler that fills it (docs/architecture.md shows one).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
    from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool
    from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool


class ForwardMode(enum.Enum):
    ENCODE = "encode"  # encoder over new inputs, then cross K/V written to the CrossKVPool
    EXTEND = "extend"  # decoder prompt tokens (prefill), possibly many per request
    DECODE = "decode"  # one token for every request


def token_input(dtype: torch.dtype, optional: bool = False) -> Any:
    """A field with one value per query token (host: a CPU tensor)."""
    return field(default=None, metadata={"per": "token", "dtype": dtype, "pad": 0,
                                         "optional": optional})


def request_input(dtype: torch.dtype, pad: int = 0) -> Any:
    """A field with one value per request (host: a list of ints)."""
    return field(default=None, metadata={"per": "request", "dtype": dtype, "pad": pad,
                                         "optional": False})


@dataclass
class DecoderInputs:
    """The inputs of a decoder forward. On the host (as the scheduler builds them) token
    fields are CPU tensors and request fields lists; `upload` gives the device copy. Optional
    fields are None unless the model reads them (`Model.optional_inputs`)."""

    input_ids: torch.Tensor = token_input(torch.int64)
    positions: torch.Tensor = token_input(torch.int64)  # decoder position of each token
    out_cache_loc: torch.Tensor = token_input(torch.int64)  # TokenToKVPool slot of each
    # cross keys [start, end) of its request that each token may read (an empty range: zero
    # output); set for models whose tokens see only part of the encoder output (Mllama)
    cross_kv_start: torch.Tensor | None = token_input(torch.int32, optional=True)
    cross_kv_end: torch.Tensor | None = token_input(torch.int32, optional=True)
    req_pool_indices: Any = request_input(torch.int64)  # table row (graph padding: its own)
    seq_lens: Any = request_input(torch.int32, pad=1)  # decoder length after this forward
    extend_lens: Any = request_input(torch.int32, pad=1)  # query tokens of each request
    encoder_lens: Any = request_input(torch.int32)  # cross K/V length of each request
    # rows of the beam group this row starts, 0 for a group's other rows (a row without
    # beams: 1); the rows of a group are contiguous and read one cross K/V, once
    cross_group_lens: Any = request_input(torch.int32, pad=1)

    @property
    def batch_size(self) -> int:
        return len(self.req_pool_indices)

    def present(self) -> frozenset[str]:
        """The optional fields this batch sets."""
        return frozenset(f.name for f in _OPTIONAL if getattr(self, f.name) is not None)

    def upload(self, device: str | torch.device) -> dict[str, torch.Tensor | None]:
        """Every field on the device (copies queued without waiting), by name."""
        out = {}
        for f in _FIELDS:
            x = getattr(self, f.name)
            if isinstance(x, list) and x:  # (through numpy: a third of torch's time on ints)
                x = torch.from_numpy(np.array(x))
            if x is not None:
                x = torch.as_tensor(x).to(device=device, dtype=f.metadata["dtype"],
                                          non_blocking=True)
            out[f.name] = x
        return out


_FIELDS = fields(DecoderInputs)  # looked up once: the per-step path reads them
_OPTIONAL = tuple(f for f in _FIELDS if f.metadata["optional"])


def input_fields() -> tuple:
    return _FIELDS


def optional_fields() -> tuple:
    return _OPTIONAL


@dataclass
class ForwardBatch(DecoderInputs):
    """A decoder forward (EXTEND or DECODE) on the device: the `DecoderInputs` fields as
    device tensors, their host copy (backends size grids and loop from it), the pools and the
    attention backend, which adds its metadata (`init_forward_metadata`). Every layer gets
    this object as an argument."""

    forward_mode: ForwardMode = ForwardMode.DECODE
    host: DecoderInputs | None = None
    req_to_token_pool: ReqToTokenPool | None = None
    token_to_kv_pool: TokenToKVPool | None = None
    cross_kv_pool: CrossKVPool | None = None
    attn_backend: Any = None  # the AttentionBackend (base.py imports this module)
    attn_metadata: Any = None  # set by the attention backend


@dataclass
class EncodeForwardBatch:
    """An encoder forward on the device: new encoder inputs, packed, and the cross K/V slots
    their outputs (and cached outputs only to project) are written to."""

    token_ids: torch.Tensor | None  # [tokens] text encoders' packed token ids
    model_input: Any  # a model's own encoder input (Mllama: its images), or None
    segment_lens: list[int]  # tokens of each new input's output (host)
    cross_out_loc: torch.Tensor  # [new + cached tokens] CrossKVPool slots
    cached_hidden: torch.Tensor | None  # cached encoder outputs to project only
    cross_kv_pool: CrossKVPool | None = None
    attn_backend: Any = None
    attn_metadata: Any = None
    forward_mode = ForwardMode.ENCODE

    @property
    def has_new_inputs(self) -> bool:
        return self.token_ids is not None or self.model_input is not None
