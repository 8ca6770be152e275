"""The token embedding and the LM head split over tensor-parallel ranks by vocabulary rows.

Rank r holds rows [r * per_rank, (r + 1) * per_rank) of the table, per_rank = ceil(vocab /
tp_size): the last rank's rows past the vocabulary are zeros (the loader fills only the rows
the checkpoint has). The embedding looks up the ids in its range and sums over ranks (the
others contribute zeros); the head computes its rows' logits and gathers them from every rank,
so that each rank holds the full logits and samples as at tp_size 1. At tp_size 1 both are the
plain layers (`embedding`, `lm_head`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seq2serve.models import parallel_state
from seq2serve.models.linear import Linear


def _rows_per_rank(vocab: int, size: int) -> int:
    return -(-vocab // size)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        tp = parallel_state.tensor_parallel()
        rows = _rows_per_rank(vocab, tp.size)
        self.start, self.end = tp.rank * rows, (tp.rank + 1) * rows
        self.weight = nn.Parameter(torch.empty(rows, dim), requires_grad=False)
        self.tp_dims = {"weight": 0}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.end)
        x = F.embedding((ids - self.start).masked_fill(outside, 0), self.weight)
        return parallel_state.all_reduce(x.masked_fill(outside[..., None], 0.0))


class LMHead(Linear):
    """The LM head at tp_size 1: logits by the ops' `logits` (a padded head's are a view of
    the padded product, its columns cut off without a copy), `bias` (BART's
    final_logits_bias) added after the product. Either way the logits may be strided."""

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.ops.logits(x, self.weight, bias)


class VocabParallelLMHead(Linear):
    """Logits of this rank's vocabulary rows, gathered into the full [tokens, vocab] (a view:
    the last rank's rows past the vocabulary cut off); `bias` added to them."""

    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__(dim, _rows_per_rank(vocab, parallel_state.tensor_parallel().size))
        self.vocab = vocab
        self.tp_dims = {"weight": 0}

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        logits = parallel_state.all_gather_last(self.ops.linear(x, self.weight))
        logits = logits[..., :self.vocab]
        return logits if bias is None else logits + bias


def embedding(vocab: int, dim: int) -> nn.Module:
    """The token embedding: split by vocabulary rows over the tensor-parallel ranks."""
    if parallel_state.tensor_parallel().size == 1:
        emb = nn.Embedding(vocab, dim)
        emb.weight.requires_grad_(False)
        return emb
    return VocabParallelEmbedding(vocab, dim)


def lm_head(dim: int, vocab: int) -> Linear:
    """The LM head: split by vocabulary rows, its logits gathered on every rank."""
    if parallel_state.tensor_parallel().size == 1:
        return LMHead(dim, vocab)
    return VocabParallelLMHead(dim, vocab)
