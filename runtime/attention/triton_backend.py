"""The Triton backend: paged decoder self-attention and encoder attention with the T5 bias
computed in the kernels (and Gemma's sliding windows and soft-capped scores), ragged
cross-attention, split-KV decode. Runs on CUDA, and on the CPU
under TRITON_INTERPRET=1 (slowly: tests only)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from seq2serve.cross_attention.triton_beam_cross_attention import (
    beam_cross_attention_rows,
    beam_tile,
)
from seq2serve.cross_attention.triton_cross_attention import cross_attention_extend
from seq2serve.runtime.attention.base import AttentionBackend, AttentionLayer, PositionBias
from seq2serve.runtime.attention.forward_batch import (
    EncodeForwardBatch,
    ForwardBatch,
    ForwardMode,
)
from seq2serve.runtime.kernels.triton_decode import num_kv_splits, paged_decode_attention
from seq2serve.runtime.kernels.triton_encoder_attention import encoder_attention
from seq2serve.runtime.kernels.triton_flash import query_blocks
from seq2serve.runtime.kernels.triton_self_attention import self_attention_extend

_INTERPRETER_SMS = 4  # small, so CPU tests exercise split-KV decode on short contexts
_ALIGN = 4  # int32 elements in 16 bytes


@dataclass
class _Metadata:
    """What every layer's call needs, built once per batch from the host-side lengths."""

    q_starts: torch.Tensor  # [B + 1] int32 offset of each request's queries (ENCODE: tokens)
    req_rows: torch.Tensor  # [B] int32 row of each request in req_to_token / req_to_cross
    block_req: torch.Tensor  # [tiles] int32 request of each query tile (prefill kernels)
    block_start: torch.Tensor  # [tiles] int32 first query row of each tile in its request
    decode: bool  # one query per request: the split-KV decode kernel serves SELF and CROSS
    self_splits: int  # KV splits of the decode kernels
    cross_splits: int
    cross_kv_start: torch.Tensor | None  # decode: first cross key of each request, if ranged
    cross_kv_end: torch.Tensor | None  # decode: end of each request's cross keys
    # decode over beam groups (fb.cross_group_lens, each group's K/V read once): the largest
    # group the grid is planned for; 0: `paged_decode_attention` serves
    cross_beams: int = 0
    # decode: each request's first visible key under a sliding window, by window (made by the
    # first layer that asks: inside a captured graph, computed at each replay)
    window_starts: dict = field(default_factory=dict)


