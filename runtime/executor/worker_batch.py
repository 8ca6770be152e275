"""The worker's batch types, one per stage, as the scheduler builds them (host data), and
their upload to the device as what the layers see.

- `DecoderBatch`: an EXTEND or DECODE forward: its `DecoderInputs` and how to sample.
- `EncodeBatch`: an ENCODE forward: new encoder inputs and the cross K/V slots to fill.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from seq2serve.runtime.attention.forward_batch import (
    DecoderInputs,
    EncodeForwardBatch,
    ForwardBatch,
    ForwardMode,
    input_fields,
)

if TYPE_CHECKING:
    from seq2serve.runtime.attention.base import AttentionBackend
    from seq2serve.runtime.executor.sampling_batch import SamplingBatch


@dataclass
class DecoderBatch:
    forward_mode: ForwardMode  # EXTEND or DECODE
    inputs: DecoderInputs  # on the host
    sampling: SamplingBatch | None = None  # None: plain greedy for every request
    # decode with the overlap scheduler: the input tokens of the first rows (those that
    # continue the step before), still on the device (sampled by that step, not yet seen by
    # the host); they replace the first rows of inputs.input_ids, the other rows' (fresh rows,
    # such as a request admitted this step) come from the host
    input_ids_device: torch.Tensor | None = None
    input_logprobs: InputLogprobRows | None = None  # EXTEND: decoder inputs to score

    @property
    def batch_size(self) -> int:
        return self.inputs.batch_size


@dataclass
class InputLogprobRows:
    """Which of an EXTEND batch's new tokens to score: the log-prob of `targets[i]` under the
    logits of new token `rows[i]` (the token before it), in float32."""

    rows: torch.Tensor  # [n] int64: indices into the batch's new tokens
    targets: torch.Tensor  # [n] int64: the token ids scored


@dataclass
class EncodeBatch:
    token_ids: torch.Tensor | None  # [tokens] int64, packed: text inputs to encode
    model_input: Any  # the model's own batch of non-text inputs (has `.to(device)`), or None
    segment_lens: list[int]  # output tokens of each input to encode
    cross_out_loc: torch.Tensor  # CrossKVPool slots: the encoded inputs', then the projected
    cached_hidden: torch.Tensor | None = None  # cached encoder outputs to project only


def to_forward_batch(b: DecoderBatch, device: str, pools: dict[str, Any],
                     attn_backend: AttentionBackend) -> ForwardBatch:
    """The batch on the device (copies queued without waiting), as the layers read it."""
    dev = b.inputs.upload(device)
    if b.input_ids_device is not None:
        dev["input_ids"] = with_device_ids(dev["input_ids"], b.input_ids_device)
    return ForwardBatch(**dev, forward_mode=b.forward_mode, host=b.inputs,
                        req_to_token_pool=pools["req_to_token"],
                        token_to_kv_pool=pools.get("token_to_kv"),
                        cross_kv_pool=pools.get("cross_kv"), attn_backend=attn_backend)


def with_device_ids(host_ids: torch.Tensor, device_ids: torch.Tensor) -> torch.Tensor:
    """A batch's input ids: `device_ids` for its first rows, then the rest of `host_ids`
    (already on the device: a device-side copy, nothing waits)."""
    n = device_ids.numel()
    if n == host_ids.numel():
        return device_ids
    return torch.cat([device_ids, host_ids[n:]])


def to_encode_forward_batch(b: EncodeBatch, device: str, pools: dict[str, Any],
                            attn_backend: AttentionBackend) -> EncodeForwardBatch:
    def dev(x: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
        return None if x is None else x.to(device=device, dtype=dtype, non_blocking=True)

    return EncodeForwardBatch(
        token_ids=dev(b.token_ids, torch.int64),
        model_input=None if b.model_input is None else b.model_input.to(device),
        segment_lens=list(b.segment_lens), cross_out_loc=dev(b.cross_out_loc, torch.int64),
        cached_hidden=b.cached_hidden, cross_kv_pool=pools.get("cross_kv"),
        attn_backend=attn_backend)


def decode_rows(b: DecoderBatch) -> tuple[DecoderBatch, torch.Tensor]:
    """A short EXTEND batch recast as a DECODE batch of one row per new token, so that it can
    replay the decode CUDA graphs. The row of a token at position p reads keys [0, p] of its
    request's table row; every layer writes the K/V of all rows before any row attends, so
    those keys are the prefix and the earlier new tokens: causal attention, exactly. Token
    fields are per row already; request fields repeat for each of the request's tokens.
    Returns the batch and the row of each request's last token (the rows to sample)."""
    x = b.inputs
    lens = torch.tensor(x.extend_lens)
    per_row = {f.name: torch.tensor(getattr(x, f.name)).repeat_interleave(lens).tolist()
               for f in input_fields() if f.metadata["per"] == "request"}
    per_row["seq_lens"] = (x.positions + 1).tolist()
    per_row["extend_lens"] = [1] * len(x.positions)
    rows = DecoderBatch(ForwardMode.DECODE, replace(x, **per_row),
                        input_ids_device=b.input_ids_device)
    return rows, torch.cumsum(lens, 0) - 1
