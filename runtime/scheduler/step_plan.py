"""Which rows a decoder step computes, and where each row's input token comes from.

The model to move toward is vLLM v1's: no phases, every request has the tokens the host knows
(`Req.seq_len`) and the positions whose K/V are computed or being computed (`Req.kv_len`);
a step computes what lies between, and a request in the step in flight has one more token,
sampled on the device, that the host has not read yet. Today a step has one of two shapes:

- DECODE, one token per row. A row either *continues* the step in flight (its input is the
  token that step sampled, still on the device) or is *fresh*: exactly one token on the host
  still to compute (`seq_len - kv_len == 1`). Fresh rows are requests whose last token the
  host has read, and newly admitted requests whose decoder prompt is one token with nothing
  cached beyond it (T5's, Marian's start token: `joins_decode`). Both kinds share a batch, so
  an admitted request becomes one more row of the next decode step: no forward of its own,
  and the step in flight is not drained for it.
- EXTEND, several host tokens for some row (a Llama prompt, a forced decoder prefix, a
  retracted request's recompute, a request that scores its input): every row fresh.

With `--chunked-prefill-size` a long decoder prompt is an EXTEND of one chunk at a time
(`chunkable`, `chunk_end`), and the running batch gets a DECODE step between two chunks; a
mixed forward (the chunk and the decode rows in one EXTEND layout, continuing rows among its
rows, as SGLang mixes them) is not built: `StepRows` already says which rows continue and from
where, what is missing is docs/architecture.md's list under "Chunked prefill".
"""

from __future__ import annotations

from dataclasses import dataclass

from seq2serve.runtime.scheduler.beam_search import BeamGroup
from seq2serve.runtime.scheduler.req import READS_HISTORY, Req


def joins_decode(r: Req) -> bool:
    """An admitted request whose first forward can be a row of a decode step: one decoder
    token to compute (the start token, or the last one past a cached prefix), a token wanted,
    no input to score. A beam group joins as its one row: that step is its first, whose
    candidates the host reads to make its rows (`RequestMemory.reorder_beams`), as after an
    EXTEND; the running requests advance meanwhile instead of waiting for an EXTEND."""
    return (r.seq_len - r.kv_len == 1 and r.sampling_params.max_new_tokens > 0
            and not r.wants_input_logprobs)


def chunkable(r: Req) -> bool:
    """A request whose decoder prompt may be prefilled in chunks over several steps: no
    encoder input (Mllama's per-position image ranges and encoder-decoder prefixes stay whole
    until a test covers them) and not a beam group (its first step makes its rows from the
    prompt's logits). Input log-probs are scored chunk by chunk (`ScheduleBatch.extend`)."""
    return not r.segments and r.beam is None


def chunk_end(r: Req, budget: int) -> int:
    """Where this step's prefill of `r` ends: its whole sequence, or `budget` tokens on (at
    least one: a chunk always makes progress)."""
    return min(r.seq_len, r.kv_len + max(1, budget))


def overlappable(reqs: list[Req], late_sampling: bool = False) -> bool:
    """Whether a step of these requests may be launched before the host has read the step
    before. (A beam group's first step may: the group sits out the step launched while it is
    in flight, `rows_ahead`, and joins the next with the rows the host made meanwhile.)
    Penalties, n-gram bans and grammars read every
    generated token: their rows run ahead only where the executor can queue a step's sampler
    after its forward (`late_sampling`: the sampling fields are made once the host has read
    the step before, while the forward runs: StepLauncher.complete). Whisper's timestamp
    rules never run ahead. (It runs every step over the whole running batch: the rules only
    on the rows that read their history.)"""
    if not any(map(READS_HISTORY, reqs)):  # (a C loop: the usual case)
        return True
    history = [r for r in reqs if r.reads_history]
    return late_sampling and not any(r.sampling_params.timestamps for r in history)


def plain_greedy(r: Req, pending: int = 0, forced_eos: tuple[int, ...] = (),
                 begin_suppressed: tuple[int, ...] = ()) -> bool:
    """The argmax alone decides this request's next token (`pending`: its tokens sampled on
    the device that the host has not read); not its last one where the model forces an EOS
    there (`forced_eos`), nor its first where the model bans tokens there
    (`begin_suppressed`)."""
    done = len(r.output_ids) + pending
    sp = r.sampling_params
    return (r.plain_greedy and done >= sp.min_new_tokens
            and not (forced_eos and done + 1 >= sp.max_new_tokens)
            and not (begin_suppressed and done == 0))


