"""ModelWorkerBatch: everything the worker needs for one forward, as the scheduler builds it
(CPU data), and its upload to the device as a ForwardBatch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from seq2serve.runtime.attention.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from seq2serve.runtime.attention.base import AttentionBackend
    from seq2serve.runtime.executor.sampling_batch import SamplingBatch


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
    encoder_images: Any = None  # the model's own encoder input (Mllama: an ImageBatch)
    cached_hidden: torch.Tensor | None = None  # cached encoder outputs to project only (device)
    cross_out_loc: torch.Tensor | None = None  # [encoder tokens] int32, CrossKVPool slots

    @property
    def batch_size(self) -> int:
        return len(self.encoder_lens)


def to_forward_batch(b: ModelWorkerBatch, device: str, pools: dict[str, Any],
                     attn_backend: AttentionBackend) -> ForwardBatch:
    """The batch on the device (copies queued without waiting), as the layers read it."""
    def dev(x: Any, dtype: torch.dtype) -> torch.Tensor | None:
        if x is None:
            return None
        t = x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=dtype)
        return t.to(device=device, dtype=dtype, non_blocking=True)

    fb = ForwardBatch(
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
