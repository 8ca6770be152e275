"""`runtime/executor/beam_rules.py` (HF's beam rules as tensor operations, the groups' state on
the device) and `follow_device_rules` (the host taking its steps into the groups' books)
against the host's own rules (`advance_groups`, itself checked against the per-group rules and
HF): random candidates for many groups, num_beams 2-5 (one bucket each), stop ids (so
different `keep` within a bucket), length penalties, early_stopping True / False / "never",
forced tokens, groups reaching max_new_tokens, values that tie. Choices, running scores,
finished hypotheses (scores bit for bit, tokens) and `done` equal at every step. No model."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from seq2serve.runtime.executor.beam_rules import BeamArena, advance, new_state
from seq2serve.runtime.scheduler.beam_search import follow_device_rules
from seq2serve.tests.beam_host_rules import advance_groups
from seq2serve.tests.test_beam_advance import VOCAB, candidates, follow, make_group, twin


def _columns(groups):
    sps = [g.rows[0].sampling_params for g in groups]
    return ([g.forced for g in groups], [sp.max_new_tokens for sp in sps],
            [sp.early_stopping for sp in sps], [sp.length_penalty for sp in sps],
            [g.stop_ids for g in groups], [g.keep for g in groups])


def _tied(nrng, g):
    """Candidates whose values tie often (quarters in [-6, 0]): the rules' tie-breaks."""
    values = np.sort(-nrng.integers(0, 24, g.keep).astype(np.float32) / 4)[::-1]
    return values.tolist(), nrng.integers(0, len(g.rows) * VOCAB, g.keep).tolist()


def _padded(nrng, batch, draw, width):
    vals = np.full((len(batch), width), -1e30, dtype=np.float32)
    ids = np.zeros((len(batch), width), dtype=np.int64)
    for i, g in enumerate(batch):
        v, f = draw(nrng, g)
        vals[i, :len(v)], ids[i, :len(f)] = v, f
    return vals, ids


def _taken(groups, out):
    """The device's step as the host takes it: each group's (row, token) choices."""
    flat = {name: getattr(out, name).flatten().numpy() for name in
            ("parents", "tokens", "scores", "top_ids", "hyp_scores")}
    first = follow_device_rules(groups, flat["parents"], flat["tokens"], flat["scores"],
                                flat["top_ids"], flat["hyp_scores"], out.done.numpy(), VOCAB)
    k = groups[0].num_beams
    return [list(zip(flat["parents"][a:a + k].tolist(), flat["tokens"][a:a + k].tolist()))
            for a in first.tolist()]


def _same(a, b):
    assert a.scores == b.scores  # bit for bit
    assert [(h.score, h.tokens) for h in a.hyps] == [(h.score, h.tokens) for h in b.hyps]
    assert a.done == b.done


@pytest.mark.parametrize("seed,ties", [(s, t) for t in (False, True) for s in range(4)])
def test_device_rules_match_host_rules(seed, ties):
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    groups = [make_group(rng, i) for i in range(400)]
    buckets = {}
    for g in groups:
        buckets.setdefault(g.num_beams, []).append(g)
    assert len(buckets) > 1
    refs = []
    for k, ours in sorted(buckets.items()):
        ref = [twin(g) for g in ours]
        refs += ref
        state = new_state(k, *_columns(ours))
        assert len({g.keep for g in ours}) > 1  # (groups of different keep in one call)
        width, steps = max(g.keep for g in ours), 0
        while not all(g.done for g in ref):
            vals, ids = _padded(nrng, ours, _tied if ties else candidates, width)
            live = [i for i, g in enumerate(ref) if not g.done]
            want = advance_groups([ref[i] for i in live],
                                  np.concatenate([vals[i, :ref[i].keep] for i in live]),
                                  np.concatenate([ids[i, :ref[i].keep] for i in live]), VOCAB)
            was_done = [g.done for g in ours]
            got = _taken(ours, advance(state, torch.from_numpy(vals), torch.from_numpy(ids),
                                       VOCAB))
            for i, choices in zip(live, want):
                assert got[i] == choices, (k, steps, i)
                _same(ours[i], ref[i])
                follow(ours[i], choices)
                follow(ref[i], choices)
            for i in set(range(len(ours))) - set(live):  # done before: it does not move
                assert was_done[i] and got[i] == [(j, got[i][j][1]) for j in range(k)]
            steps += 1
        assert steps >= 3
    assert any(g.hyps for g in groups) and any(not g.improvable for g in refs)


