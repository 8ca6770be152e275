"""HF's beam rules (transformers' `_beam_search`: the running beams, the finished hypotheses'
scores, the early-stop heuristic and the three `early_stopping` rules) as tensor operations
over every beam group of a step, with the state they read kept on the device between steps.
The host applies none of them: it reads each step's choices, the candidates that finished a
hypothesis and the groups that are done a step behind, and only follows them in its books
(it keeps the rows' tokens, so the device keeps no token history).

The arithmetic is float32 as HF's, value for value: the length-penalty powers come from a
table the host fills once per group with Python's float power (`BeamState.powers[g, x]` =
float32(x ** length_penalty)); ties are broken as there (a running beam: the best candidates
that do not stop, in rank order; a finished hypothesis: the ones kept before the new ones, the
new ones in rank order). `tests/test_beam_rules.py` checks it against the host's rules
(`tests/beam_host_rules.py: advance_groups`), which are checked against HF.

`BeamArena` keeps the state of the groups of one num_beams in slots the scheduler hands out
(`scheduler/beam_slots.py`): a group enters at its first beam step and its slot is taken again
after it ends. A step reads nothing from the host and syncs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

_NEG = -1.0e9  # HF's "never" score
_EMPTY = float("-inf")  # a finished-hypothesis slot not filled yet
# what an arena's free slot holds, field by field
_FILL = {"forced": 0, "max_new": 1, "es_true": False, "never": False, "powers": 1.0,
         "stops": -1, "keep": 1, "steps": 0, "scores": _NEG, "hyp_scores": _EMPTY,
         "improvable": True, "done": True}


@dataclass
class BeamState:
    """Groups (G of them, K = num_beams each)."""

    # fixed for a group's life
    forced: torch.Tensor  # [G] int64: forced prompt tokens HF counts as generated
    max_new: torch.Tensor  # [G] int64
    es_true: torch.Tensor  # [G] bool: early_stopping is True
    never: torch.Tensor  # [G] bool: early_stopping "never" with a positive length penalty
    powers: torch.Tensor  # [G, P] float32: x ** length_penalty, x < P (P > max_new + forced)
    stops: torch.Tensor  # [G, S] int64: tokens that end a hypothesis, -1 padded
    keep: torch.Tensor  # [G] int64: candidates a step (at most the width of `values`)
    # what a step changes
    steps: torch.Tensor  # [G] int64: tokens generated so far
    scores: torch.Tensor  # [G, K] float32: the running beams' accumulated log-probs
    hyp_scores: torch.Tensor  # [G, K] float32: finished, best first (-inf: empty)
    improvable: torch.Tensor  # [G] bool: HF's is_early_stop_heuristic_unsatisfied
    done: torch.Tensor  # [G] bool

    @property
    def num_beams(self) -> int:
        return self.scores.shape[1]


@dataclass
class BeamChoices:
    """One step of a bucket of groups, [G, K] each unless said: what the host reads."""

    parents: torch.Tensor  # int64: each running beam's row in its group
    tokens: torch.Tensor  # int64: its new token
    scores: torch.Tensor  # float32: its running score
    top_ids: torch.Tensor  # int64: the K best candidates (row * vocab + token)
    hyp_scores: torch.Tensor  # float32: the score of those that finished a hypothesis, else -inf
    done: torch.Tensor  # [G] bool: the search has ended


def new_state(num_beams: int, forced: list[int], max_new: list[int], early_stopping: list,
              length_penalty: list[float], stops: list, keep: list[int],
              device: str | torch.device = "cpu", width: int = 0) -> BeamState:
    """Groups before their first step (its candidates all come from row 0). `width`: the
    least number of power columns."""
    g, k = len(forced), num_beams
    top = max([m + f + 1 for m, f in zip(max_new, forced)] + [width, 2])
    # (Python's float power, as the host's rules: one row a distinct penalty)
    rows = {lp: [1.0] + [float(x) ** lp for x in range(1, top)] for lp in set(length_penalty)}
    powers = torch.tensor([rows[lp] for lp in length_penalty], dtype=torch.float32)
    powers = powers.view(g, top)
    width = max([len(x) for x in stops] + [1])
    padded = {x: sorted(x) + [-1] * (width - len(x)) for x in set(map(frozenset, stops))}
    stop = torch.tensor([padded[frozenset(x)] for x in stops], dtype=torch.int64)
    stop = stop.view(g, width)
    scores = torch.full((g, k), _NEG, dtype=torch.float32)
    scores[:, 0] = 0.0
    t = lambda x, dtype: torch.tensor(x, dtype=dtype)  # noqa: E731
    state = BeamState(
        forced=t(forced, torch.int64), max_new=t(max_new, torch.int64),
        es_true=t([e is True for e in early_stopping], torch.bool),
        never=t([e == "never" and lp > 0 for e, lp in zip(early_stopping, length_penalty)],
                torch.bool),
        powers=powers, stops=stop, keep=t(keep, torch.int64),
        steps=torch.zeros(g, dtype=torch.int64), scores=scores,
        hyp_scores=torch.full((g, k), _EMPTY, dtype=torch.float32),
        improvable=torch.ones(g, dtype=torch.bool), done=torch.zeros(g, dtype=torch.bool))
    # (from pageable memory without a wait: the copies are staged at once)
    return BeamState(**{f.name: getattr(state, f.name).to(device, non_blocking=True)
                        for f in fields(BeamState)})


def advance(s: BeamState, values: torch.Tensor, flat_ids: torch.Tensor,
            vocab: int) -> BeamChoices:
    """One step of every group from its candidates (`values` float32 and `flat_ids` = row *
    vocab + token, [G, W], best first, the first `keep[g]` real). Updates `s` in place; a
    group already done is left as it is (its rows continue themselves, nothing finishes)."""
    k = s.num_beams
    g, width = values.shape
    dev = values.device
    live = ~s.done
    col = torch.arange(width, device=dev)
    n = s.steps + 1
    generated = n + s.forced
    row, tok = flat_ids // vocab, flat_ids % vocab
    ends = ~(col[None, :] < s.keep[:, None])  # (padding: after every real candidate)
    ends |= (tok[:, :, None] == s.stops[:, None, :]).any(-1)
    ends |= (n >= s.max_new)[:, None]

    # the running beams: the best candidates that do not stop (those that do, scored -1e9,
    # only if too few do not)
    run = (ends.long() * width + col[None, :]).argsort(dim=1)[:, :k]
    run_vals = values.gather(1, run)
    scores = torch.where(ends.gather(1, run), run_vals + _NEG, run_vals)

    # finished hypotheses: stopping candidates among the top num_beams, while they can matter
    full = (s.hyp_scores > _EMPTY).sum(1) == k
    top = ends[:, :k]
    may_add = live & top.any(1) & s.improvable & ~(full & s.es_true)
    last_power = s.powers.shape[1] - 1  # (a done group's lengths may run past: unused)
    denom = s.powers.gather(1, generated.clamp(max=last_power)[:, None])
    new_scores = torch.where(top & may_add[:, None], values[:, :k] / denom, _EMPTY)
    merged = torch.cat([s.hyp_scores, new_scores], 1)
    s.hyp_scores = merged.sort(dim=1, descending=True, stable=True).values[:, :k]

    # can a running beam still beat the worst finished one?
    lengths = torch.where(s.never, s.max_new + s.forced, generated)
    best = scores[:, 0] / s.powers.gather(1, lengths.clamp(max=last_power)[:, None]).squeeze(1)
    full = (s.hyp_scores > _EMPTY).sum(1) == k
    worst = torch.where(full, s.hyp_scores[:, k - 1], torch.full_like(best, _NEG))
    improvable = s.improvable & (best > worst)
    done = ~(improvable & ~(full & s.es_true) & ~ends.all(1))

    # the running rows continue their parents (a done group's rows, themselves)
    own = torch.arange(k, device=dev).expand(g, k)
    parents = torch.where(live[:, None], row.gather(1, run), own)
    s.scores = torch.where(live[:, None], scores, s.scores)
    s.improvable = torch.where(live, improvable, s.improvable)
    s.done = s.done | done
    s.steps = torch.where(live, n, s.steps)
    return BeamChoices(parents, tok.gather(1, run), s.scores, flat_ids[:, :k], new_scores,
                       s.done)


class BeamArena:
    """The device state of the running groups of one num_beams, kept across steps, in slots
    the host chooses (`enter`); a step moves only the groups it names (`step`). Capacity
    grows to the largest slot entered."""

    def __init__(self, num_beams: int, device: str | torch.device = "cpu") -> None:
        self.k, self.device = num_beams, device
        self.state = new_state(num_beams, [], [], [], [], [], [], device)

    @property
    def capacity(self) -> int:
        return self.state.scores.shape[0]

    def _fit(self, capacity: int, powers: int, stops: int) -> None:
        """At least `capacity` slots and the tables' widths (new room holds free slots)."""
        s = self.state
        have = s.scores.shape[0]
        rows = max(capacity, 2 * have) if capacity > have else have
        widths = {"powers": max(powers, s.powers.shape[1]), "stops": max(stops, s.stops.shape[1])}
        if rows == have and widths == {"powers": s.powers.shape[1], "stops": s.stops.shape[1]}:
            return
        grown = {}
        for f in fields(BeamState):
            old = getattr(s, f.name)
            shape = (rows, widths.get(f.name, old.shape[1])) if old.dim() == 2 else (rows,)
            new = torch.full(shape, _FILL[f.name], dtype=old.dtype, device=old.device)
            if old.dim() == 2:
                new[:have, :old.shape[1]] = old
            else:
                new[:have] = old
            grown[f.name] = new
        self.state = BeamState(**grown)

    def enter(self, slots: list[int], forced: list[int], max_new: list[int],
              early_stopping: list, length_penalty: list[float], stops: list,
              keep: list[int]) -> None:
        """New groups in `slots` (their first step next), their fixed columns written."""
        fresh = new_state(self.k, forced, max_new, early_stopping, length_penalty, stops,
                          keep, self.device)
        self._fit(max(slots) + 1, fresh.powers.shape[1], fresh.stops.shape[1])
        s = self.state
        idx = torch.tensor(slots, dtype=torch.int64).to(self.device, non_blocking=True)
        for f in fields(BeamState):
            a, b = getattr(s, f.name), getattr(fresh, f.name)
            if f.name in ("powers", "stops"):
                b = torch.nn.functional.pad(b, (0, a.shape[1] - b.shape[1]), value=_FILL[f.name])
            a[idx] = b

    def step_into(self, slots: torch.Tensor, values: torch.Tensor, flat_ids: torch.Tensor,
                  vocab: int, ints: torch.Tensor, floats: torch.Tensor, done: torch.Tensor,
                  e0: int, g0: int, rows: tuple | None = None,
                  kernel: bool | None = None) -> None:
        """`step`, its results written where the sampler gathers a step's: each group's K
        entries at columns e0 + g*K.. of `ints` ([3, n]: parent row in the group, token, the
        top candidate's id) and `floats` ([2, n]: running score, new hypothesis' score or
        -inf), its `done` at g0 + g; with `rows` = (parents, tokens, scores, row0) its rows'
        batch parents, next tokens and running scores at row0 + g*K... On CUDA one launch
        (`kernels/triton_beam_rules.py`; `kernel` forces the choice: tests run it in Triton's
        interpreter)."""
        if kernel is None:
            kernel = values.is_cuda
        if kernel:
            from seq2serve.runtime.kernels.triton_beam_rules import beam_rules_step  # (CUDA)

            return beam_rules_step(self.state, slots, values, flat_ids, vocab, ints, floats,
                                   done, e0, g0, rows)
        out = self.step(slots, values, flat_ids, vocab)
        n = out.parents.numel()
        ints[:, e0:e0 + n] = torch.stack([out.parents, out.tokens, out.top_ids]).view(3, n)
        floats[:, e0:e0 + n] = torch.stack([out.scores, out.hyp_scores]).view(2, n)
        done[g0:g0 + out.done.numel()] = out.done
        if rows is not None:
            parents, tokens, scores, row0 = rows
            g, k = out.parents.shape
            first = row0 + torch.arange(g, device=values.device)[:, None] * k
            parents[row0:row0 + n] = (first + out.parents).flatten()
            tokens[row0:row0 + n] = out.tokens.flatten()
            scores[row0:row0 + n] = out.scores.flatten()

    def step(self, slots: torch.Tensor, values: torch.Tensor, flat_ids: torch.Tensor,
             vocab: int) -> BeamChoices:
        """`advance` for the groups of `slots` (the batch's order) from their candidates [G,
        W]; the others are left as they are."""
        s = self.state
        sub = BeamState(**{f.name: getattr(s, f.name)[slots] for f in fields(BeamState)})
        out = advance(sub, values, flat_ids, vocab)
        for name in ("steps", "scores", "hyp_scores", "improvable", "done"):
            getattr(s, name)[slots] = getattr(sub, name)
        return out
