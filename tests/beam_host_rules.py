"""HF's beam rules on the host, in numpy, over many groups at once: the reference the
device's rules (`runtime/executor/beam_rules.py`) are tested against (`tests/test_beam_rules.py`),
itself tested against the per-group rules as HF writes them (`tests/test_beam_advance.py`).
The runtime ran these until the rules moved to the device; it no longer does.

`advance_groups` updates each group's `scores`, `hyps`, `improvable` and `done` and returns
its running beams; the float32 arithmetic is HF's, value for value."""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from seq2serve.runtime.scheduler.beam_search import BeamGroup, Hypothesis

_NEG = np.float32(-1.0e9)  # HF's "never" score
_IMPROVABLE, _DONE = attrgetter("improvable"), attrgetter("done")


def rule(g: BeamGroup) -> tuple[int, int, int, int, bool, bool]:
    """The group's fixed columns in `advance_group_arrays`: num_beams, keep, forced,
    max_new_tokens, early_stopping is True, and whether a running beam's best is judged at
    the length limit (early_stopping "never" with a positive length penalty)."""
    sp = g.rows[0].sampling_params
    return (sp.num_beams, g.keep, g.forced, sp.max_new_tokens,
            sp.early_stopping is True, sp.early_stopping == "never" and sp.length_penalty > 0)


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
    k, keep, forced, max_new, es_true, never, lps, stops = _rule_columns(groups)
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




def _rule_columns(groups: list[BeamGroup]) -> tuple:
    """Each group's `rule` as columns, its length penalty, and its stop ids (one sorted
    array when every group has the same, else [groups, most] padded with -1)."""
    k, keep, forced, max_new, es_true, never = np.array([rule(g) for g in groups],
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
