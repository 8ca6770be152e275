"""Paged causal self-attention for decoder prompts (extend), with a cached prefix and the T5
relative position bias computed in the kernel. Batches of one query per request go to
`triton_decode.paged_decode_attention` instead."""

from __future__ import annotations

import torch

from seq2serve.runtime.kernels.position_bias import PositionBias
from seq2serve.runtime.kernels.triton_extend import extend_attention


def self_attention_extend(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                          req_to_token: torch.Tensor, req_rows: torch.Tensor,
                          seq_lens: torch.Tensor, q_starts: torch.Tensor,
                          block_req: torch.Tensor, block_start: torch.Tensor, scaling: float,
                          bias: PositionBias | None = None, softcap: float | None = None,
                          window: int | None = None) -> torch.Tensor:
    """Causal attention of packed decoder queries over their paged K/V -> [T, H * D].

    q: [T, H, D]; request i owns rows q_starts[i]:q_starts[i + 1], its last positions out of
    seq_lens[i], whose K/V (new tokens included) sit at slots req_to_token[req_rows[i], :].
    block_req/block_start: the query tiles (`triton_flash.query_blocks`), one program each.
    `window`: each query sees only the last `window` positions; `softcap`: Gemma's cap.
    """
    return extend_attention(q, k_buf, v_buf, req_to_token, req_rows, seq_lens, q_starts,
                            block_req, block_start, scaling, causal=True, bias=bias,
                            softcap=softcap, window=window)
