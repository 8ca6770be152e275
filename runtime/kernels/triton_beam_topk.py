"""Beam search's candidates (runtime/executor/sampler.py `_beam_candidates` on the rows'
log-probs) straight from the model's logits: each group's best `keep` of
log_softmax(row)[token] + row's beam score, without the float32 copy of the logits, the full
log-softmax, the `+ scores` tensor, or torch's radix top-k over [groups, rows * vocab].

On an H200 at 2,048 beam rows x 250,112 tokens (mT5-large, 4 beams) torch's chain is ~11 ms a
step (the top-k over 1M-element rows alone 5.6 ms); what it must do is read the bf16 logits
(~1 GB, ~0.25 ms a pass). Here two passes read them:

1. grid (rows, chunks): each chunk's max and sum of exp(x - max), float32;
2. grid (rows, chunks): the row's lse from its chunks' partials (max M, then M + log(sum of
   s_c * exp(m_c - M))), v = (x - lse) + score in float32, suppressed tokens -inf (after the
   softmax: they count in its normalizer, as HF's NoBadWordsLogitsProcessor on log-probs),
   and the chunk's best KEEP, written to a small buffer [rows, chunks, KEEP].

Then per bucket one stable sort over [groups, rows * chunks * KEEP] (a few hundred values a
group) picks each group's best `keep`. Values equal torch's log_softmax(x.float())[t] + score
to float32 rounding (lse comes from per-chunk partials, not one sum).

Ties: among exactly equal values the lower id (row_in_group * vocab + token) comes first,
always (torch.topk leaves their order unspecified). A chunk's candidates are best first, equal
ones lower token first; chunks and rows lie in id order in the buffer; the stable sort keeps
that order among equal values. Only where a group has fewer than `keep` finite values (nearly
the whole vocabulary suppressed) are the ids of its -inf tail unspecified, as torch's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 8192  # tokens a chunk: 31 chunks of mT5's 250,112, KEEP candidates each
MAX_KEEP = 64  # a chunk's selection is KEEP passes of max + mask


@triton.jit
def _chunk_stats_kernel(logits, stride, vocab, num_chunks, maxes, sums,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits + row * stride + offs, mask=offs < vocab,
                other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # an all -inf chunk adds exp(-inf) = 0
    s = tl.sum(tl.exp(x - m_safe), 0)
    tl.store(maxes + row * num_chunks + chunk, m)
    tl.store(sums + row * num_chunks + chunk, s)


@triton.jit
def _chunk_top_kernel(logits, stride, vocab, num_chunks, maxes, sums, scores,
                      suppressed, num_suppressed, out_values, out_tokens,
                      BLOCK: tl.constexpr, CHUNKS: tl.constexpr, KEEP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    # the row's lse from its chunks' partials
    c = tl.arange(0, CHUNKS)
    m_c = tl.load(maxes + row * num_chunks + c, mask=c < num_chunks, other=float("-inf"))
    s_c = tl.load(sums + row * num_chunks + c, mask=c < num_chunks, other=0.0)
    big = tl.max(m_c, 0)
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    m_c_safe = tl.where(m_c == float("-inf"), big_safe, m_c)  # (its s_c is 0)
    lse = big + tl.log(tl.sum(s_c * tl.exp(m_c_safe - big_safe), 0))
    score = tl.load(scores + row)

    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits + row * stride + offs, mask=offs < vocab,
                other=float("-inf")).to(tl.float32)
    v = (x - lse) + score
    v = tl.where(offs < vocab, v, float("-inf"))
    for j in range(num_suppressed):
        v = tl.where(offs == tl.load(suppressed + j), float("-inf"), v)
    out = (row * num_chunks + chunk) * KEEP
    last = tl.minimum(vocab - 1, chunk * BLOCK + BLOCK - 1)
    lanes = tl.arange(0, BLOCK)
    for k in tl.static_range(KEEP):  # one (max, leftmost index) reduction a candidate
        best, at = tl.max(v, 0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(out_values + out + k, best)
        # (past the chunk's tokens, a -inf tail: a valid id)
        tl.store(out_tokens + out + k, tl.minimum(chunk * BLOCK + at, last))
        v = tl.where(lanes == at, float("-inf"), v)


def chunk_candidates(logits: torch.Tensor, scores: torch.Tensor, keep: int,
                     suppressed: torch.Tensor | None = None, block: int = BLOCK
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each chunk's best `keep` (values float32, tokens int32) of every row of `logits`
    [rows, vocab] (bf16 / fp16 / fp32): [rows, chunks, keep] each, best first, equal values
    lower token first. `scores`: [rows] or [rows, 1] float32, added to each row's log-probs;
    `suppressed`: token ids at -inf after the log-softmax."""
    assert 1 <= keep <= min(MAX_KEEP, block), keep
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    chunks = triton.cdiv(vocab, block)
    device = logits.device
    maxes = torch.empty(rows, chunks, dtype=torch.float32, device=device)
    sums = torch.empty(rows, chunks, dtype=torch.float32, device=device)
    values = torch.empty(rows, chunks, keep, dtype=torch.float32, device=device)
    tokens = torch.empty(rows, chunks, keep, dtype=torch.int32, device=device)
    if rows == 0:
        return values, tokens
    scores = scores.reshape(rows).to(torch.float32).contiguous()
    if suppressed is None or suppressed.numel() == 0:
        suppressed = torch.zeros(1, dtype=torch.int32, device=device)
        num_suppressed = 0
    else:
        suppressed = suppressed.to(torch.int32).contiguous()
        num_suppressed = suppressed.numel()
    warps = 8 if block >= 4096 else 4
    _chunk_stats_kernel[(rows, chunks)](logits, logits.stride(0), vocab, chunks, maxes, sums,
                                        BLOCK=block, num_warps=warps)
    _chunk_top_kernel[(rows, chunks)](logits, logits.stride(0), vocab, chunks, maxes, sums,
                                      scores, suppressed, num_suppressed, values, tokens,
                                      BLOCK=block, CHUNKS=triton.next_power_of_2(chunks),
                                      KEEP=keep, num_warps=warps)
    return values, tokens


