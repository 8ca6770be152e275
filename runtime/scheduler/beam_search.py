"""Beam search as Hugging Face's `generate(num_beams=..., do_sample=False)` does it, one request
at a time inside the continuous batch.

A beam request is a `BeamGroup`: its rows are decoder rows of the running batch (the user's
`Req` is row 0; the others are created at its first step), and they share everything up to
where they diverge (RequestMemory.reorder_beams). Each step the sampler returns, per group, the
`keep` best (accumulated log-prob, row * vocab + token) candidates over all its rows; `advance`
applies HF's rules to them (transformers' `_beam_search`, `_get_top_k_continuations`,
`_update_finished_beams`, `_check_early_stop_heuristic`): the arithmetic is float32 as there.
`advance_groups` does it for all the groups of a step at once, with numpy over [groups, keep]
arrays; only groups where a hypothesis finishes touch their `hyps` in Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import Any

import numpy as np

from seq2serve.runtime.scheduler.group_memo import GroupMemo
from seq2serve.runtime.scheduler.req import Req

_NEG = np.float32(-1.0e9)  # HF's "never" score


@dataclass
class Hypothesis:
    score: float  # sum of log-probs / generated length ** length_penalty (float32)
    tokens: list[int]  # generated tokens, the final stop token included


@dataclass(eq=False)
class BeamGroup:
    rows: list[Req]  # the running beams; [the user's request] until its first step
    stop_ids: frozenset[int]  # tokens that end a hypothesis (EOS and stop_token_ids)
    spare_rows: list[int] = field(default_factory=list)  # table rows for rows 1.., reserved
    scores: list[float] = field(default_factory=lambda: [0.0])  # running beams' (float32)
    hyps: list[Hypothesis] = field(default_factory=list)  # finished, best first
    improvable: bool = True  # HF's is_early_stop_heuristic_unsatisfied
    done: bool = False
    peak_pages: int = 0  # most decoder KV pages the group held at once
    forced: int = 0  # forced prompt tokens HF counts as generated (TokenizedRequest.decoder_forced)
    # in the beam book (beam_book.py) from the group's first step on: its rows' table rows,
    # and, shared by every row, the tokens each generated and the pages each holds; `held`:
    # the distinct pages its rows hold past the radix-owned prefix
    table_rows: Any = None  # np.ndarray [rows] int64, or None while out of the book
    steps: int = 0
    npages: int = 0
    held: int = 0
    slot: int | None = None  # its slot in the device's beam state (beam_slots.py), once entered

    @property
    def num_beams(self) -> int:
        return self.rows[0].sampling_params.num_beams

    @cached_property
    def keep(self) -> int:
        """Candidates per step: enough that num_beams survive even if the others all stop.
        (Fixed for the group's life: its sampling params and stop ids do not change.)"""
        return max(2, 1 + len(self.stop_ids)) * self.num_beams

    @cached_property
    def rule(self) -> tuple[int, int, int, int, bool, bool]:
        """The group's fixed columns in `advance_group_arrays`: num_beams, keep, forced,
        max_new_tokens, early_stopping is True, and whether a running beam's best is judged
        at the length limit (early_stopping "never" with a positive length penalty)."""
        sp = self.rows[0].sampling_params
        return (sp.num_beams, self.keep, self.forced, sp.max_new_tokens,
                sp.early_stopping is True, sp.early_stopping == "never" and sp.length_penalty > 0)

    def spawn_rows(self, n: int) -> list[Req]:
        """`n` more rows for the group, on its reserved table rows (the scheduler runs them
        with the others; only the user's request holds the cache references)."""
        head, rows = self.rows[0], []
        for _ in range(n):
            row = Req(rid=f"{head.rid}\0beam{len(self.rows) + len(rows)}",
                      encoder_input_ids=head.encoder_input_ids,
                      decoder_input_ids=head.decoder_input_ids,
                      sampling_params=head.sampling_params, encoder_key=head.encoder_key,
                      encoder_inputs=head.encoder_inputs, cross_spans=head.cross_spans,
                      user=head.user, arrival_time=head.arrival_time)
            row.namespace, row.beam = head.namespace, self
            row.req_pool_idx = self.spare_rows.pop()
            row.prefix_pages, row.cached_tokens = head.prefix_pages, head.cached_tokens
            rows.append(row)
        return rows

    def reset(self) -> None:
        """Back to the prompt (a retracted group starts over: beam search is deterministic)."""
        self.rows = self.rows[:1]
        self.scores = [0.0]
        self.hyps, self.improvable, self.done = [], True, False
        self.steps = self.npages = self.held = 0

    def advance(self, values: list[float], flat_ids: list[int],
                vocab: int) -> list[tuple[int, int]]:
        """One step from the `keep` candidates (best first; float32 values): record the
        hypotheses that finish, and return the num_beams running beams as (row it continues,
        new token). (`advance_groups` for one group.)"""
        return advance_groups([self], values, flat_ids, vocab)[0]

    def results(self) -> list[Hypothesis]:
        """The num_return_sequences best hypotheses, best first. (Should the search end with
        fewer finished than that, the best running beams fill in, scored the same way.)"""
        sp = self.rows[0].sampling_params
        found = list(self.hyps)
        if len(found) < sp.num_return_sequences:
            n = len(self.rows[0].output_ids) + self.forced
            denom = np.float32(float(max(n, 1)) ** sp.length_penalty)
            found += sorted((Hypothesis(float(np.float32(s / denom)), list(r.output_ids))
                             for s, r in zip(self.scores, self.rows)), key=lambda h: -h.score)
        return found[:sp.num_return_sequences]


def advance_groups(groups: list[BeamGroup], values, flat_ids, vocab: int,
                   starts=None) -> list[list[tuple[int, int]]]:
    """`BeamGroup.advance` for many groups: `values`, `flat_ids` (lists or arrays) hold each
    group's `keep` candidates, best first, from `starts[i]` on for groups[i] (default: one
    after the other, in the groups' order, as the sampler returns them). Updates each group's
    `scores`, `hyps`, `improvable` and `done`; returns each group's running beams as (row it
    continues, new token). The float32 arithmetic is HF's, value for value."""
    if not groups:
        return []
    run_rows, run_toks, k = advance_group_arrays(groups, values, flat_ids, vocab, starts)
    ks = k.tolist()
    return [list(zip(r[:kk], t[:kk])) for r, t, kk in
            zip(run_rows.tolist(), run_toks.tolist(), ks)]


def advance_group_arrays(groups: list[BeamGroup], values, flat_ids, vocab: int, starts=None
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`advance_groups`, its running beams as arrays: the row each continues and its new
    token, [groups, most beams] (group i's first `k[i]` columns), and `k` (each group's
    num_beams)."""
    # (the groups' fixed columns, as at the step before while the groups are the same; per
    # group only what changes: its length, and its finished hypotheses)
    k, keep, forced, max_new, es_true, never, lps, stops = _RULES(groups)
    if starts is None:
        starts = np.concatenate(([0], np.cumsum(keep)[:-1]))
    starts = np.asarray(starts, dtype=np.int64)
    width, kb = int(keep.max()), int(k.max())
    col = np.arange(width)
    valid = col[None, :] < keep[:, None]
    idx = np.where(valid, starts[:, None] + col[None, :], 0)
    vals = np.asarray(values, dtype=np.float32)[idx]  # (float32 values: exact)
    flat = np.asarray(flat_ids, dtype=np.int64)[idx]
    row, tok = flat // vocab, flat % vocab

    # generated each (a group in the beam book: its steps, which its rows' token views'
    # lengths read; before its first step the head's list)
    n = np.fromiter((g.steps if g.table_rows is not None else len(g.rows[0].output_ids)
                     for g in groups), dtype=np.int64, count=len(groups)) + 1
    generated = n + forced  # as HF counts them (its forced first token included)
    if stops.ndim == 1:  # (every group's stop ids the same: the usual case)
        ends = np.isin(tok, stops)
    else:
        ends = (tok[:, :, None] == stops[:, None, :]).any(-1)
    ends |= (n >= max_new)[:, None]
    ends |= ~valid  # padding: after every real candidate, never chosen (keep >= num_beams)

    # the running beams: the best candidates that did not stop (those that did, scored -1e9,
    # only if too few did not)
    run = np.argsort(ends, axis=1, kind="stable")[:, :kb]
    run_vals = np.take_along_axis(vals, run, 1)
    scores = np.where(np.take_along_axis(ends, run, 1), run_vals + _NEG, run_vals)

    # finished hypotheses: stopping candidates among the top num_beams, while they can still
    # matter
    top = ends[:, :kb] & (col[None, :kb] < k[:, None])
    improvable = np.fromiter(map(_IMPROVABLE, groups), dtype=bool, count=len(groups))
    was_improvable = improvable.copy()
    nhyps = np.fromiter((len(g.hyps) for g in groups), dtype=np.int64, count=len(groups))
    full = nhyps == k
    for i in np.flatnonzero(top.any(1) & improvable & ~(full & es_true)).tolist():
        g, kk = groups[i], int(k[i])
        denom = np.float32(float(generated[i]) ** lps[i])
        cands = np.flatnonzero(top[i]).tolist()
        rows_i, toks_i = row[i].tolist(), tok[i].tolist()
        for c in cands:
            g.hyps.append(Hypothesis(float(vals[i, c] / denom),
                                     g.rows[rows_i[c]].output_ids + [toks_i[c]]))
        g.hyps.sort(key=lambda h: -h.score)
        del g.hyps[kk:]
        nhyps[i] = len(g.hyps)

    # can a running beam still beat the worst finished one?
    # (Python's float power, as HF's: once per distinct (length, penalty) of the step)
    lengths = np.where(never, max_new + forced, generated)
    if len(set(lps)) == 1:  # (one length penalty: the usual case)
        uniq, inv = np.unique(lengths, return_inverse=True)
        best_den = np.array([float(x) ** lps[0] for x in uniq.tolist()])[inv]
        best_den = best_den.astype(np.float32)
    else:
        pairs = list(zip(lengths.tolist(), lps))
        powers = {p: float(p[0]) ** p[1] for p in set(pairs)}
        best_den = np.array([powers[p] for p in pairs]).astype(np.float32)
    best = scores[:, 0] / best_den
    full = nhyps == k
    worst = np.full(len(groups), _NEG, dtype=np.float32)
    for i in np.flatnonzero(full).tolist():
        worst[i] = groups[i].hyps[-1].score
    improvable &= best > worst
    open_beam = ~(full & es_true)
    done = ~(improvable & open_beam & ~ends.all(1))

    # (a group's flags change once or never: written where they do; its scores every step)
    for i in np.flatnonzero(improvable != was_improvable).tolist():
        groups[i].improvable = bool(improvable[i])
    was_done = np.fromiter(map(_DONE, groups), dtype=bool, count=len(groups))
    for i in np.flatnonzero(done != was_done).tolist():
        groups[i].done = bool(done[i])
    if (k == kb).all():  # (every group's num_beams the same: its row of scores whole)
        for g, sc in zip(groups, scores.tolist()):
            g.scores = sc
    else:
        for g, sc, kk in zip(groups, scores.tolist(), k.tolist()):
            g.scores = sc[:kk]
    return np.take_along_axis(row, run, 1), np.take_along_axis(tok, run, 1), k


def follow_device_rules(groups: list[BeamGroup], parents: np.ndarray, tokens: np.ndarray,
                        scores: np.ndarray, top_ids: np.ndarray, hyp_scores: np.ndarray,
                        done: np.ndarray, vocab: int) -> np.ndarray:
    """A step the device's rules made (`runtime/executor/beam_rules.py`) taken into the
    groups' books: the arrays hold each group's num_beams entries one group after another
    (`done`: one a group). Each group's running scores and `done` are set, and the candidates
    that finished a hypothesis (`hyp_scores` above -inf, among the best `top_ids`) join its
    hypotheses with their rows' tokens (before the rows follow the step). Returns each
    group's first entry's index."""
    k = np.fromiter((g.rows[0].sampling_params.num_beams for g in groups), dtype=np.int64,
                    count=len(groups))
    first = np.cumsum(k) - k
    finished = hyp_scores > float("-inf")
    if finished.any():
        hyps = np.flatnonzero(finished)
        owner = np.searchsorted(first, hyps, side="right") - 1
        rows, toks = np.divmod(top_ids[hyps], vocab)
        touched = {}
        for i, h, row, tok in zip(owner.tolist(), hyps.tolist(), rows.tolist(), toks.tolist()):
            g = groups[i]
            g.hyps.append(Hypothesis(float(hyp_scores[h]), g.rows[row].output_ids + [tok]))
            touched[i] = g
        for i, g in touched.items():
            g.hyps.sort(key=lambda h: -h.score)
            del g.hyps[int(k[i]):]
    if (k == k[0]).all():  # (one num_beams: the usual case)
        for g, sc in zip(groups, scores.reshape(len(groups), -1).tolist()):
            g.scores = sc
    else:
        for g, a, b in zip(groups, first.tolist(), (first + k).tolist()):
            g.scores = scores[a:b].tolist()
    for i in np.flatnonzero(done).tolist():
        groups[i].done = True
    return first


def _rule_columns(groups: list[BeamGroup]) -> tuple:
    """Each group's `rule` as columns, its length penalty, and its stop ids (one sorted
    array when every group has the same, else [groups, most] padded with -1)."""
    k, keep, forced, max_new, es_true, never = np.array([g.rule for g in groups],
                                                        dtype=np.int64).reshape(-1, 6).T
    lps = [g.rows[0].sampling_params.length_penalty for g in groups]
    unique = {g.stop_ids for g in groups}
    if len(unique) == 1:
        stops = np.array(sorted(next(iter(unique))), dtype=np.int64)
    else:
        stops = np.full((len(groups), max(1, max(map(len, unique)))), -1, dtype=np.int64)
        for i, g in enumerate(groups):
            stops[i, :len(g.stop_ids)] = sorted(g.stop_ids)
    return (k, keep, forced, max_new, es_true.astype(bool), never.astype(bool), lps, stops)


_IMPROVABLE, _DONE = attrgetter("improvable"), attrgetter("done")
_RULES = GroupMemo(_rule_columns)  # (a group's rule is fixed for its life: no book version)


def forget_rules() -> None:
    """Let go of the groups the rule columns' memo keeps (no group runs)."""
    _RULES.clear()
