"""Ragged cross-attention in Triton: decoder queries over their own request's encoder K/V in the
CrossKVPool, found through the request's row of req_to_cross. Encoder lengths differ per
request and nothing is padded. An optional per-query key range (Mllama's image groups) lets
query t see only keys [kv_start[t], kv_end[t]); a query that sees no key gets zeros.

Decode (one query per request) runs the split-KV `triton_decode.paged_decode_attention` over
each request's range; extend runs `triton_extend`'s kernel (the one self-attention's extend
runs too), one program per tile of a request's queries and one query head."""

from __future__ import annotations

import torch

from seq2serve.runtime.kernels.triton_extend import extend_attention


def cross_attention_extend(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                           req_to_cross: torch.Tensor, req_rows: torch.Tensor,
                           encoder_lens: torch.Tensor, q_starts: torch.Tensor,
                           block_req: torch.Tensor, block_start: torch.Tensor, scaling: float,
                           kv_start: torch.Tensor | None = None,
                           kv_end: torch.Tensor | None = None,
                           softcap: float | None = None) -> torch.Tensor:
    """Cross-attention of packed decoder queries -> [T, H * D] in q's dtype.

    q: [T, H, D]; request i owns rows q_starts[i]:q_starts[i + 1] and attends to its
    encoder_lens[i] keys at slots req_to_cross[req_rows[i], :]; kv_start/kv_end ([T] int32,
    both or neither) narrow query t to keys [kv_start[t], kv_end[t]). block_req/block_start:
    the query tiles (`query_blocks`). `softcap`: Gemma's cap on the scores.
    """
    return extend_attention(q, k_buf, v_buf, req_to_cross, req_rows, encoder_lens, q_starts,
                            block_req, block_start, scaling, causal=False, kv_start=kv_start,
                            kv_end=kv_end, softcap=softcap)
