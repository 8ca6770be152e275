"""The BART family's absolute positions: which table row each token adds to its embedding.

- Marian and Pegasus: sinusoids (sin of every even feature, then cos of every odd one),
  row = position.
- M2M100 / NLLB (fairseq): sinusoids (sin half, cos half), row = pad id + 1 + the count of
  non-pad tokens before it; a pad token reads the pad id's row (the padding row, zeros). In a
  decode step HF counts from its cache length, so a generated pad shifts nothing after it:
  row = pad id + 1 + position for every non-pad token. (Every released checkpoint has pad id 1,
  hence fairseq's "offset 2"; the rule is HF's `padding_idx + 1 + count` for any pad id.)
- mBART: a learned table, row = 2 + position, whatever the pad id (HF's fixed offset).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

LEARNED_OFFSET = 2  # mBART's table: rows 0 and 1 are never read (HF's fixed offset)


def marian_sinusoids(n_pos: int, dim: int) -> torch.Tensor:
    """HF's MarianSinusoidalPositionalEmbedding table (float64 math, then float32)."""
    j = np.arange(dim)
    angle = np.arange(n_pos)[:, None] / np.power(10000, 2 * (j // 2) / dim)[None, :]
    half = (dim + 1) // 2
    out = torch.empty(n_pos, dim)
    out[:, :half] = torch.FloatTensor(np.sin(angle[:, 0::2]))
    out[:, half:] = torch.FloatTensor(np.cos(angle[:, 1::2]))
    return out


def fairseq_sinusoids(n_pos: int, dim: int, padding_idx: int) -> torch.Tensor:
    """fairseq's (HF's M2M100SinusoidalPositionalEmbedding) table; the padding row zero."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float()
                     * -(math.log(10000) / (half - 1)))
    angle = torch.arange(n_pos, dtype=torch.int64).float()[:, None] * freq[None, :]
    out = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)
    if dim % 2:
        out = torch.cat([out, torch.zeros(n_pos, 1)], dim=1)
    out[padding_idx] = 0
    return out


def segment_positions(segment_lens: list[int], device: torch.device) -> torch.Tensor:
    """0, 1, ... within each packed segment (made on the host; uploaded pinned, so that the
    host does not wait for the device's queue)."""
    lens = torch.tensor(segment_lens, dtype=torch.int64)
    starts = torch.cumsum(lens, 0) - lens
    idx = torch.arange(int(lens.sum()), dtype=torch.int64)
    rows = idx - starts.repeat_interleave(lens)
    if torch.device(device).type == "cuda":
        return rows.pin_memory().to(device, non_blocking=True)
    return rows.to(device)


class PositionTable(nn.Module):
    """One stack's position table and its row rule (`kind`: "marian", "fairseq", "learned")."""

    def __init__(self, kind: str, max_positions: int, dim: int, padding_idx: int) -> None:
        super().__init__()
        self.kind, self.padding_idx = kind, padding_idx
        # the row of position 0
        self.offset = {"marian": 0, "learned": LEARNED_OFFSET}.get(kind, padding_idx + 1)
        # fairseq: HF sizes its table max_positions + 2 and grows it on demand past that
        self.rows = max_positions + (max(self.offset, LEARNED_OFFSET) if kind == "fairseq"
                                     else self.offset)
        self.dim = dim
        if kind == "learned":  # in the checkpoint
            self.weight = nn.Parameter(torch.empty(self.rows, dim), requires_grad=False)
        else:  # computed (init_buffers), never read from the checkpoint
            self.register_buffer("weight", torch.empty(self.rows, dim), persistent=False)

    def init_buffers(self) -> None:
        if self.kind == "learned":
            return
        table = (marian_sinusoids(self.rows, self.dim) if self.kind == "marian"
                 else fairseq_sinusoids(self.rows, self.dim, self.padding_idx))
        self.weight = table.to(self.weight.device, self.weight.dtype)

    def encoder_rows(self, token_ids: torch.Tensor, segment_lens: list[int]) -> torch.Tensor:
        """Rows of a packed encoder batch (the fairseq rule counts non-pad tokens)."""
        pos = segment_positions(segment_lens, token_ids.device)
        if self.kind != "fairseq":
            return pos + self.offset
        real = (token_ids != self.padding_idx).long()
        before = torch.cumsum(real, 0) - real  # non-pad tokens before each, whole batch
        start = before[pos.new_tensor(_segment_starts(segment_lens)).repeat_interleave(
            pos.new_tensor(segment_lens))]
        return torch.where(real.bool(), before - start + self.offset, self.padding_idx)

    def decoder_rows(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.kind == "marian":
            return positions
        rows = positions + self.offset
        if self.kind == "fairseq":
            rows = torch.where(input_ids == self.padding_idx, self.padding_idx, rows)
        return rows

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.weight[rows]


def _segment_starts(segment_lens: list[int]) -> list[int]:
    starts, at = [], 0
    for n in segment_lens:
        starts.append(at)
        at += n
    return starts
