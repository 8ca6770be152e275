"""HF's beam rules, the ones `beam_search.advance_group_arrays` applies on the host, as tensor
operations over a bucket of beam groups that share num_beams, with everything a step reads or
writes kept on the device: the running scores, the finished hypotheses (scores, tokens,
lengths), the early-stopping flags and the rows' generated tokens. A step reads nothing from
the host and syncs nothing, so it can run inside a CUDA graph; the host reads `done` (and a
done group's hypotheses) when it gets to them.

The arithmetic is float32 as on the host (HF's), value for value: the length-penalty powers
come from a table the host fills once per group with Python's float power
(`BeamState.powers[g, x]` = float32(x ** length_penalty)), ties are broken as there (a running
beam: the best candidates that do not stop, in rank order; a finished hypothesis: the ones
kept before the new ones, the new ones in rank order).

Not yet wired into the sampler: the host still applies the rules (issue 40's next step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_NEG = -1.0e9  # HF's "never" score
_EMPTY = float("-inf")  # a finished-hypothesis slot not filled yet


@dataclass
class BeamState:
    """A bucket's groups (G of them, K = num_beams each, L = the most tokens a row generates)
    and their rows (group g's rows are rows g*K .. g*K+K-1)."""

    # fixed for a group's life
    forced: torch.Tensor  # [G] int64: forced prompt tokens HF counts as generated
    max_new: torch.Tensor  # [G] int64
    es_true: torch.Tensor  # [G] bool: early_stopping is True
    never: torch.Tensor  # [G] bool: early_stopping "never" with a positive length penalty
    powers: torch.Tensor  # [G, P] float32: x ** length_penalty, x < P (P > max_new + forced)
    stops: torch.Tensor  # [G, S] int64: tokens that end a hypothesis, -1 padded (S may be 0)
    keep: torch.Tensor  # [G] int64: candidates a step (at most the width of `values`)
    # what a step changes
    steps: torch.Tensor  # [G] int64: tokens generated so far
    scores: torch.Tensor  # [G, K] float32: the running beams' accumulated log-probs
    hyp_scores: torch.Tensor  # [G, K] float32: finished, best first (-inf: empty)
    hyp_tokens: torch.Tensor  # [G, K, L] int64
    hyp_lens: torch.Tensor  # [G, K] int64
    improvable: torch.Tensor  # [G] bool: HF's is_early_stop_heuristic_unsatisfied
    done: torch.Tensor  # [G] bool
    history: torch.Tensor  # [G * K, L] int64: each row's generated tokens

    @property
    def num_beams(self) -> int:
        return self.scores.shape[1]


def new_state(num_beams: int, max_len: int, forced: list[int], max_new: list[int],
              early_stopping: list, length_penalty: list[float], stops: list,
              keep: list[int], device: str | torch.device = "cpu") -> BeamState:
    """A bucket's groups before their first step (every row at the head's empty history;
    the first step's candidates all come from row 0)."""
    g, k = len(forced), num_beams
    top = max(m + f for m, f in zip(max_new, forced)) + 1
    powers = torch.ones(g, top, dtype=torch.float32)
    for i, lp in enumerate(length_penalty):  # (Python's float power, as the host's rules)
        powers[i, 1:] = torch.tensor([float(x) ** lp for x in range(1, top)],
                                     dtype=torch.float32)
    width = max([len(s) for s in stops] + [0])
    stop = torch.full((g, width), -1, dtype=torch.int64)
    for i, s in enumerate(stops):
        stop[i, :len(s)] = torch.tensor(sorted(s), dtype=torch.int64)
    scores = torch.full((g, k), _NEG, dtype=torch.float32)
    scores[:, 0] = 0.0
    t = lambda x, dtype: torch.tensor(x, dtype=dtype, device=device)  # noqa: E731
    return BeamState(
        forced=t(forced, torch.int64), max_new=t(max_new, torch.int64),
        es_true=t([e is True for e in early_stopping], torch.bool),
        never=t([e == "never" and lp > 0 for e, lp in zip(early_stopping, length_penalty)],
                torch.bool),
        powers=powers.to(device), stops=stop.to(device), keep=t(keep, torch.int64),
        steps=torch.zeros(g, dtype=torch.int64, device=device), scores=scores.to(device),
        hyp_scores=torch.full((g, k), _EMPTY, dtype=torch.float32, device=device),
        hyp_tokens=torch.zeros(g, k, max_len, dtype=torch.int64, device=device),
        hyp_lens=torch.zeros(g, k, dtype=torch.int64, device=device),
        improvable=torch.ones(g, dtype=torch.bool, device=device),
        done=torch.zeros(g, dtype=torch.bool, device=device),
        history=torch.zeros(g * k, max_len, dtype=torch.int64, device=device))


def advance(state: BeamState, values: torch.Tensor, flat_ids: torch.Tensor,
            vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of every group from its candidates (`values` float32 and `flat_ids` = row *
    vocab + token, [G, W], best first, the first `keep[g]` real): the rows' parents (their
    row indices in the bucket) and new tokens, [G, K]. Updates `state` in place; a group
    already done is left as it is (its rows continue themselves)."""
    s, k = state, state.num_beams
    g, width = values.shape
    dev = values.device
    live = ~s.done
    col = torch.arange(width, device=dev)
    n = s.steps + 1
    generated = n + s.forced
    at = (n - 1).clamp(max=s.history.shape[1] - 1)  # (a done group's: written nowhere)
    row, tok = flat_ids // vocab, flat_ids % vocab
    ends = ~(col[None, :] < s.keep[:, None])  # (padding: after every real candidate)
    if s.stops.shape[1]:
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
    top_power = s.powers.shape[1] - 1  # (a done group's lengths may run past: unused)
    denom = s.powers.gather(1, generated.clamp(max=top_power)[:, None])
    new_scores = torch.where(top & may_add[:, None], values[:, :k] / denom, _EMPTY)
    parent = torch.arange(g, device=dev)[:, None] * k + row
    new_tokens = s.history[parent[:, :k]]  # [G, K, L]
    new_tokens.scatter_(2, at[:, None, None].expand(g, k, 1), tok[:, :k, None])
    merged = torch.cat([s.hyp_scores, new_scores], 1)
    pick = merged.sort(dim=1, descending=True, stable=True).indices[:, :k]
    s.hyp_scores = merged.gather(1, pick)
    s.hyp_lens = torch.cat([s.hyp_lens, n[:, None].expand(g, k)], 1).gather(1, pick)
    s.hyp_tokens = torch.cat([s.hyp_tokens, new_tokens], 1).gather(
        1, pick[:, :, None].expand(g, k, s.hyp_tokens.shape[2]))

    # can a running beam still beat the worst finished one?
    lengths = torch.where(s.never, s.max_new + s.forced, generated)
    best = scores[:, 0] / s.powers.gather(1, lengths.clamp(max=top_power)[:, None]).squeeze(1)
    full = (s.hyp_scores > _EMPTY).sum(1) == k
    worst = torch.where(full, s.hyp_scores[:, k - 1], torch.full_like(best, _NEG))
    improvable = s.improvable & (best > worst)
    done = ~(improvable & ~(full & s.es_true) & ~ends.all(1))

    # the running rows continue their parents (a done group's rows, themselves)
    own = torch.arange(g * k, device=dev).view(g, k)
    parents = torch.where(live[:, None], parent.gather(1, run), own)
    tokens = tok.gather(1, run)
    history = s.history[parents.flatten()]
    history.scatter_(1, at.repeat_interleave(k)[:, None], tokens.flatten()[:, None])
    s.history = torch.where(live.repeat_interleave(k)[:, None], history, s.history)
    s.scores = torch.where(live[:, None], scores, s.scores)
    s.improvable = torch.where(live, improvable, s.improvable)
    s.done = s.done | done
    s.steps = torch.where(live, n, s.steps)
    return parents - torch.arange(g, device=dev)[:, None] * k, tokens


def results(state: BeamState, group: int, num_return: int, length_penalty: float
            ) -> list[tuple[float, list[int]]]:
    """A done group's `num_return` best hypotheses, best first, as (score, tokens) (what
    `BeamGroup.results` gives): its finished ones, and, should fewer have finished, its best
    running beams scored the same way (their sum of log-probs over their length to the
    penalty, float32). Reads the group's rows of `state` from the device once."""
    k = state.num_beams
    scores = state.hyp_scores[group].tolist()
    lens = state.hyp_lens[group].tolist()
    tokens = state.hyp_tokens[group].tolist()
    found = [(scores[j], tokens[j][:lens[j]]) for j in range(k) if scores[j] != _EMPTY]
    if len(found) < num_return:
        n = int(state.steps[group]) + int(state.forced[group])
        denom = torch.tensor(float(max(n, 1)) ** length_penalty, dtype=torch.float32)
        running = (state.scores[group].cpu() / denom).tolist()
        steps = int(state.steps[group])
        history = state.history[group * k:(group + 1) * k, :steps].tolist()
        found += sorted(zip(running, history), key=lambda h: -h[0])
    return found[:num_return]