def test_arena_groups_enter_sit_out_and_leave():
    """`BeamArena`: groups of one num_beams enter at different steps in slots the caller
    chooses (the arena growing), sit some steps out (they do not move), and leave; a slot is
    taken again by a later group. Each group's steps equal the host's rules'."""
    rng, nrng = random.Random(11), np.random.default_rng(11)
    ours = [g for g in (make_group(rng, i) for i in range(600)) if g.num_beams == 3]
    ref = {id(g): twin(g) for g in ours}
    arena = BeamArena(3)
    waiting, running, slot, free = list(ours), [], {}, []
    steps = reused = fresh = 0
    while waiting or running:
        joining = [waiting.pop() for _ in range(min(len(waiting), rng.randint(0, 9)))]
        if joining:
            taken = []
            for g in joining:
                reused += bool(free)
                taken.append(free.pop() if free else fresh)
                fresh += taken[-1] == fresh
                slot[id(g)] = taken[-1]
            arena.enter(taken, *_columns(joining))
            running += joining
        batch = [g for g in running if rng.random() < 0.8]  # (the others sit out)
        rng.shuffle(batch)
        if batch:
            vals, ids = _padded(nrng, batch, candidates, max(g.keep for g in batch))
            refs = [ref[id(g)] for g in batch]
            want = advance_groups(refs, np.concatenate([vals[i, :g.keep] for i, g in
                                                        enumerate(batch)]),
                                  np.concatenate([ids[i, :g.keep] for i, g in
                                                  enumerate(batch)]), VOCAB)
            slots = torch.tensor([slot[id(g)] for g in batch])
            got = _taken(batch, arena.step(slots, torch.from_numpy(vals),
                                           torch.from_numpy(ids), VOCAB))
            for g, r, a, b in zip(batch, refs, got, want):
                assert a == b
                _same(g, r)
                follow(g, a)
                follow(r, b)
            for g in [g for g in batch if g.done]:
                free.append(slot.pop(id(g)))
            running = [g for g in running if not g.done]
        steps += 1
    assert arena.capacity > 8 and steps > 10 and reused
    assert all(g.done for g in ours)


KERNEL_DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@pytest.mark.parametrize("seed,ties", [(0, False), (1, True)])
def test_rules_kernel_matches_torch_rules(seed, ties):
    """`kernels/triton_beam_rules.py` (one launch a bucket; Triton's interpreter without a GPU)
    against `advance` in torch, on arenas that start alike: every group of two buckets
    (num_beams 3 and 5), groups entering and sitting steps out, until all are done. The
    packed host entries, the rows' batch parents / tokens / scores and the whole state equal
    at every step (scores bit for bit); the host's rules agree with both (`follow_device_rules`
    against `advance_groups`)."""
    from seq2serve.runtime.executor.beam_rules import BeamState

    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    made = [make_group(rng, i) for i in range(300)]
    for k in (3, 5):
        ours = [g for g in made if g.num_beams == k][:40]
        ref = {id(g): twin(g) for g in ours}
        torch_arena, kernel_arena = BeamArena(k, KERNEL_DEVICE), BeamArena(k, KERNEL_DEVICE)
        for arena in (torch_arena, kernel_arena):
            arena.enter(list(range(len(ours))), *_columns(ours))
        slot = {id(g): i for i, g in enumerate(ours)}
        steps = 0
        while not all(g.done for g in ours):
            batch = [g for g in ours if not g.done and rng.random() < 0.8]
            if not batch:
                continue
            width = max(g.keep for g in batch)
            vals, ids = _padded(nrng, batch, _tied if ties else candidates, width)
            v = torch.from_numpy(vals).to(KERNEL_DEVICE)
            f = torch.from_numpy(ids).to(KERNEL_DEVICE)
            slots = torch.tensor([slot[id(g)] for g in batch], device=KERNEL_DEVICE)
            n, rows = len(batch) * k, len(batch) * k + 3  # (3 rows before the bucket's)
            got = []
            for arena, kernel in ((torch_arena, False), (kernel_arena, True)):
                ints = torch.full((3, n + 2), -7, dtype=torch.int64, device=KERNEL_DEVICE)
                floats = torch.full((2, n + 2), -7.0, device=KERNEL_DEVICE)
                done = torch.zeros(len(batch) + 1, dtype=torch.bool, device=KERNEL_DEVICE)
                row_out = (torch.full((rows,), -1, dtype=torch.int64, device=KERNEL_DEVICE),
                           torch.full((rows,), -1, dtype=torch.int64, device=KERNEL_DEVICE),
                           torch.zeros(rows, device=KERNEL_DEVICE), 3)
                arena.step_into(slots, v, f, VOCAB, ints, floats, done, 2, 1, row_out,
                                kernel=kernel)
                got.append((ints, floats, done, row_out[:3]))
            (ti, tf, td, tr), (ki, kf, kd, kr) = got
            assert torch.equal(ti, ki) and torch.equal(td, kd)
            assert torch.equal(tf, kf)  # bit for bit (-inf and the fill included)
            assert all(torch.equal(a, b) for a, b in zip(tr, kr))
            for name in BeamState.__dataclass_fields__:
                assert torch.equal(getattr(torch_arena.state, name),
                                   getattr(kernel_arena.state, name)), name
            refs = [ref[id(g)] for g in batch]
            want = advance_groups(refs, np.concatenate([vals[i, :g.keep] for i, g in
                                                        enumerate(batch)]),
                                  np.concatenate([ids[i, :g.keep] for i, g in
                                                  enumerate(batch)]), VOCAB)
            p, t, top, sc, hs = (x[2:2 + n].cpu().numpy() for x in (*ki, *kf))
            first = follow_device_rules(batch, p, t, sc, top, hs, kd[1:].cpu().numpy(), VOCAB)
            for g, r, a, b in zip(batch, refs, first.tolist(), want):
                assert list(zip(p[a:a + k].tolist(), t[a:a + k].tolist())) == b
                _same(g, r)
                follow(g, b)
                follow(r, b)
            steps += 1
        assert steps > 3