def beam_topk(logits: torch.Tensor, beam_scores: torch.Tensor, buckets,
              suppressed: torch.Tensor | None = None, block: int = BLOCK,
              argmax: bool = False):
    """`_beam_candidates(log_softmax(logits.float()), ...)` with `suppressed` at -inf after the
    softmax: for each bucket (groups, rows per group, keep) in order, each group's best `keep`
    of log-prob + its row's score over its rows x vocab, best first -> (values [sum of keeps]
    float32, ids [sum of keeps] int64: row in group * vocab + token). `logits`: the beam rows
    [rows, vocab], groups in the buckets' row order; `beam_scores`: [rows, 1] float32.

    With `argmax`, also each row's best token ([rows] int64: the argmax of its log-probs + its
    score, the lower token on a tie; the row's next token where nothing chooses another)."""
    rows, vocab = logits.shape
    keep_max = max((k for _, _, k in buckets), default=1)
    values, tokens = chunk_candidates(logits, beam_scores, keep_max, suppressed, block)
    chunks = values.shape[1]
    out_values, out_ids, start = [], [], 0
    for groups, group_rows, keep in buckets:
        n = groups * group_rows
        v = values[start:start + n].view(groups, group_rows * chunks * keep_max)
        t = tokens[start:start + n].view(groups, group_rows * chunks * keep_max)
        v, order = v.sort(dim=1, descending=True, stable=True)
        v, order = v[:, :keep], order[:, :keep]
        row_in_group = order // (chunks * keep_max)
        out_values.append(v.flatten())
        out_ids.append((row_in_group * vocab + t.gather(1, order).long()).flatten())
        start += n
    assert start == rows, (start, rows)
    if not buckets:
        empty = torch.empty(0, device=logits.device)
        result = (empty, empty.long())
    else:
        result = (torch.cat(out_values), torch.cat(out_ids))
    if not argmax:
        return result
    best_chunk = values[:, :, 0].argmax(dim=1, keepdim=True)  # the first of equal maxima
    best = tokens[:, :, 0].gather(1, best_chunk).squeeze(1).long()
    return (*result, best)