class BeamArena:
    """The device state of the running groups of one num_beams, kept across steps: a group
    takes a slot when it enters (its first beam step) and gives it back when it leaves
    (finished, aborted, retracted); a free slot is `done` and moves nothing. A step's
    candidates come in the batch's group order with each group's slot (`step`). Capacity
    doubles when a group finds none free."""

    def __init__(self, num_beams: int, max_len: int, capacity: int = 8,
                 device: str | torch.device = "cpu") -> None:
        self.k, self.max_len, self.device = num_beams, max_len, device
        self.state = self._empty(capacity)
        self.free = list(range(capacity - 1, -1, -1))

    def _empty(self, g: int) -> BeamState:
        state = new_state(self.k, self.max_len, [0] * g, [1] * g, [False] * g, [1.0] * g,
                          [()] * g, [2 * self.k] * g, self.device)
        state.done[:] = True  # (free slots move nothing)
        state.powers = state.powers.new_ones((g, self.max_len + 1))
        return state

    def _grow(self, capacity: int) -> None:
        old, new = self.state, self._empty(capacity)
        n = old.scores.shape[0]
        for name in BeamState.__dataclass_fields__:
            a, b = getattr(old, name), getattr(new, name)
            if name == "stops":  # (the wider of the two stop-id widths)
                width = max(a.shape[1], b.shape[1])
                b = torch.nn.functional.pad(b, (0, width - b.shape[1]), value=-1)
                a = torch.nn.functional.pad(a, (0, width - a.shape[1]), value=-1)
            if name == "powers":
                width = max(a.shape[1], b.shape[1])
                b = torch.nn.functional.pad(b, (0, width - b.shape[1]), value=1.0)
                a = torch.nn.functional.pad(a, (0, width - a.shape[1]), value=1.0)
            rows = n * self.k if name == "history" else n
            b[:rows] = a
            setattr(new, name, b)
        self.state = new
        self.free = list(range(capacity - 1, n - 1, -1)) + self.free

    def enter(self, forced: list[int], max_new: list[int], early_stopping: list,
              length_penalty: list[float], stops: list, keep: list[int]) -> list[int]:
        """Slots for new groups (their first step next), their fixed columns written."""
        while len(self.free) < len(forced):
            self._grow(2 * self.state.scores.shape[0])
        slots = [self.free.pop() for _ in forced]
        if not slots:
            return []
        fresh = new_state(self.k, self.max_len, forced, max_new, early_stopping,
                          length_penalty, stops, keep, self.device)
        s, idx = self.state, torch.tensor(slots, device=self.device)
        for name in BeamState.__dataclass_fields__:
            a, b = getattr(s, name), getattr(fresh, name)
            if name in ("stops", "powers"):
                fill = -1 if name == "stops" else 1.0
                width = max(a.shape[1], b.shape[1])
                a = torch.nn.functional.pad(a, (0, width - a.shape[1]), value=fill)
                b = torch.nn.functional.pad(b, (0, width - b.shape[1]), value=fill)
                setattr(s, name, a)
            if name == "history":
                rows = (idx[:, None] * self.k + torch.arange(self.k, device=self.device))
                a[rows.flatten()] = b
            else:
                a[idx] = b
        return slots

    def leave(self, slots: list[int]) -> None:
        """The groups of `slots` left: their slots free (and moving nothing) again."""
        self.state.done[torch.tensor(slots, dtype=torch.int64, device=self.device)] = True
        self.free += slots

    def step(self, slots: torch.Tensor, values: torch.Tensor, flat_ids: torch.Tensor,
             vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`advance` for the groups of `slots` (the batch's order), their candidates [G, W]:
        each's rows' parents (in the group) and tokens [G, K], in the batch's order."""
        cap, width = self.state.scores.shape[0], values.shape[1]
        all_values = values.new_full((cap, width), float("-inf"))
        all_ids = flat_ids.new_zeros((cap, width))
        all_values[slots], all_ids[slots] = values, flat_ids
        running = self.state.done.clone()
        self.state.done[:] = True  # (only the batch's groups move this step)
        self.state.done[slots] = running[slots]
        parents, tokens = advance(self.state, all_values, all_ids, vocab)
        moved = self.state.done[slots]
        self.state.done = running
        self.state.done[slots] = moved
        return parents[slots], tokens[slots]
