"""HF's beam rules for a bucket of groups in one launch (`executor/beam_rules.py: advance`, the
same arithmetic): one program a group reads its candidates and its state in its arena slot,
chooses the running beams, scores the hypotheses that finish, merges them into the kept ones,
updates the early-stop flags and writes everything the host and the next step read.

As torch operations the rules were ~75 launches a step, each a Python call on the host: more
host time than the numpy rules they replaced (docs/benchmarks.md, twenty-seventh session).
Here a bucket is one launch.

A group's K running beams are its candidates ranked by (stops, rank): the rank of each of the
W candidates is counted with two prefix sums, and the K first picked out by a [K, W] match.
The finished hypotheses (K kept, best first) and the new ones (the stopping candidates among
the top K) are merged by counting, for each of the 2K, those ranked before it (greater, or
equal and earlier: the kept ones before the new, as a stable sort of the concatenation).
Scores are float32 as torch's: the divisions round to nearest (`div_rn`), the rest are
comparisons, one addition and selections.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_NEG = tl.constexpr(-1.0e9)  # HF's "never" score


@triton.jit
def _ends(tok, col, keep, n, max_new, stops, S: tl.constexpr):
    """Whether each candidate ends a hypothesis (padding past `keep` counts as ending)."""
    ends = (col >= keep) | (n >= max_new)
    for j in tl.static_range(S):
        ends = ends | (tok == tl.load(stops + j))
    return ends


@triton.jit
def _beam_rules_kernel(
        slots, values, ids, width, vocab,
        forced, max_new, es_true, never, powers, p_width, stops, keep,
        steps, scores, hyp_scores, improvable, done,
        out_ints, out_floats, out_done, n_entries, e0, g0,
        row_parents, row_tokens, row_scores, row0,
        K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_W: tl.constexpr, S: tl.constexpr,
        WRITE_ROWS: tl.constexpr):
    g = tl.program_id(0)
    slot = tl.load(slots + g)
    c = tl.arange(0, BLOCK_W)
    j = tl.arange(0, BLOCK_K)
    on_c, on_j = c < width, j < K
    v = tl.load(values + g * width + c, mask=on_c, other=0.0).to(tl.float32)
    f = tl.load(ids + g * width + c, mask=on_c, other=0)
    row, tok = f // vocab, f % vocab
    n = tl.load(steps + slot) + 1
    generated = n + tl.load(forced + slot)
    mx, kp = tl.load(max_new + slot), tl.load(keep + slot)
    stop_row = stops + slot * S
    ends = _ends(tok, c, kp, n, mx, stop_row, S) | ~on_c
    live = tl.load(done + slot) == 0
    es = tl.load(es_true + slot) != 0
    improvable_old = tl.load(improvable + slot) != 0

    # the running beams: the candidates in order of (ends, rank), the first K
    ne = (~ends).to(tl.int32)
    en = ends.to(tl.int32)
    rank = tl.where(ends, tl.sum(ne, 0) + tl.cumsum(en, 0) - en, tl.cumsum(ne, 0) - ne)
    pick = rank[None, :] == j[:, None]  # [BLOCK_K, BLOCK_W]: beam j is candidate c
    run_val = tl.max(tl.where(pick, v[None, :], float("-inf")), 1)
    run_row = tl.sum(tl.where(pick, row[None, :], 0), 1)
    run_tok = tl.sum(tl.where(pick, tok[None, :], 0), 1)
    run_end = tl.sum(tl.where(pick, en[None, :], 0), 1) > 0
    run_score = tl.where(run_end, run_val + _NEG, run_val)

    # finished hypotheses: the stopping candidates among the top K, while they can matter
    vk = tl.load(values + g * width + j, mask=on_j, other=0.0).to(tl.float32)
    fk = tl.load(ids + g * width + j, mask=on_j, other=0)
    top = _ends(fk % vocab, j, kp, n, mx, stop_row, S) & on_j
    old = tl.load(hyp_scores + slot * K + j, mask=on_j, other=float("-inf"))
    full = tl.sum(((old > float("-inf")) & on_j).to(tl.int32), 0) == K
    may_add = live & (tl.sum(top.to(tl.int32), 0) > 0) & improvable_old & ~(full & es)
    p_last = p_width - 1
    denom = tl.load(powers + slot * p_width + tl.minimum(generated, p_last))
    new = tl.where(top & may_add, tl.math.div_rn(vk, denom), float("-inf"))
    new = tl.where(on_j, new, float("-inf"))
    # merge: each of the 2K's place among them (kept ones before new ones where equal)
    a_old, a_new = old[:, None], new[:, None]  # [BLOCK_K (the one placed), BLOCK_K (others)]
    b_old, b_new = old[None, :], new[None, :]
    earlier = j[None, :] < j[:, None]
    valid = on_j[None, :]
    old_place = tl.sum((valid & ((b_old > a_old) | ((b_old == a_old) & earlier))
                        ).to(tl.int32), 1) + tl.sum((valid & (b_new > a_old)).to(tl.int32), 1)
    new_place = tl.sum((valid & (b_old >= a_new)).to(tl.int32), 1) + tl.sum(
        (valid & ((b_new > a_new) | ((b_new == a_new) & earlier))).to(tl.int32), 1)
    old_place = tl.where(on_j, old_place, 2 * BLOCK_K)
    new_place = tl.where(on_j, new_place, 2 * BLOCK_K)
    kept = tl.maximum(
        tl.max(tl.where(old_place[None, :] == j[:, None], old[None, :], float("-inf")), 1),
        tl.max(tl.where(new_place[None, :] == j[:, None], new[None, :], float("-inf")), 1))

    # can a running beam still beat the worst finished one?
    lengths = tl.where(tl.load(never + slot) != 0, mx + tl.load(forced + slot), generated)
    best_score = tl.max(tl.where(j == 0, run_score, float("-inf")), 0)
    best = tl.math.div_rn(best_score, tl.load(powers + slot * p_width
                                               + tl.minimum(lengths, p_last)))
    full = tl.sum(((kept > float("-inf")) & on_j).to(tl.int32), 0) == K
    worst = tl.where(full, tl.max(tl.where(j == K - 1, kept, float("-inf")), 0), _NEG)
    now_improvable = improvable_old & (best > worst)
    all_end = tl.sum(ne, 0) == 0
    now_done = ~(now_improvable & ~(full & es) & ~all_end)

    # the state (a group done before is left as it was: its rows continue themselves)
    old_scores = tl.load(scores + slot * K + j, mask=on_j, other=0.0)
    running = tl.where(live, run_score, old_scores)
    parents = tl.where(live, run_row, j)
    tl.store(scores + slot * K + j, running, mask=on_j)
    tl.store(hyp_scores + slot * K + j, tl.where(live, kept, old), mask=on_j)
    tl.store(improvable + slot, tl.where(live, now_improvable, improvable_old))
    finished = (~live) | now_done
    tl.store(done + slot, finished)
    tl.store(steps + slot, tl.where(live, n, n - 1))

    # what the host reads, and the batch rows' next step
    at = e0 + g * K + j
    tl.store(out_ints + at, parents, mask=on_j)
    tl.store(out_ints + n_entries + at, run_tok, mask=on_j)
    tl.store(out_ints + 2 * n_entries + at, fk, mask=on_j)
    tl.store(out_floats + at, running, mask=on_j)
    tl.store(out_floats + n_entries + at, new, mask=on_j)
    tl.store(out_done + g0 + g, finished)
    if WRITE_ROWS:
        r = row0 + g * K + j
        tl.store(row_parents + r, row0 + g * K + parents, mask=on_j)
        tl.store(row_tokens + r, run_tok, mask=on_j)
        tl.store(row_scores + r, running, mask=on_j)


def beam_rules_step(state, slots: torch.Tensor, values: torch.Tensor, ids: torch.Tensor,
                    vocab: int, ints: torch.Tensor, floats: torch.Tensor, done: torch.Tensor,
                    e0: int, g0: int, rows: tuple | None = None) -> None:
    """One step of the groups of `slots` ([G] in `state`, a `BeamState` of num_beams K) from
    their candidates ([G, W]): the state updated in place; each group's K entries written at
    columns e0 + g*K.. of `ints` ([3, n]: parent row in the group, token, the top candidate's
    id) and `floats` ([2, n]: running score, new hypothesis' score or -inf), its `done` at g0 +
    g; with `rows` = (parents, tokens, scores, row0) its rows' batch parents, next tokens and
    running scores at row0 + g*K.."""
    g, width = values.shape
    k = state.scores.shape[1]
    s_width = state.stops.shape[1]
    row_parents, row_tokens, row_scores, row0 = rows if rows is not None else (ints, ints,
                                                                              floats, 0)
    _beam_rules_kernel[(g,)](
        slots, values.contiguous(), ids.contiguous(), width, vocab,
        state.forced, state.max_new, state.es_true, state.never, state.powers,
        state.powers.shape[1], state.stops, state.keep,
        state.steps, state.scores, state.hyp_scores, state.improvable, state.done,
        ints, floats, done, ints.shape[1], e0, g0,
        row_parents, row_tokens, row_scores, row0,
        K=k, BLOCK_K=triton.next_power_of_2(k), BLOCK_W=triton.next_power_of_2(width),
        S=s_width, WRITE_ROWS=rows is not None)
