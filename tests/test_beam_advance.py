"""`advance_groups` (every beam group of a step at once, numpy) against the per-group rules it
replaced (kept here as the reference, line for line): random candidates for many groups of
different num_beams, stop ids (so different `keep`), length penalties (negative, zero, above
one), early_stopping True/False/"never", forced tokens and groups reaching max_new_tokens.
Scores must be equal bit for bit. No model."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.scheduler.beam_search import BeamGroup, Hypothesis
from seq2serve.runtime.scheduler.req import Req
from seq2serve.tests.beam_host_rules import advance_groups

_NEG = np.float32(-1.0e9)
VOCAB = 7  # small: stop tokens come up often


def reference_advance(self: BeamGroup, values, flat_ids, vocab):
    """HF's rules for one group, one candidate at a time (as `BeamGroup.advance` was)."""
    sp = self.rows[0].sampling_params
    k, lp = sp.num_beams, sp.length_penalty
    n = len(self.rows[0].output_ids) + 1
    generated = n + self.forced
    cands = [divmod(i, vocab) for i in flat_ids]
    if n >= sp.max_new_tokens:
        ends = [True] * len(cands)
    else:
        ends = [t in self.stop_ids for _, t in cands]
    running = [c for c, e in enumerate(ends) if not e][:k]
    scores = [values[c] for c in running]
    if len(running) < k:
        stopped = [c for c, e in enumerate(ends) if e][:k - len(running)]
        running += stopped
        scores += [float(np.float32(values[c]) + _NEG) for c in stopped]
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
    best_len = (sp.max_new_tokens + self.forced if sp.early_stopping == "never" and lp > 0
                else generated)
    best = np.float32(scores[0]) / np.float32(float(best_len) ** lp)
    worst = np.float32(self.hyps[-1].score) if len(self.hyps) == k else _NEG
    self.improvable = self.improvable and bool(best > worst)
    open_beam = not (len(self.hyps) == k and sp.early_stopping is True)
    self.done = not (self.improvable and open_beam and not all(ends))
    self.scores = scores
    return [cands[c] for c in running]


def make_group(rng: random.Random, i: int) -> BeamGroup:
    sp = SamplingParams(max_new_tokens=rng.randint(1, 9), num_beams=rng.randint(2, 5),
                        length_penalty=rng.choice([1.0, 0.0, -0.5, -2.0, 0.7, 2.0]),
                        early_stopping=rng.choice([True, False, "never"]))
    head = Req(rid=str(i), encoder_input_ids=[1], decoder_input_ids=[0], sampling_params=sp)
    stops = frozenset(rng.sample(range(VOCAB), rng.choice([0, 1, 1, 2, 3])))
    g = BeamGroup(rows=[head], stop_ids=stops, forced=rng.choice([0, 0, 1]))
    head.beam = g
    return g


def candidates(rng: np.random.Generator, g: BeamGroup) -> tuple[list[float], list[int]]:
    values = np.sort(rng.uniform(-30, 0, g.keep).astype(np.float32))[::-1]
    ids = rng.integers(0, len(g.rows) * VOCAB, g.keep)
    return values.tolist(), ids.tolist()


def follow(g: BeamGroup, choices: list[tuple[int, int]]) -> None:
    """The rows' books after a step (what RequestMemory does), enough for `advance`."""
    old = g.rows
    outputs = [old[p].output_ids + [t] for p, t in choices]
    while len(g.rows) < len(choices):
        r = copy.copy(old[0])
        r.rid = f"{old[0].rid}-{len(g.rows)}"
        g.rows = g.rows + [r]
    for r, out in zip(g.rows, outputs):
        r.output_ids = out


def twin(g: BeamGroup) -> BeamGroup:
    t = copy.deepcopy(g)
    for r in t.rows:
        r.beam = t
    return t


@pytest.mark.parametrize("seed", range(6))
def test_advance_groups_matches_per_group_rules(seed):
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    ours = [make_group(rng, i) for i in range(300)]
    ref = [twin(g) for g in ours]
    assert len({g.keep for g in ours}) > 1  # groups of different keep share a call
    steps = 0
    while any(not g.done for g in ours):
        live = [i for i, g in enumerate(ours) if not g.done]
        cands = [candidates(nrng, ours[i]) for i in live]
        values = [v for c in cands for v in c[0]]
        ids = [x for c in cands for x in c[1]]
        if steps % 2:  # arrays, as a sampler could hand them over
            values, ids = np.array(values, dtype=np.float32), np.array(ids)
        got = advance_groups([ours[i] for i in live], values, ids, VOCAB)
        for i, choices, (v, f) in zip(live, got, cands):
            want = reference_advance(ref[i], v, f, VOCAB)
            a, b = ours[i], ref[i]
            assert choices == want
            assert all(type(x) is int for c in choices for x in c)
            assert a.scores == b.scores  # bit for bit (float32 values as Python floats)
            assert [(h.score, h.tokens) for h in a.hyps] == [(h.score, h.tokens)
                                                             for h in b.hyps]
            assert (a.improvable, a.done) == (b.improvable, b.done)
            follow(a, choices)
            follow(b, want)
        steps += 1
    assert steps >= 5
    assert any(g.hyps for g in ours) and any(not g.improvable for g in ours)


def test_advance_is_advance_groups_of_one():
    rng, nrng = random.Random(7), np.random.default_rng(7)
    for i in range(50):
        g = make_group(rng, i)
        t = twin(g)
        while not g.done:
            v, f = candidates(nrng, g)
            [choices] = advance_groups([g], v, f, VOCAB)
            assert choices == reference_advance(t, v, f, VOCAB)
            assert (g.scores, g.done, g.improvable) == (t.scores, t.done, t.improvable)
            follow(g, choices)
            follow(t, choices)
