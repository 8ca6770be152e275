"""The columns of a batch's sampling that depend only on which rows it has (their sampling
params, whether they want log-probs), and a memo that keeps them while the same rows come back.

A decode batch keeps its rows step after step (a beam group's rows for its whole search), and
these columns were made again from every row at every step: at 2,048 beam rows about a fifth
of the host's step. `SamplingMemo` keeps the last batch's columns (their device tensors
included) and gives them again while the rows are the same objects in the same order; what
moves with every step (tokens generated, bans, forced EOS, noise keys, penalties' histories)
is made by `SamplingBatch.from_reqs` each time."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import torch

from seq2serve.runtime.config.sampling_params import SamplingParams

_PARAMS = attrgetter("sampling_params")
_RETURN_LOGPROB = attrgetter("return_logprob")
_TOP_LOGPROBS_NUM = attrgetter("top_logprobs_num")


@dataclass
class ParamColumns:
    """The sampling columns of each distinct SamplingParams object of a batch, computed once
    each (a beam group's rows share one, and so do many requests), and which one each row
    has: `row(values)` spreads a per-object column over the rows."""

    params: list[SamplingParams]  # the distinct objects
    which: np.ndarray  # [B] each row's index into `params`
    greedy: list[bool]  # greedy or beam (no random numbers)
    temperatures: list[float]  # 1.0 for greedy ones (they take the argmax)
    top_ks: list[int]  # vocab size where disabled
    top_ps: list[float]
    min_ps: list[float]
    filtered: list[bool]  # sampled with a top-k / top-p / min-p rule
    min_new: list[int]
    max_new: list[int]

    @classmethod
    def of(cls, sps: list[SamplingParams], vocab_size: int) -> ParamColumns:
        # the objects by identity (all alive in `sps`, so no id is reused meanwhile)
        ids = np.fromiter(map(id, sps), dtype=np.int64, count=len(sps))
        _, first, which = np.unique(ids, return_index=True, return_inverse=True)
        params = [sps[i] for i in first.tolist()]
        greedy = [sp.is_greedy or sp.is_beam for sp in params]
        top_ks = [sp.top_k_or_none or vocab_size for sp in params]
        top_ps = [sp.top_p for sp in params]
        min_ps = [sp.min_p for sp in params]
        return cls(params, which, greedy,
                   [1.0 if g else sp.temperature for g, sp in zip(greedy, params)],
                   top_ks, top_ps, min_ps,
                   [not g and (k < vocab_size or p < 1.0 or m > 0.0)
                    for g, k, p, m in zip(greedy, top_ks, top_ps, min_ps)],
                   [sp.min_new_tokens for sp in params], [sp.max_new_tokens for sp in params])

    def row(self, values: list, dtype=np.int64) -> np.ndarray:
        """A per-object column as a per-row array."""
        return np.array(values, dtype=dtype)[self.which]


@dataclass
class FixedColumns:
    """What a batch's rows give its sampling, fixed while the rows are: the params of each row,
    the per-row arrays the step's rules compare with, and the SamplingBatch fields made of them
    alone (`fields`, tensors on the device)."""

    reqs: list  # the rows (held: no row's id is reused while these columns are kept)
    device: str
    vocab_size: int
    sps: list[SamplingParams]  # each row's
    cols: ParamColumns
    min_new: np.ndarray  # [B] each row's min_new_tokens
    max_new: np.ndarray  # [B] each row's max_new_tokens
    ngram: bool  # a row has no_repeat_ngram_size
    stamped: list[int]  # the rows whose params ask for timestamps
    penalized: bool  # a row has a repetition / frequency / presence penalty
    seeded: bool  # a sampled row has a seed
    fields: dict

    @classmethod
    def of(cls, reqs: list, vocab_size: int, device: str) -> FixedColumns:
        sps = list(map(_PARAMS, reqs))
        cols = ParamColumns.of(sps, vocab_size)

        def col(values, dtype=torch.float32):
            return torch.tensor(values, dtype=dtype).view(-1, 1).to(device, non_blocking=True)

        greedy = cols.row(cols.greedy, np.bool_)  # beams draw no random numbers
        top_ks = cols.row(cols.top_ks)
        filtered = cols.row(cols.filtered, np.bool_)
        widths = [k for f, k in zip(cols.filtered, cols.top_ks) if f]
        seeded = not all(cols.greedy) and any(sp.seed is not None and not g
                                              for sp, g in zip(cols.params, cols.greedy))
        penalized = any(sp.has_penalties for sp in cols.params)
        stamped = ([i for i, sp in enumerate(sps) if sp.timestamps]
                   if any(sp.timestamps for sp in cols.params) else [])
        want = any(map(_RETURN_LOGPROB, reqs))
        fields = dict(
            temperatures=col(cols.row(cols.temperatures, np.float32)),
            greedy=torch.from_numpy(greedy).to(device, non_blocking=True),
            all_greedy=bool(greedy.all()),
            top_ks=torch.from_numpy(top_ks).to(device, non_blocking=True)
            if (top_ks < vocab_size).any() else None,
            top_ps=col(cols.row(cols.top_ps, np.float32))
            if any(p < 1.0 for p in cols.top_ps) else None,
            min_ps=col(cols.row(cols.min_ps, np.float32))
            if any(p > 0.0 for p in cols.min_ps) else None,
            filtered=torch.from_numpy(filtered).to(device, non_blocking=True)
            if filtered.any() else None,
            filter_width=max(widths) if widths and max(widths) < vocab_size else None,
            seeded=seeded,
            repetition=col([sp.repetition_penalty for sp in sps]) if penalized else None,
            frequency=col([sp.frequency_penalty for sp in sps]) if penalized else None,
            presence=col([sp.presence_penalty for sp in sps]) if penalized else None,
            want_logprobs=want,
            # (read only with log-probs: top log-probs are a part of them)
            top_logprobs_num=max(map(_TOP_LOGPROBS_NUM, reqs), default=0) if want else 0,
        )
        return cls(list(reqs), device, vocab_size, sps, cols, cols.row(cols.min_new),
                   cols.row(cols.max_new),
                   any(sp.no_repeat_ngram_size for sp in cols.params), stamped, penalized,
                   seeded, fields)


class SamplingMemo:
    """The last batch's `FixedColumns`, given again while the same rows (the same objects, in
    the same order: one identity pass over the rows) come on the same device. The rows'
    sampling params and log-prob wishes must not change while they are in a batch (the
    frontend sets them before the scheduler sees the request)."""

    def __init__(self) -> None:
        self.last: FixedColumns | None = None
        self.hits = 0

    def columns(self, reqs: list, vocab_size: int, device: str) -> FixedColumns:
        last = self.last
        if (last is not None and len(last.reqs) == len(reqs) and last.device == device
                and last.vocab_size == vocab_size
                and all(map(operator.is_, last.reqs, reqs))):
            self.hits += 1
            return last
        self.last = FixedColumns.of(reqs, vocab_size, device)
        return self.last

    def clear(self) -> None:
        """Let go of the last batch's rows (the scheduler has no running request)."""
        self.last = None