def rows_ahead(running: list[Req], prev: list[Req | None], page_size: int
               ) -> tuple[list[Req], int] | None:
    """The requests of a decode step launched before the step in flight (of requests `prev`,
    None for a row that samples no token: `ScheduleBatch.sampled`) is read (a beam group by
    its first row, as `running` holds it), and the new pages their rows need; None when some
    running request cannot run so (it has several tokens to compute). Requests whose token in
    flight is their last are left out, and so is a beam group whose first step is in flight
    (its rows are made when the host reads that step: it joins the step after, its rows'
    tokens and scores from the host)."""
    in_prev = set(prev)  # (requests hash by identity)
    rows, pages = [], 0
    for r in running:  # (one pass, each attribute read once: every row, every step)
        beam = r.beam
        if beam is not None and beam.table_rows is not None:  # (a group, by its first row)
            # (its rows continue the step in flight, or join: made after its first step)
            if beam.steps + (r in in_prev) < r.sampling_params.max_new_tokens:
                rows.append(r)  # (lay_out makes its rows)
                if r.kv_len == beam.npages * page_size:  # (its rows are all as long)
                    pages += len(beam.rows)
            continue
        done = len(r.output_ids)  # its generated tokens, the one in flight counted in
        if r in in_prev:
            if beam is not None:  # (its first step is in flight: it sits this one out)
                continue
            done += 1
        elif r.seq_len - r.kv_len != 1:
            return None
        if done < r.sampling_params.max_new_tokens:
            rows.append(r)
            if r.kv_len == len(r.kv_pages) * page_size:  # at a page boundary
                pages += 1
    return rows, pages


@dataclass
class StepRows:
    """One forward's rows in batch order: the beam groups' rows first, group by group (the
    sampler reads them as one block, in buckets of equal shape), then the rows that continue
    the step in flight, then the fresh ones."""

    reqs: list[Req]
    groups: list[BeamGroup]
    # each of the first rows' row in the step in flight: the rows that continue it, and among
    # the beam rows, -1 for those of a group joining with the host's tokens (`joining`)
    prev_rows: list[int]
    joining: bool = False
    beam_rows: int = 0  # the first rows, the beam groups'

    @property
    def continuing(self) -> int:
        return len(self.prev_rows)

    @property
    def pending(self) -> list[int]:
        """Each row's tokens sampled on the device and not yet read by the host."""
        if self.joining:
            return [int(p >= 0) for p in self.prev_rows] + [0] * (len(self.reqs)
                                                                   - self.continuing)
        return [1] * self.continuing + [0] * (len(self.reqs) - self.continuing)


def lay_out(reqs: list[Req], prev: list[Req | None] | None, order=None) -> StepRows:
    """Order `reqs` for one forward; `prev`: the requests of the step in flight whose sampled
    tokens are this step's inputs (None: every input is on the host). `order`: `beam_order`
    or what keeps its value (the launcher's `GroupMemo` of it over the beam book: the same
    while the same requests come again and no group has entered or left the book)."""
    groups, beam_rows, others = (order or beam_order)(reqs)
    nb = len(beam_rows)
    if nb and prev and prev[:nb] == beam_rows:  # (the usual beam step: as in the step before;
        # rows compare by identity) the beam rows continue from the first rows, in order
        if len(prev) == nb and not others:  # (beam rows alone: nothing else to place)
            return StepRows(beam_rows, groups, list(range(nb)), beam_rows=nb)
        where = dict(zip(prev[nb:], range(nb, len(prev))))
        where.pop(None, None)
        fresh = [r for r in others if r not in where]
        cont = [r for r in others if r in where]
        return StepRows(beam_rows + cont + fresh, groups,
                        list(range(nb)) + [where[r] for r in cont], beam_rows=nb)
    # each request's row in the step in flight (requests hash by identity)
    where = dict(zip(prev, range(len(prev)))) if prev else {}
    where.pop(None, None)  # (rows of the step in flight that sampled nothing)
    if not where:
        return StepRows(beam_rows + others, groups, [], beam_rows=nb)
    fresh = [r for r in others if r not in where]
    cont = [r for r in others if r in where]
    # a beam group's rows continue the step in flight, or all join (the group's first step,
    # or its first with all its rows): -1, their tokens and scores from the host
    beam_prev = [where.get(r, -1) for r in beam_rows]
    joining = -1 in beam_prev
    if joining and not cont and max(beam_prev) < 0:  # (nothing continues)
        return StepRows(beam_rows + fresh, groups, [], beam_rows=nb)
    return StepRows(beam_rows + cont + fresh, groups, beam_prev + [where[r] for r in cont],
                    joining, beam_rows=nb)


def beam_order(reqs: list[Req]) -> tuple[list[BeamGroup], list[Req], list[Req]]:
    """The beam groups of `reqs` (by their first rows) in bucket order, their rows, and the
    other requests."""
    groups = dict.fromkeys([r.beam for r in reqs])  # (groups hash by identity)
    groups.pop(None, None)
    groups = sorted(groups, key=_shape)  # stable: equal shapes keep order
    return groups, [r for g in groups for r in g.rows], [r for r in reqs if r.beam is None]


def _shape(g: BeamGroup) -> tuple[int, int, int]:
    """A group's bucket in the sampler: (rows, candidates kept, num_beams: at its first step
    a group has one row, and the device's rules take a bucket of one num_beams)."""
    return len(g.rows), g.keep, g.num_beams