def packed_int32(parts: list[list[int]], device) -> list[torch.Tensor]:
    """`parts` as int32 tensors on `device` from one host-to-device copy, each starting on a
    16-byte boundary. Triton specializes a kernel on whether each pointer argument is 16-byte
    aligned: views at arbitrary offsets of one buffer (which depend on the batch size and the
    number of query tiles) made new kernel variants that compiled under load, a second each,
    in the middle of a server's run (py-spy, H100, mT5-large at 256 streams)."""
    padded = [-(-len(p) // _ALIGN) * _ALIGN for p in parts]
    flat = [x for p, n in zip(parts, padded) for x in (*p, *[0] * (n - len(p)))]
    packed = torch.tensor(flat, dtype=torch.int32).to(device, non_blocking=True)
    return [v[:len(p)] for v, p in zip(packed.split(padded), parts)]


class TritonBackend(AttentionBackend):
    def __init__(self, device: str, **_: object) -> None:
        self.device = device
        self.num_sms = _INTERPRETER_SMS
        if device.startswith("cuda"):
            self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count

    def init_forward_metadata(self, fb: ForwardBatch | EncodeForwardBatch) -> None:
        encode = fb.forward_mode is ForwardMode.ENCODE
        q_lens = fb.segment_lens if encode else fb.host.extend_lens
        decode = not encode and all(n == 1 for n in q_lens)
        starts = list(itertools.accumulate(q_lens, initial=0))
        rows = [] if encode else list(fb.host.req_pool_indices)
        block_req, block_start = ([], []) if decode else query_blocks(q_lens)
        q_starts, req_rows, block_req_t, block_start_t = packed_int32(
            [starts, rows, block_req, block_start], self.device)
        md = _Metadata(q_starts=q_starts, req_rows=req_rows, block_req=block_req_t,
                       block_start=block_start_t, decode=decode, self_splits=1,
                       cross_splits=1, cross_kv_start=None, cross_kv_end=None)
        if decode:
            batch = len(q_lens)
            if fb.token_to_kv_pool is not None:
                md.self_splits = num_kv_splits(batch, fb.token_to_kv_pool.num_kv_heads,
                                               max(fb.host.seq_lens, default=0), self.num_sms)
            if fb.cross_kv_pool is not None:
                md.cross_splits = num_kv_splits(batch, fb.cross_kv_pool.num_kv_heads,
                                                max(fb.host.encoder_lens, default=0),
                                                self.num_sms)
            # one query per request: its key range is the request's
            groups = fb.host.cross_group_lens
            beams = max(groups, default=1) if groups is not None else 1
            if beams > 1 and fb.cross_kv_pool is not None:  # a group reads its K/V once
                md.cross_beams = beams
                md.cross_splits = num_kv_splits(sum(1 for g in groups if g),
                                                fb.cross_kv_pool.num_kv_heads,
                                                max(fb.host.encoder_lens, default=0),
                                                self.num_sms)
            md.cross_kv_start = fb.cross_kv_start
            md.cross_kv_end = (fb.encoder_lens if fb.cross_kv_end is None
                               else torch.minimum(fb.encoder_lens, fb.cross_kv_end))
        fb.attn_metadata = md

    def init_graph_metadata(self, fb: ForwardBatch, self_splits: int, cross_splits: int,
                            beams: int = 0) -> None:
        """Decode metadata made only of views of `fb`'s (static) device tensors, so that a
        captured CUDA graph reads each replay's values: no host lists, no copies. `beams`:
        the graph's cross-attention reads each beam group's K/V once, for groups of up to
        `beams` rows (the batch's groups are a graph input); 0: one program per row."""
        cross_end = fb.encoder_lens
        if fb.cross_kv_end is not None:
            cross_end = torch.minimum(fb.encoder_lens, fb.cross_kv_end)
        fb.attn_metadata = _Metadata(
            q_starts=fb.positions.new_empty(0), req_rows=fb.req_pool_indices,
            block_req=fb.positions.new_empty(0), block_start=fb.positions.new_empty(0),
            decode=True, self_splits=self_splits, cross_splits=cross_splits,
            cross_kv_start=fb.cross_kv_start, cross_kv_end=cross_end,
            cross_beams=beams)

    def forward_self(self, q: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
                     position_bias: PositionBias | None) -> torch.Tensor:
        md: _Metadata = fb.attn_metadata
        k_buf = fb.token_to_kv_pool.k_buffers[layer.layer_id]
        v_buf = fb.token_to_kv_pool.v_buffers[layer.layer_id]
        req_to_token = fb.req_to_token_pool.req_to_token
        window = layer.sliding_window
        if md.decode:
            starts = None
            if window is not None:  # the last `window` positions: a key range per request
                if window not in md.window_starts:
                    md.window_starts[window] = (fb.seq_lens - window).clamp_(min=0)
                starts = md.window_starts[window]
            return paged_decode_attention(q, k_buf, v_buf, req_to_token, md.req_rows,
                                          fb.seq_lens, md.self_splits, layer.scaling,
                                          position_bias, kv_starts=starts,
                                          softcap=layer.softcap)
        return self_attention_extend(q, k_buf, v_buf, req_to_token, md.req_rows, fb.seq_lens,
                                     md.q_starts, md.block_req, md.block_start, layer.scaling,
                                     position_bias, softcap=layer.softcap, window=window)

    def forward_cross(self, q: torch.Tensor, layer: AttentionLayer,
                      fb: ForwardBatch) -> torch.Tensor:
        md: _Metadata = fb.attn_metadata
        k_buf = fb.cross_kv_pool.k_buffers[layer.layer_id]
        v_buf = fb.cross_kv_pool.v_buffers[layer.layer_id]
        req_to_cross = fb.req_to_token_pool.req_to_cross
        if md.decode and md.cross_beams:
            m_tiles = beam_tile(md.cross_beams, q.shape[1] // k_buf.shape[1])[1]
            return beam_cross_attention_rows(q, k_buf, v_buf, req_to_cross, md.req_rows,
                                             fb.cross_group_lens, md.cross_kv_end,
                                             layer.scaling, md.cross_kv_start,
                                             md.cross_splits, m_tiles, softcap=layer.softcap)
        if md.decode:
            return paged_decode_attention(q, k_buf, v_buf, req_to_cross, md.req_rows,
                                          md.cross_kv_end, md.cross_splits, layer.scaling,
                                          kv_starts=md.cross_kv_start, softcap=layer.softcap)
        return cross_attention_extend(q, k_buf, v_buf, req_to_cross, md.req_rows,
                                      fb.encoder_lens, md.q_starts, md.block_req,
                                      md.block_start, layer.scaling, fb.cross_kv_start,
                                      fb.cross_kv_end, softcap=layer.softcap)

    def forward_encoder(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        layer: AttentionLayer, fb: EncodeForwardBatch,
                        position_bias: PositionBias | None) -> torch.Tensor:
        md: _Metadata = fb.attn_metadata
        return encoder_attention(q, k, v, md.q_starts, md.block_req, md.block_start,
                                 layer.scaling, position_bias, softcap=layer.softcap,
                                 window=layer.sliding_window)
