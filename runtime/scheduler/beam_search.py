"""Beam search as Hugging Face's `generate(num_beams=..., do_sample=False)` does it, one request
at a time inside the continuous batch.

A beam request is a `BeamGroup`: its rows are decoder rows of the running batch (the user's
`Req` is row 0; the others are created at its first step), and they share everything up to
where they diverge (RequestMemory.reorder_beams). Each step the sampler returns, per group, the
`keep` best (accumulated log-prob, row * vocab + token) candidates over all its rows, and HF's
rules (transformers' `_beam_search`, `_get_top_k_continuations`, `_update_finished_beams`,
`_check_early_stop_heuristic`) run on the device (`runtime/executor/beam_rules.py`); the host
takes each step's choices into the groups' books (`follow_device_rules`). The same rules on
the host, in numpy, are the tests' reference (`tests/beam_host_rules.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from seq2serve.runtime.scheduler.req import Req


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
    improvable: bool = True  # (the host reference rules' flag: tests/beam_host_rules.py)
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


def follow_device_rules(groups: list[BeamGroup], parents: np.ndarray, tokens: np.ndarray,
                        scores: np.ndarray, top_ids: np.ndarray, hyp_scores: np.ndarray,
                        done: np.ndarray, vocab: int, k: np.ndarray | None = None
                        ) -> np.ndarray:
    """A step the device's rules made (`runtime/executor/beam_rules.py`) taken into the
    groups' books: the arrays hold each group's num_beams entries one group after another
    (`done`: one a group). Each group's running scores and `done` are set, and the candidates
    that finished a hypothesis (`hyp_scores` above -inf, among the best `top_ids`) join its
    hypotheses with their rows' tokens (before the rows follow the step). Returns each
    group's first entry's index. (`k`: each group's num_beams, if the caller has them.)"""
    if k is None:
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
