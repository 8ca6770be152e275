"""Beam search as Hugging Face's `generate(num_beams=..., do_sample=False)` does it, one request
at a time inside the continuous batch.

A beam request is a `BeamGroup`: its rows are decoder rows of the running batch (the user's
`Req` is row 0; the others are created at its first step), and they share everything up to
where they diverge (RequestMemory.reorder_beams). Each step the sampler returns, per group, the
`keep` best (accumulated log-prob, row * vocab + token) candidates over all its rows; `advance`
applies HF's rules to them (transformers' `_beam_search`, `_get_top_k_continuations`,
`_update_finished_beams`, `_check_early_stop_heuristic`): the arithmetic is float32 as there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

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

    @property
    def num_beams(self) -> int:
        return self.rows[0].sampling_params.num_beams

    @property
    def keep(self) -> int:
        """Candidates per step: enough that num_beams survive even if the others all stop."""
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

    def advance(self, values: list[float], flat_ids: list[int],
                vocab: int) -> list[tuple[int, int]]:
        """One step from the `keep` candidates (best first; float32 values): record the
        hypotheses that finish, and return the num_beams running beams as (row it continues,
        new token)."""
        sp = self.rows[0].sampling_params
        k, lp = sp.num_beams, sp.length_penalty
        n = len(self.rows[0].output_ids) + 1  # tokens each candidate has generated
        generated = n + self.forced  # as HF counts them (its forced first token included)
        cands = [divmod(i, vocab) for i in flat_ids]
        if n >= sp.max_new_tokens:
            ends = [True] * len(cands)
        else:
            ends = [t in self.stop_ids for _, t in cands]

        # the running beams: the best candidates that did not stop (those that did, scored
        # -1e9, only if too few did not)
        running = [c for c, e in enumerate(ends) if not e][:k]
        scores = [values[c] for c in running]
        if len(running) < k:
            stopped = [c for c, e in enumerate(ends) if e][:k - len(running)]
            running += stopped
            scores += [float(np.float32(values[c]) + _NEG) for c in stopped]

        # finished hypotheses: stopping candidates among the top num_beams, while they can
        # still matter
        full = len(self.hyps) == k
        if any(ends[:k]) and self.improvable and not (full and sp.early_stopping is True):
            denom = np.float32(float(generated) ** lp)
            for c in range(min(k, len(cands))):
                if ends[c]:
                    row, token = cands[c]
                    self.hyps.append(Hypothesis(float(np.float32(values[c]) / denom),
                                                self.rows[row].output_ids + [token]))
            self.hyps.sort(key=lambda h: -h.score)
            del self.hyps[k:]

        # can a running beam still beat the worst finished one?
        best_len = (sp.max_new_tokens + self.forced if sp.early_stopping == "never" and lp > 0
                    else generated)
        best = np.float32(scores[0]) / np.float32(float(best_len) ** lp)
        worst = np.float32(self.hyps[-1].score) if len(self.hyps) == k else _NEG
        self.improvable = self.improvable and bool(best > worst)
        open_beam = not (len(self.hyps) == k and sp.early_stopping is True)
        self.done = not (self.improvable and open_beam and not all(ends))
        self.scores = scores
        return [cands[c] for c in running]

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
