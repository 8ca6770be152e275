"""ScheduleBatch: the scheduler's CPU-side view of one forward over many requests.

It knows the pools (through RequestMemory), never the model. Building one assigns KV slots to
the tokens it will compute and lays the batch out for the worker (DecoderBatch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import torch

from seq2serve.encoders.encoder_input import span_at
from seq2serve.runtime.attention.forward_batch import DecoderInputs, ForwardMode
from seq2serve.runtime.executor.sampling_batch import SamplingBatch
from seq2serve.runtime.executor.worker_batch import DecoderBatch, InputLogprobRows
from seq2serve.runtime.scheduler.req import Req
from seq2serve.runtime.scheduler.request_memory import RequestMemory

_STEPS = attrgetter("steps")  # (a beam group's generated tokens, in C loops)


@dataclass
class ScheduleBatch:
    forward_mode: ForwardMode
    reqs: list[Req]
    worker_batch: DecoderBatch
    beam_groups: list = field(default_factory=list)  # in the sampler's candidate order
    # requests whose decoder input this EXTEND scores, and how many log-probs each gets
    scored: list[tuple[Req, int]] = field(default_factory=list)
    # requests whose prompt this EXTEND computes only a chunk of: their sample is not a token
    prefilling: list[Req] = field(default_factory=list)
    beam_rows: int = 0  # a decode step's first rows, its beam groups' (none takes a token alone)

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    @property
    def sampled(self) -> list[Req | None]:
        """Each row's request, None where its sample is no token (a chunk before a prompt's
        last): a step launched after this one takes no input from such a row."""
        if not self.prefilling:
            return self.reqs
        return [None if r in self.prefilling else r for r in self.reqs]

    @classmethod
    def extend(cls, reqs: list[Req], memory: RequestMemory, sampling: SamplingBatch | None,
               chunk: tuple[Req, int] | None = None) -> ScheduleBatch:
        """An EXTEND batch: every decoder token of `reqs` not yet in the KV pool (prompts,
        and everything a retracted request had); with `chunk` (request, end), that request's
        only up to position `end` (chunked prefill: its keys are the positions before `end`).
        The caller has made sure the pool has room (admission). Decode steps take
        `decode_batch`, the per-step fast path."""
        ids, positions, locs, extend_lens, new = [], [], [], [], []
        rows, targets, scored = [], [], []
        for r in reqs:
            start, end = r.kv_len, r.seq_len
            if chunk is not None and r is chunk[0]:
                end = chunk[1]
                assert start < end <= r.seq_len
            if r.wants_input_logprobs:  # token p is scored by the logits of token p - 1
                first = max(r.logprob_start_len, 1)
                later = start > r.cached_tokens  # a chunk after the first: `start` is scored
                assert later or first > start or first >= end, "a scored token's logits were cached"
                first = max(first, start + 1)
                last = min(end + 1, r.seq_len)  # (a chunk scores the next one's first token)
                offset = len(ids) - start
                rows += [offset + p - 1 for p in range(first, last)]
                targets += r.fill_ids[first:last]
                scored.append((r, max(0, last - first)))
            new.append((start, end))
            slots = memory.alloc_tokens(r, end)
            assert slots is not None, "scheduler admitted a request the KV pool cannot hold"
            ids.extend(r.fill_ids[start:end])
            positions.append(torch.arange(start, end))
            locs.append(slots)
            extend_lens.append(end - start)
        kv_start = kv_end = None
        if any(r.cross_spans is not None for r in reqs):
            kv_start, kv_end = _cross_ranges(reqs, new)
        wb = DecoderBatch(ForwardMode.EXTEND, DecoderInputs(
            input_ids=torch.tensor(ids, dtype=torch.int64),
            positions=torch.cat(positions),
            out_cache_loc=torch.cat(locs),
            cross_kv_start=kv_start,
            cross_kv_end=kv_end,
            req_pool_indices=[r.req_pool_idx for r in reqs],
            seq_lens=[end for _, end in new],
            extend_lens=extend_lens,
            encoder_lens=[r.encoder_len for r in reqs],
            cross_group_lens=[1] * len(reqs),
        ), sampling)
        if rows:
            wb.input_logprobs = InputLogprobRows(torch.tensor(rows, dtype=torch.int64),
                                                 torch.tensor(targets, dtype=torch.int64))
        prefilling = [r for r in reqs if r.kv_len < r.seq_len]  # (kv_len: where it ended)
        return cls(ForwardMode.EXTEND, reqs, wb, scored=scored, prefilling=prefilling)


def decode_batch(reqs: list[Req], memory: RequestMemory, sampling: SamplingBatch | None,
                 groups: list = ()) -> ScheduleBatch:
    """One new token for every request: the per-step fast path (one loop over the rows, one
    slot each; the rows of beam `groups`, which come first (step_plan.lay_out), as arrays
    from the beam book). The caller has made sure the pool has a page for every request that
    needs one."""
    assert not groups or reqs[0] is groups[0].rows[0], "the beam rows come first"
    # groups at their first step (one row, the user's request, not in the beam book yet: its
    # prompt's last token) come first in lay_out's shape order and take the per-row path
    booked = [g for g in groups if g.table_rows is not None]
    lead = len(groups) - len(booked)
    assert all(len(g.rows) == 1 for g in groups[:lead]), "first steps lead the beam rows"
    beam = _beam_columns(booked, memory) if booked else None
    nb = len(beam[0]) if beam is not None else 0
    plain = reqs[:lead] + reqs[lead + nb:] if lead else reqs[nb:]
    positions = [r.kv_len for r in plain]
    locs = memory.alloc_next(plain)
    assert locs is not None, "scheduler decoded a request the KV pool cannot hold"
    ids, encoder_lens = [], []
    for r in plain:
        ids.append((r.output_ids or r.decoder_input_ids)[-1])
        encoder_lens.append(r.encoder_len)
    starts, ends = [], []
    if any(r.cross_spans is not None for r in plain):
        for r, pos in zip(plain, positions):
            s, e = span_at(r.cross_spans, pos) if r.cross_spans is not None else (
                0, r.encoder_len)
            starts.append(s)
            ends.append(e)
    at = np.array(positions, dtype=np.int64)  # (for the tensor and the new lengths both)
    groups_col = [1] * len(plain)
    table_rows = [r.req_pool_idx for r in plain]
    ranged = bool(starts)
    if beam is not None:
        b_ids, b_at, b_slots, b_enc, b_groups, b_rows, b_spans = beam
        ranged = ranged or b_spans is not None
        if ranged:  # (rows without spans read their whole encoder output)
            b_spans = b_spans if b_spans is not None else (np.zeros_like(b_enc), b_enc)
            if not starts:
                starts, ends = [0] * len(plain), [r.encoder_len for r in plain]
        if ranged:
            starts = starts[:lead] + b_spans[0].tolist() + starts[lead:]
            ends = ends[:lead] + b_spans[1].tolist() + ends[lead:]
        # (the columns that become tensors stay arrays: no list round trip; the book's rows
        # after the `lead` first-step rows)
        ids, locs = np.array(ids, dtype=np.int64), np.array(locs, dtype=np.int64)
        ids = np.concatenate([ids[:lead], b_ids, ids[lead:]])
        at = np.concatenate([at[:lead], b_at, at[lead:]])
        locs = np.concatenate([locs[:lead], b_slots, locs[lead:]])
        encoder_lens = encoder_lens[:lead] + b_enc.tolist() + encoder_lens[lead:]
        groups_col = groups_col[:lead] + b_groups.tolist() + groups_col[lead:]
        table_rows = table_rows[:lead] + b_rows.tolist() + table_rows[lead:]
    wb = DecoderBatch(ForwardMode.DECODE, DecoderInputs(
        input_ids=_int64(ids),
        positions=torch.from_numpy(at),
        out_cache_loc=_int64(locs),
        cross_kv_start=torch.tensor(starts, dtype=torch.int32) if ranged else None,
        cross_kv_end=torch.tensor(ends, dtype=torch.int32) if ranged else None,
        req_pool_indices=table_rows,
        seq_lens=(at + 1).tolist(),  # (their kv_len now)
        extend_lens=[1] * len(reqs),
        encoder_lens=encoder_lens,
        cross_group_lens=groups_col,
    ), sampling)
    return ScheduleBatch(ForwardMode.DECODE, reqs, wb, beam_rows=lead + nb)


def _beam_columns(groups: list, memory: RequestMemory) -> tuple:
    """The decode columns of the beam groups' rows, from the beam book: input ids (each row's
    last token), positions, slots (a page more for the groups at a page boundary), encoder
    lengths, cross groups (the group's row count on its first row, 0 on the others: they
    read their group's cross K/V), table rows, and cross ranges (None without spans)."""
    book = memory.beam_book
    sizes, rows, group_of = book.rows_of(groups)
    enc, spanned = book.heads_of(groups)
    # each group's position (before the slots move it) and generated tokens: a group's rows
    # are all alike, its first row read
    lengths = np.fromiter((g.rows[0].kv_len for g in groups), dtype=np.int64,
                          count=len(groups))
    steps = np.fromiter(map(_STEPS, groups), dtype=np.int64, count=len(groups))
    slots = memory.alloc_beam_next(groups, lengths)
    assert slots is not None, "scheduler decoded a beam group the KV pool cannot hold"
    ids = book.tokens[rows, steps[group_of] - 1]
    first = np.cumsum(sizes) - sizes
    cross_groups = np.zeros(len(rows), dtype=np.int64)
    cross_groups[first] = sizes
    spans = None
    if spanned:
        heads = [g.rows[0] for g in groups]
        ranges = [span_at(h.cross_spans, n) if h.cross_spans is not None
                  else (0, h.encoder_len) for h, n in zip(heads, lengths.tolist())]
        spans = tuple(np.repeat(np.array(c, dtype=np.int64), sizes) for c in zip(*ranges))
    return ids, lengths[group_of], slots, enc[group_of], cross_groups, rows, spans


def _int64(values: list[int] | np.ndarray) -> torch.Tensor:
    """A CPU int64 tensor of `values` (through numpy: a third of torch.tensor's time on a
    list)."""
    return torch.from_numpy(np.asarray(values, dtype=np.int64))


def _cross_ranges(reqs: list[Req], spans_of: list[tuple[int, int]]) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """Each new token's readable cross K/V range [start, end); `spans_of` gives each request's
    new decoder positions [first, end)."""
    starts, ends = [], []
    for r, (first, last) in zip(reqs, spans_of):
        for p in range(first, last):
            s, e = span_at(r.cross_spans, p) if r.cross_spans is not None else (0, r.encoder_len)
            starts.append(s)
            ends.append(e)
    return torch.tensor(starts, dtype=torch.int32), torch.tensor(ends, dtype=torch.int32)
