"""StepLauncher: builds one decoder forward from the scheduler's requests and launches it.

Building a step assigns the KV slots of the tokens it computes (`ScheduleBatch`), lays its
rows out (`step_plan.lay_out`), makes the sampling batch (with the beam groups' fields) and
hands the `DecoderBatch` to the executor, which returns before the device is done. Rows that
continue the step in flight take that step's sampled tokens, and its beams' running scores,
straight from the device; fresh rows take their input from the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING

import numpy as np
import torch

from seq2serve.runtime.attention.forward_batch import ForwardMode
from seq2serve.runtime.config.timestamp_tokens import TimestampTokens
from seq2serve.runtime.executor.beam_step import BeamMoves
from seq2serve.runtime.executor.sampler import StepOutput
from seq2serve.runtime.executor.sampling_batch import SamplingBatch
from seq2serve.runtime.executor.sampling_columns import SamplingMemo
from seq2serve.runtime.scheduler.beam_search import BeamGroup
from seq2serve.runtime.scheduler.grammar_rows import grammar_masks
from seq2serve.runtime.scheduler.group_memo import GroupMemo
from seq2serve.runtime.scheduler.req import READS_HISTORY, Req
from seq2serve.runtime.scheduler.request_memory import RequestMemory
from seq2serve.runtime.scheduler.schedule_batch import ScheduleBatch, decode_batch
from seq2serve.runtime.scheduler.step_plan import (
    StepRows,
    beam_order,
    lay_out,
    plain_greedy,
)

if TYPE_CHECKING:
    from seq2serve.runtime.executor.worker_batch import DecoderBatch


_OUTPUT_IDS = attrgetter("output_ids")
_FIRST, _ROWS, _STEPS, _KV_LEN = (itemgetter(0), attrgetter("rows"), attrgetter("steps"),
                                  attrgetter("kv_len"))
_SLOT = attrgetter("slot")


def _buckets(groups: list[BeamGroup]) -> tuple[list[tuple[int, int, int]], tuple[int, ...]]:
    """(groups, rows, keep) for each run of groups of one shape (rows, keep, num_beams), and
    each run's num_beams."""
    runs = [(len(list(run)), shape)
            for shape, run in groupby([(len(g.rows), g.keep, g.num_beams) for g in groups])]
    return [(n, rows, keep) for n, (rows, keep, _) in runs], tuple(k for _, (*_, k) in runs)


def _reads_history(groups: list[BeamGroup]) -> bool:
    """Whether any group's rows read their generated tokens (fixed for a group's life)."""
    return any(map(READS_HISTORY, map(_FIRST, map(_ROWS, groups))))


@dataclass
class InFlight:
    """A batch launched on the device whose sampled tokens the host has not processed yet."""

    batch: ScheduleBatch
    pending: StepOutput | None  # its copy to the host queued (None until `late` is called)
    # a step whose sampling reads tokens the host has not read yet (grammar masks, penalties,
    # n-gram bans): its forward is queued, and this call queues its sampler once its sampling
    # batch is made again (`StepLauncher.complete`), with the beam fields of its launch
    late: Callable[[], StepOutput] | None = None
    beams: dict | None = None


