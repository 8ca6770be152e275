"""ModelWorkerBatch (CPU view a worker needs) and ForwardBatch (device tensors + metadata)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
    from seq2serve.encoders.encoder_input import ImageBatch
    from seq2serve.runtime.attention.base import AttentionBackend
    from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool
    from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool
    from seq2serve.runtime.sampling_batch import SamplingBatch


class ForwardMode(enum.Enum):
    ENCODE = "encode"  # encoder over new inputs, then cross K/V written to the CrossKVPool
    EXTEND = "extend"  # decoder prompt tokens (prefill), possibly many per request
    DECODE = "decode"  # one token for every running request
    IDLE = "idle"


@dataclass
class ModelWorkerBatch:
    """Everything a worker needs for one forward, as CPU data (set by ScheduleBatch)."""

    forward_mode: ForwardMode
    # decoder side (EXTEND / DECODE)
    input_ids: torch.Tensor | None = None  # [tokens] int64
    positions: torch.Tensor | None = None  # [tokens] int64, decoder position of each token
    out_cache_loc: torch.Tensor | None = None  # [tokens] int32, TokenToKVPool slot of each
    req_pool_indices: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)  # decoder length after this forward
    extend_lens: list[int] = field(default_factory=list)  # query tokens of each request
    encoder_lens: list[int] = field(default_factory=list)  # cross K/V length of each request
    sampling: SamplingBatch | None = None
    # decode with the overlap scheduler: the input tokens, still on the device (sampled by the
    # step before, not yet seen by the host); replaces input_ids
    input_ids_device: torch.Tensor | None = None
    # optional cross-attention mask hook: query i may attend only to the cross keys
    # [cross_kv_start[i], cross_kv_end[i]) of its request; an empty range gives a zero output.
    # Set when a request restricts what each token sees (Mllama's image groups).
    cross_kv_start: torch.Tensor | None = None  # [tokens] int32
    cross_kv_end: torch.Tensor | None = None  # [tokens] int32
    # encoder side (ENCODE)
    encoder_input_ids: torch.Tensor | None = None  # [encoder tokens] int64, packed
    encoder_images: ImageBatch | None = None  # images for a vision encoder
    cached_hidden: torch.Tensor | None = None  # cached encoder outputs to project only (device)
    cross_out_loc: torch.Tensor | None = None  # [encoder tokens] int32, CrossKVPool slots

    @property
    def batch_size(self) -> int:
        return len(self.encoder_lens)


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
    encoder_images: ImageBatch | None
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
    attn_backend: AttentionBackend
    attn_metadata: Any = None  # set by the attention backend

    @classmethod
    def from_worker_batch(cls, b: ModelWorkerBatch, device: str, pools: dict[str, Any],
                          attn_backend: AttentionBackend) -> ForwardBatch:
        def dev(x: Any, dtype: torch.dtype) -> torch.Tensor | None:
            if x is None:
                return None
            t = x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=dtype)
            return t.to(device=device, dtype=dtype, non_blocking=True)

        fb = cls(
            forward_mode=b.forward_mode,
            batch_size=b.batch_size,
            input_ids=(b.input_ids_device if b.input_ids_device is not None
                       else dev(b.input_ids, torch.int64)),
            positions=dev(b.positions, torch.int64),
            out_cache_loc=dev(b.out_cache_loc, torch.int64),
            req_pool_indices=dev(b.req_pool_indices, torch.int64),
            seq_lens=dev(b.seq_lens, torch.int32),
            extend_lens=dev(b.extend_lens, torch.int32),
            encoder_lens=dev(b.encoder_lens, torch.int32),
            encoder_input_ids=dev(b.encoder_input_ids, torch.int64),
            cross_out_loc=dev(b.cross_out_loc, torch.int64),
            cross_kv_start=dev(b.cross_kv_start, torch.int32),
            cross_kv_end=dev(b.cross_kv_end, torch.int32),
            encoder_images=None if b.encoder_images is None else b.encoder_images.to(device),
            cached_hidden=b.cached_hidden,
            seq_lens_cpu=list(b.seq_lens),
            extend_lens_cpu=list(b.extend_lens),
            encoder_lens_cpu=list(b.encoder_lens),
            req_pool_indices_cpu=list(b.req_pool_indices),
            req_to_token_pool=pools["req_to_token"],
            token_to_kv_pool=pools.get("token_to_kv"),
            cross_kv_pool=pools.get("cross_kv"),
            attn_backend=attn_backend,
        )
        return fb


def decode_rows(b: ModelWorkerBatch) -> tuple[ModelWorkerBatch, torch.Tensor]:
    """A short EXTEND batch recast as a DECODE batch of one row per new token, so that it can
    replay the decode CUDA graphs. The row of a token at position p reads keys [0, p] of its
    request's table row; every layer writes the K/V of all rows before any row attends, so
    those keys are the prefix and the earlier new tokens: causal attention, exactly. Cross
    keys are per token already. Returns the batch and the row of each request's last token
    (the rows to sample)."""
    lens = torch.tensor(b.extend_lens)
    rows = ModelWorkerBatch(
        forward_mode=ForwardMode.DECODE,
        input_ids=b.input_ids,
        positions=b.positions,
        out_cache_loc=b.out_cache_loc,
        req_pool_indices=torch.tensor(b.req_pool_indices).repeat_interleave(lens).tolist(),
        seq_lens=(b.positions + 1).tolist(),
        extend_lens=[1] * len(b.positions),
        encoder_lens=torch.tensor(b.encoder_lens).repeat_interleave(lens).tolist(),
        cross_kv_start=b.cross_kv_start,
        cross_kv_end=b.cross_kv_end,
    )
    return rows, torch.cumsum(lens, 0) - 1
