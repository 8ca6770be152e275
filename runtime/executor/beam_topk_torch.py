"""Beam search's candidates on the CPU, as `kernels/triton_beam_topk.beam_topk` gives them on
CUDA: each group's best `keep` of log_softmax(row)[token] + the row's score, from each row's
own top-k of its logits. The row's best `keep` tokens hold every candidate of its group's
best `keep`, and log_softmax(x)[t] + score is x[t] plus a constant of the row, so the order
within a row is the logits' order: the scores are added to the candidates only, no argmax
runs over the rows, and the groups' top-k runs over [groups, rows * keep] instead of
[groups, rows * vocab]. Each row's own top-k reads a max per block of tokens first
(`_row_top`). The candidates' values are HF's own: torch's log-softmax (one fused pass)
read at their tokens, plus the score.

Suppressed tokens count in the normaliser and are then -inf (HF's NoBadWordsLogitsProcessor
acts on log-probs); the row's top-k takes as many more as there are suppressed tokens. Ties:
among equal values the lower id (row in group * vocab + token) comes first, as the kernel's
(a row whose equal values straddle its top-k's last place is sorted whole, stably)."""

from __future__ import annotations

import torch

BLOCK = 64  # tokens a block of `_row_top`'s first pass


def _row_top(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k largest values and their tokens, best first, as `x.topk(k)` (equal values
    at the k-th place: any of them). torch's CPU top-k over a long row costs as much as a
    log-softmax; a max per block of BLOCK tokens costs a tenth of it. The k blocks with the
    largest maxima hold the row's k largest values (an element outside them is at most the
    least of k block maxima, each an element of its own block), so the top-k runs over those
    blocks' k x BLOCK tokens (and the tail past the last whole block)."""
    rows, vocab = x.shape
    full = vocab // BLOCK * BLOCK
    if full < 4 * k * BLOCK:
        return x.topk(k, dim=-1)
    maxima = x[:, :full].reshape(rows, full // BLOCK, BLOCK).amax(dim=-1)
    blocks = maxima.topk(k, dim=-1).indices
    cols = (blocks[:, :, None] * BLOCK + torch.arange(BLOCK, device=x.device)).flatten(1)
    if full < vocab:
        cols = torch.cat([cols, torch.arange(full, vocab, device=x.device).expand(rows, -1)], 1)
    top, pick = x.gather(1, cols).topk(k, dim=-1)
    return top, cols.gather(1, pick)


def row_topk_beams(logits: torch.Tensor, beam_scores: torch.Tensor, buckets,
                   suppressed: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (values [sum of keeps] float32, ids [sum of keeps] int64, each row's best token
    [rows] int64: the argmax of its log-probs, the lower token on a tie). `logits`: the beam
    rows [rows, vocab], groups in the buckets' row order; `beam_scores`: [rows, 1] float32;
    `buckets`: (groups, rows per group, keep) in row order."""
    x = logits.float()
    rows, vocab = x.shape
    keep_max = max((k for _, _, k in buckets), default=1)
    k = min(vocab, keep_max + (0 if suppressed is None else suppressed.numel()))
    top, tokens = _row_top(x, min(vocab, k + 1))
    if k < vocab:  # a tie across the k-th place: which of the equals topk keeps is unspecified
        tied = (top[:, k - 1] == top[:, k]).nonzero().squeeze(1)
        if tied.numel():  # those rows sorted whole, stably: equal values lower token first
            v, t = x[tied].sort(dim=-1, descending=True, stable=True)
            top[tied], tokens[tied] = v[:, :k + 1], t[:, :k + 1]
        top, tokens = top[:, :k], tokens[:, :k]
    tokens = tokens.gather(1, tokens.argsort(dim=1))  # by token, for the ties' rule
    # the log-probs as HF's chain computes them (torch's log-softmax: one fused pass, faster
    # on the CPU than logsumexp), read at the candidates only
    values = torch.log_softmax(x, dim=-1).gather(1, tokens) + beam_scores
    if suppressed is not None:
        values = values.masked_fill(torch.isin(tokens, suppressed), float("-inf"))
    best = tokens.gather(1, values.argmax(dim=1, keepdim=True)).squeeze(1)  # first maximum
    out_values, out_ids, start = [], [], 0
    for groups, group_rows, keep in buckets:
        n = groups * group_rows
        v = values[start:start + n].reshape(groups, group_rows * k)
        t = tokens[start:start + n].reshape(groups, group_rows * k)
        v, pick = v.sort(dim=1, descending=True, stable=True)
        v, pick = v[:, :keep], pick[:, :keep]
        out_values.append(v.flatten())
        out_ids.append(((pick // k) * vocab + t.gather(1, pick)).flatten())
        start += n
    assert start == rows, (start, rows)
    if not out_values:
        empty = torch.empty(0, device=x.device)
        return empty, empty.long(), best
    return torch.cat(out_values), torch.cat(out_ids), best