class StepLauncher:
    def __init__(self, executor, memory: RequestMemory, vocab_size: int,
                 eos_ids: tuple[int, ...], device: str,
                 forced_eos: tuple[int, ...] = (),
                 begin_suppressed: tuple[int, ...] = (),
                 timestamp_tokens: TimestampTokens | None = None) -> None:
        self.executor = executor  # its launch(DecoderBatch) -> StepOutput, looked up per call
        self.memory = memory
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.device = device
        self.forced_eos = forced_eos  # the model's forced_eos_token_id(s)
        self.begin_suppressed = begin_suppressed  # tokens never a request's first (Whisper)
        self.timestamp_tokens = timestamp_tokens  # Whisper's, for rows with timestamps
        self.late_steps = 0  # steps whose sampling was made after their launch (stats)
        self._moves_memo = GroupMemo(self._fixed_moves, memory.beam_book)
        self._buckets_memo = GroupMemo(_buckets, memory.beam_book)
        self._history_memo = GroupMemo(_reads_history, memory.beam_book)
        self._order_memo = GroupMemo(beam_order, memory.beam_book)  # (of the requests)
        # the sampling columns of a batch's rows, while the same rows come again
        self.sampling_memo = SamplingMemo()

    def forget(self) -> None:
        """Let go of the rows and groups the memos keep (the scheduler has no batch)."""
        self.sampling_memo.clear()
        for memo in (self._moves_memo, self._buckets_memo, self._history_memo,
                     self._order_memo):
            memo.clear()

    def launch(self, mode: ForwardMode, reqs: list[Req], prev: InFlight | None = None,
               chunk: tuple[Req, int] | None = None) -> InFlight:
        """Build and launch a batch of `reqs`. With `prev` (the overlap schedule: the step in
        flight, whose outputs the host has not read), the requests of the batch that were in
        `prev` take its outputs on the device as their input; the others (fresh decode rows:
        one host token each) take theirs from the host. `chunk` (an EXTEND's request and the
        position its prefill stops at this step): `ScheduleBatch.extend`."""
        rows = lay_out(reqs, prev.batch.sampled if prev is not None else None,
                       self._order_memo)
        assert mode is ForwardMode.DECODE or not rows.continuing, "no mixed forward yet"
        input_ids = order = None
        if rows.continuing:
            input_ids = prev.pending.next_token_ids
            if rows.prev_rows != list(range(len(prev.batch.reqs))):
                # (a copy that does not wait for the step in flight: a blocking one, as
                # torch.tensor(..., device=) makes, synchronizes the stream on every step whose
                # batch changed, which a served load's steps nearly all are)
                order = torch.tensor(rows.prev_rows, dtype=torch.int64).to(input_ids.device,
                                                                            non_blocking=True)
                # (the rows of joining beam groups, -1: their tokens come from the host)
                input_ids = input_ids[order.clamp(min=0) if rows.joining else order]
        pending = rows.pending
        sampling, late, beams = None, False, None  # plain greedy: the argmax, nothing to build
        if not all(plain_greedy(r, p, self.forced_eos, self.begin_suppressed)
                   for r, p in zip(rows.reqs, pending)):
            beams = (self._beam_layout(rows, mode, prev, order) if rows.groups else None)
            # grammar masks, penalties and n-gram bans read every generated token: if a row's
            # last one is still on the device, they are made once the host has read it
            # (`complete`), while the forward runs
            # (the rows with a token pending are the first `rows.continuing`)
            # (a group's rows read as its first does: its groups checked by their first rows,
            # kept while the groups are the same)
            nb = rows.beam_rows
            late = ((bool(rows.groups) and rows.continuing > 0 and self._history_memo(rows.groups))
                    or any(map(READS_HISTORY, rows.reqs[nb:rows.continuing])))
            # a late step's sampling batch is made by `complete`; until then the launch needs
            # only its beam rows (whether the groups fit the CUDA graphs' cross grid)
            sampling = (None if late and beams is None
                        else self._sampling(rows.reqs, pending, beams, late, rows.groups))
        if mode is ForwardMode.DECODE:
            batch = decode_batch(rows.reqs, self.memory, sampling, rows.groups)
        else:
            batch = ScheduleBatch.extend(rows.reqs, self.memory, sampling, chunk)
        wb: DecoderBatch = batch.worker_batch
        if rows.joining:  # (the joining beam rows among the first rows: the host's tokens)
            host = wb.inputs.input_ids[:rows.continuing].to(input_ids.device, non_blocking=True)
            input_ids = torch.where(order >= 0, input_ids, host)
        wb.input_ids_device = input_ids  # the first rows' inputs; the rest are on the host
        batch.beam_groups = rows.groups
        if late:
            return InFlight(batch, None, self.executor.launch_forward(wb), beams)
        return InFlight(batch, self.executor.launch(wb))

    def complete(self, f: InFlight) -> None:
        """Queue the sampler of a step launched with late sampling fields, now that the host
        has read the step before it (its rows' last tokens are in their outputs, their
        matchers have taken them): the sampling batch is made again from the requests, as a
        step launched after that read would have it (the beam fields kept: they came from the
        device), and the step's sampling and copy back queued."""
        if f.late is None:
            return
        wb = f.batch.worker_batch
        wb.sampling = self._sampling(f.batch.reqs, 0, f.beams, False, f.batch.beam_groups)
        f.pending, f.late = f.late(), None
        self.late_steps += 1

    def _sampling(self, reqs: list[Req], pending: int | list[int], beams: dict | None,
                  late: bool, groups: list[BeamGroup] = ()) -> SamplingBatch:
        """The step's sampling batch; `late`: the grammar masks are left unfilled (and the
        history-read fields are made again by `complete`). `groups`: the batch's beam groups,
        whose rows come first."""
        if late:  # (the grammar rows alone; their masks are filled by `complete`)
            marked = [i for i, r in enumerate(reqs) if r.grammar is not None]
            grammar = (marked, None) if marked else None
        else:  # (a group's rows read as its first does: checked by groups, kept)
            nb = sum(map(len, map(_ROWS, groups)))
            history = ((bool(groups) and self._history_memo(groups))
                       or any(map(READS_HISTORY, reqs[nb:])))
            grammar = grammar_masks(reqs, self.vocab_size) if history else None
        return SamplingBatch.from_reqs(reqs, self.vocab_size, self.eos_ids, self.device,
                                       pending=pending, beams=beams, forced_eos=self.forced_eos,
                                       begin_suppressed=self.begin_suppressed, grammar=grammar,
                                       timestamp_tokens=self.timestamp_tokens,
                                       memo=self.sampling_memo,
                                       generated=_generated(reqs, groups))

    def _beam_layout(self, step: StepRows, mode: ForwardMode, prev: InFlight | None,
                     order: torch.Tensor | None) -> dict:
        """The sampler's beam fields: the buckets of equally shaped groups (in the step's
        order), the rows' running scores (the host's, or those `prev` left on the device; the
        host's for groups that join), and, in a decode step, what the device needs to choose
        the beams of groups past their first step and move their pages (`BeamMoves`), and
        each group's slot in the device's rules."""
        groups = step.groups
        buckets, ks = self._buckets_memo(groups)  # (groups, rows, keep) a run of one shape
        slots, enter = self._beam_slots(groups)
        rows = sum(n * size for n, size, _ in buckets)
        scores = prev.pending.beam_running_scores if prev is not None else None
        if (scores is not None and step.continuing
                and not (step.joining and max(step.prev_rows[:rows]) < 0)):
            if step.joining:  # (the joining groups' rows: the host's scores)
                kept = order[:rows]
                host = torch.tensor([s for g in groups for s in g.scores], dtype=torch.float32)
                host = host.to(scores.device, non_blocking=True)
                scores = scores[kept.clamp(min=0)]
                scores = torch.where(kept.view(-1, *([1] * (scores.dim() - 1))) >= 0, scores,
                                     host.view(scores.shape))
            else:
                scores = scores[order[:rows]] if order is not None else scores[:rows]
        else:
            scores = [s for g in groups for s in g.scores]
        moves = None
        if mode is ForwardMode.DECODE and any(len(g.rows) > 1 for g in groups):
            moves = self._beam_moves(groups)
        return SamplingBatch.beam_layout(scores, buckets, self.device, moves, slots, ks, enter)

    def _beam_slots(self, groups: list[BeamGroup]) -> tuple[np.ndarray, tuple[tuple, ...]]:
        """Each group's slot in the device's beam state, and the groups that enter it at this
        step (their first: no slot yet), with their rule columns, by num_beams."""
        slots = np.fromiter(map(_SLOT, groups), dtype=object, count=len(groups))
        new = np.flatnonzero(slots == None)  # noqa: E711 (an object array's None)
        entering: dict[int, list[BeamGroup]] = {}
        for i in new.tolist():
            g = groups[i]
            g.slot = slots[i] = self.memory.beam_slots.take(g.num_beams)
            entering.setdefault(g.num_beams, []).append(g)
        enter = []
        for k, gs in entering.items():
            sps = [g.rows[0].sampling_params for g in gs]
            enter.append((k, [g.slot for g in gs], [g.forced for g in gs],
                          [sp.max_new_tokens for sp in sps], [sp.early_stopping for sp in sps],
                          [sp.length_penalty for sp in sps], [tuple(g.stop_ids) for g in gs],
                          [g.keep for g in gs]))
        return slots.astype(np.int64), tuple(enter)

    def _beam_moves(self, groups: list[BeamGroup]) -> BeamMoves:
        """What the device needs to move the pages of `groups`' rows to the beams it chose:
        each row's table row and page split (the groups' fixed columns as at the step before,
        while they are the same: `_fixed_moves`)."""
        ps = self.memory.page_size
        sizes, table_rows, starts, max_beams = self._moves_memo(groups)
        # (a group's rows are in the beam book, all of one length: its first row read, in a C
        # loop; a group at its first step moves nothing)
        kv = np.fromiter(map(_KV_LEN, map(_FIRST, map(_ROWS, groups))), dtype=np.int64,
                         count=len(groups))
        length = np.repeat(np.where(sizes > 1, kv + 1, 0), sizes)
        copy_len = length % ps  # positions written in the last page after this step
        rows = torch.from_numpy(np.stack([table_rows, length - copy_len, copy_len]))
        rows = rows.to(self.device, non_blocking=True)
        return BeamMoves(rows[0], rows[1], rows[2], max(1, int(copy_len.max())), starts,
                         max_beams)

    def _fixed_moves(self, groups: list[BeamGroup]) -> tuple:
        """The columns of `_beam_moves` that stay while the groups do: row counts, table rows,
        each group's first row (on the device), most rows."""
        sizes = [len(g.rows) for g in groups]
        table_rows = np.concatenate([g.table_rows if g.table_rows is not None
                                     else np.array([g.rows[0].req_pool_idx], dtype=np.int64)
                                     for g in groups])
        starts = torch.from_numpy(np.array([0] + sizes, dtype=np.int64).cumsum())
        return (np.array(sizes, dtype=np.int64), table_rows,
                starts.to(self.device, non_blocking=True), max(sizes))


def _generated(reqs: list[Req], groups: list[BeamGroup]) -> np.ndarray | None:
    """Each row's generated tokens: a beam group's rows (first in the batch, group by group)
    all have their group's, read once a group rather than once a row (a row's tokens in the
    beam book are a view whose length is a Python call)."""
    if not groups:
        return None
    assert reqs[0] is groups[0].rows[0], "the beam rows come first"
    sizes = np.fromiter(map(len, map(_ROWS, groups)), dtype=np.int64, count=len(groups))
    # (a group in the book: its steps, which its rows' token views' lengths read, in a C
    # loop; one at its first step: its one row's list)
    done = np.fromiter(map(_STEPS, groups), dtype=np.int64, count=len(groups))
    for i in np.flatnonzero(sizes == 1).tolist():
        done[i] = len(groups[i].rows[0].output_ids)
    beam = np.repeat(done, sizes)
    rest = reqs[len(beam):]
    return np.concatenate([beam, np.fromiter(map(len, map(_OUTPUT_IDS, rest)),
                                             dtype=np.int64, count=len(rest))])
