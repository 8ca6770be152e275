"""Beam search's candidates on the CPU, as `kernels/triton_beam_topk.beam_topk` gives them on
CUDA: each group's best `keep` of log_softmax(row)[token] + the row's score, from each row's
own top-k of its logits. The row's best `keep` tokens hold every candidate of its group's
best `keep`, and log_softmax(x)[t] + score = (x[t] - lse) + score is x[t] plus a constant of
the row, so the order within a row is the logits' order: no [rows, vocab] float32 log-probs or
`+ scores` tensor is written, and the top-k runs over [groups, rows * keep] instead of
[groups, rows * vocab].

Suppressed tokens count in the normaliser and are then -inf (HF's NoBadWordsLogitsProcessor
acts on log-probs); the row's top-k takes as many more as there are suppressed tokens. Ties:
among equal values the lower id (row in group * vocab + token) comes first, as the kernel's
(a row whose equal values straddle its top-k's last place is sorted whole, stably)."""

from __future__ import annotations

import torch


def row_topk_beams(logits: torch.Tensor, beam_scores: torch.Tensor, buckets,
                   suppressed: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (values [sum of keeps] float32, ids [sum of keeps] int64, each row's best token
    [rows] int64: the argmax of its log-probs, the lower token on a tie). `logits`: the beam
    rows [rows, vocab], groups in the buckets' row order; `beam_scores`: [rows, 1] float32;
    `buckets`: (groups, rows per group, keep) in row order."""
    x = logits.float()
    rows, vocab = x.shape
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    keep_max = max((k for _, _, k in buckets), default=1)
    k = min(vocab, keep_max + (0 if suppressed is None else suppressed.numel()))
    top, tokens = x.topk(min(vocab, k + 1), dim=-1)
    if k < vocab:  # a tie across the k-th place: which of the equals topk keeps is unspecified
        tied = (top[:, k - 1] == top[:, k]).nonzero().squeeze(1)
        if tied.numel():  # those rows sorted whole, stably: equal values lower token first
            v, t = x[tied].sort(dim=-1, descending=True, stable=True)
            top[tied], tokens[tied] = v[:, :k + 1], t[:, :k + 1]
        top, tokens = top[:, :k], tokens[:, :k]
    if suppressed is not None:
        top = top.masked_fill(torch.isin(tokens, suppressed), float("-inf"))
    order = tokens.argsort(dim=1)  # each row's candidates by token, for the ties' rule
    tokens = tokens.gather(1, order)
    values = (top.gather(1, order) - lse) + beam_scores
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
