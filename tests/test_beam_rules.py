"""`runtime/executor/beam_rules.py` (HF's beam rules as tensor operations with the groups'
state on the device) against the host's rules (`advance_groups`, itself checked against the
per-group rules and HF): random candidates for many groups, num_beams 2-5 (one bucket each),
stop ids (so different `keep` within a bucket), length penalties, early_stopping True / False
/ "never", forced tokens, groups reaching max_new_tokens. Choices, running scores, finished
hypotheses (scores bit for bit, tokens) and the flags equal at every step. No model."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from seq2serve.runtime.executor.beam_rules import BeamArena, advance, new_state, results
from seq2serve.runtime.scheduler.beam_search import advance_groups
from seq2serve.tests.test_beam_advance import VOCAB, candidates, follow, make_group


def _state(groups):
    sps = [g.rows[0].sampling_params for g in groups]
    return new_state(sps[0].num_beams, max(sp.max_new_tokens for sp in sps),
                     [g.forced for g in groups], [sp.max_new_tokens for sp in sps],
                     [sp.early_stopping for sp in sps], [sp.length_penalty for sp in sps],
                     [g.stop_ids for g in groups], [g.keep for g in groups])


def _tied(nrng, g):
    """Candidates whose values tie often (quarters in [-6, 0]): the rules' tie-breaks."""
    values = np.sort(-nrng.integers(0, 24, g.keep).astype(np.float32) / 4)[::-1]
    return values.tolist(), nrng.integers(0, len(g.rows) * VOCAB, g.keep).tolist()


def _check(state, i, g, k, done):
    n = int((state.hyp_scores[i] > float("-inf")).sum())
    hyps = [(state.hyp_scores[i, j].item(),
             state.hyp_tokens[i, j, :state.hyp_lens[i, j]].tolist()) for j in range(n)]
    assert hyps == [(h.score, h.tokens) for h in g.hyps]
    assert (bool(state.improvable[i]), done[i]) == (g.improvable, g.done)


@pytest.mark.parametrize("seed,ties", [(s, t) for t in (False, True) for s in range(4)])
def test_device_rules_match_host_rules(seed, ties):
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    groups = [make_group(rng, i) for i in range(400)]
    buckets = {}
    for g in groups:
        buckets.setdefault(g.num_beams, []).append(g)
    assert len(buckets) > 1
    for k, bucket in sorted(buckets.items()):
        state = _state(bucket)
        assert len({g.keep for g in bucket}) > 1  # (groups of different keep in one call)
        width = max(g.keep for g in bucket)
        steps = 0
        while not all(g.done for g in bucket):
            vals = np.full((len(bucket), width), -1e30, dtype=np.float32)
            ids = np.zeros((len(bucket), width), dtype=np.int64)
            live = [i for i, g in enumerate(bucket) if not g.done]
            for i in live:  # (a done group's candidates: whatever; it must not move)
                v, f = (_tied if ties else candidates)(nrng, bucket[i])
                vals[i, :len(v)], ids[i, :len(f)] = v, f
            for i in set(range(len(bucket))) - set(live):
                ids[i] = nrng.integers(0, k * VOCAB, width)
            parents, tokens = advance(state, torch.from_numpy(vals), torch.from_numpy(ids),
                                      VOCAB)
            want = advance_groups([bucket[i] for i in live],
                                  np.concatenate([vals[i, :bucket[i].keep] for i in live]),
                                  np.concatenate([ids[i, :bucket[i].keep] for i in live]),
                                  VOCAB)
            done = state.done.tolist()
            for i, choices in zip(live, want):
                g = bucket[i]
                got = list(zip(parents[i].tolist(), tokens[i].tolist()))
                assert got == choices, (k, steps, i)
                assert state.scores[i].tolist() == g.scores  # bit for bit
                _check(state, i, g, k, done)
                follow(g, choices)
                if i % 7 == steps % 7:  # (mid-search: fewer finished than asked, the
                    sp = g.rows[0].sampling_params  # running beams fill in)
                    sp.num_return_sequences = k
                    want = [(h.score, h.tokens) for h in g.results()]
                    assert results(state, i, k, sp.length_penalty) == want, (k, steps, i)
                rows = state.history[i * k:(i + 1) * k]
                assert [rows[j, :len(r.output_ids)].tolist() for j, r in
                        enumerate(g.rows)] == [r.output_ids for r in g.rows]
            for i in set(range(len(bucket))) - set(live):  # done before: as it was
                assert parents[i].tolist() == list(range(k))
                _check(state, i, bucket[i], k, done)
            steps += 1
        assert steps >= 3
        for i, g in enumerate(bucket):  # the results a done group hands out
            sp = g.rows[0].sampling_params
            for n in {1, k}:
                sp.num_return_sequences = n
                want = [(h.score, h.tokens) for h in g.results()]
                assert results(state, i, n, sp.length_penalty) == want, (k, i, n)
    assert any(g.hyps for g in groups) and any(not g.improvable for g in groups)


def test_arena_groups_enter_sit_out_and_leave():
    """`BeamArena`: groups of one num_beams enter at different steps (the arena growing),
    sit some steps out (they do not move), leave when done (their slots taken again): each
    group's choices, scores and hypotheses equal the host's rules'."""
    rng, nrng = random.Random(11), np.random.default_rng(11)
    groups = [g for g in (make_group(rng, i) for i in range(600)) if g.num_beams == 3]
    arena = BeamArena(3, max(g.rows[0].sampling_params.max_new_tokens for g in groups),
                      capacity=4)
    waiting, running, slot = list(groups), [], {}
    steps = 0
    while waiting or running:
        joining = [waiting.pop() for _ in range(min(len(waiting), rng.randint(0, 9)))]
        if joining:
            sps = [g.rows[0].sampling_params for g in joining]
            for g, s in zip(joining, arena.enter(
                    [g.forced for g in joining], [sp.max_new_tokens for sp in sps],
                    [sp.early_stopping for sp in sps], [sp.length_penalty for sp in sps],
                    [g.stop_ids for g in joining], [g.keep for g in joining])):
                slot[id(g)] = s
            running += joining
        batch = [g for g in running if rng.random() < 0.8]  # (the others sit out)
        rng.shuffle(batch)
        if batch:
            width = max(g.keep for g in batch)
            vals = np.full((len(batch), width), -1e30, dtype=np.float32)
            ids = np.zeros((len(batch), width), dtype=np.int64)
            for i, g in enumerate(batch):
                v, f = candidates(nrng, g)
                vals[i, :len(v)], ids[i, :len(f)] = v, f
            slots = torch.tensor([slot[id(g)] for g in batch])
            parents, tokens = arena.step(slots, torch.from_numpy(vals), torch.from_numpy(ids),
                                         VOCAB)
            want = advance_groups(batch, np.concatenate([vals[i, :g.keep] for i, g in
                                                         enumerate(batch)]),
                                  np.concatenate([ids[i, :g.keep] for i, g in
                                                  enumerate(batch)]), VOCAB)
            done = arena.state.done.tolist()
            for i, (g, choices) in enumerate(zip(batch, want)):
                s = slot[id(g)]
                assert list(zip(parents[i].tolist(), tokens[i].tolist())) == choices
                assert arena.state.scores[s].tolist() == g.scores
                _check(arena.state, s, g, 3, done)
                follow(g, choices)
            ended = [g for g in batch if g.done]
            arena.leave([slot[id(g)] for g in ended])
            running = [g for g in running if not g.done]
        steps += 1
    assert arena.state.scores.shape[0] > 4  # (it grew)
    assert all(g.done for g in groups) and steps > 10
