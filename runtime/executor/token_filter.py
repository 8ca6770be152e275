"""top-k / top-p / min-p: the tokens each row may sample, as HF's warpers keep them.

Every rule keeps a prefix of the row's tokens sorted by probability, so the rows' best few
suffice when the prefix ends inside them: `topk(width)` instead of sorting the whole
vocabulary (a 128k sort per row cost ~5 ms on a CPU). The width is known on the host when
every filtering row has a top_k; otherwise a CPU tries the best `_PREFIX` and sorts all only
if some row keeps its last one (a check that waits for the values: free on a CPU, a stall on
CUDA).

CUDA, when the width is not known, sorts nothing either (a 128k sort of 64 rows cost ~1.1 ms
on an H100): every rule keeps the tokens at or above a value, and `threshold_filter` finds
each row's in one Triton kernel (runtime/kernels/triton_top_p.py: a search over the float
bits, a few passes over the row, no host sync) and keeps `probs >= threshold`. Only exact
ties part the two ways: tokens tied with a kept one are all kept there (with a top_k, more
than k of them may survive), where a sort keeps some prefix of them.
"""

from __future__ import annotations

import torch

from seq2serve.runtime.executor.sampling_batch import SamplingBatch

_PREFIX = 1024


def filter_probs(probs: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """`probs` [B, vocab] with the tokens each row's rules drop at 0 (rows without a rule as
    they were)."""
    vocab = probs.shape[-1]
    width = sb.filter_width
    guess = width is None
    if guess and probs.is_cuda:
        return threshold_filter(probs, sb)
    if guess:
        width = _PREFIX
    if width >= vocab:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        kept = sorted_p.masked_fill(~_keep(sorted_p, sb), 0.0)
    else:
        sorted_p, order = probs.topk(width, dim=-1)
        keep = _keep(sorted_p, sb)
        rows = keep[:, -1] if sb.filtered is None else keep[:, -1] & sb.filtered
        if guess and bool(rows.any()):  # a row keeps more than the prefix: sort it all
            sorted_p, order = probs.sort(dim=-1, descending=True)
            keep = _keep(sorted_p, sb)
        kept = sorted_p.masked_fill(~keep, 0.0)
    out = torch.zeros_like(probs).scatter_(1, order, kept)
    return out if sb.filtered is None else torch.where(sb.filtered[:, None], out, probs)


def threshold_filter(probs: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """`filter_probs` by each row's threshold (CUDA; the CPU tests run the kernel in Triton's
    interpreter)."""
    from seq2serve.runtime.kernels.triton_top_p import top_p_threshold

    threshold = top_p_threshold(probs, sb.top_ps, sb.top_ks, sb.min_ps)
    if sb.filtered is not None:
        threshold = threshold.masked_fill(~sb.filtered, 0.0)  # keeps all
    return probs.masked_fill(probs < threshold[:, None], 0.0)


def _keep(sorted_p: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    """Which of each row's best tokens (`sorted_p`, descending) its rules keep."""
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if sb.top_ks is not None:
        ranks = torch.arange(sorted_p.shape[-1], device=sorted_p.device)[None, :]
        keep &= ranks < sb.top_ks[:, None]
    if sb.top_ps is not None:
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
        keep &= before < sb.top_ps
    if sb.min_ps is not None:
        keep &= sorted_p >= sb.min_ps * sorted_p[:, :1]
    keep[:, 0] = True  # the most likely token always survives
    return keep
