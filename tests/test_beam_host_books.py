"""The host's per-step beam books, rewritten for speed, against the code they replaced (kept
here as references): `StepLauncher._beam_moves` and `step_plan.lay_out` / `rows_ahead`, and
the beam book's step (`RequestMemory.follow_beams` over all groups at once, and
`alloc_beam_next`) against the per-group list books it replaced (pages freed, rows' pages and
outputs, the group's peak), on random fake groups (rows sharing page prefixes as beams do).
No model."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.scheduler.beam_book import BeamBook, BookPages, BookTokens
from seq2serve.runtime.scheduler.beam_search import BeamGroup
from seq2serve.runtime.scheduler.group_memo import GroupMemo
from seq2serve.runtime.scheduler.req import Req
from seq2serve.runtime.scheduler.request_memory import RequestMemory
from seq2serve.runtime.scheduler.step_launcher import StepLauncher
from seq2serve.runtime.scheduler.step_plan import StepRows, beam_order, lay_out, rows_ahead

PS = 16


class _Allocator:
    def __init__(self) -> None:
        self.freed: list[list[int]] = []
        self.next = 5000  # (pages handed out by alloc: above every page make_groups uses)

    def free(self, pages) -> None:
        self.freed.append(list(pages))

    def alloc(self, n: int) -> list[int]:
        self.next += n
        return list(range(self.next - n, self.next))


class _Pool:
    page_size = PS

    def __init__(self) -> None:
        self.allocator = _Allocator()


def _memory() -> RequestMemory:
    m = RequestMemory.__new__(RequestMemory)
    m.token_to_kv, m.page_size = _Pool(), PS
    m.beam_book = BeamBook(400, 8192, PS)
    return m


def _into_book(m: RequestMemory, groups: list[BeamGroup]) -> None:
    """The groups' list books (make_groups) moved into `m`'s beam book, as a first step
    leaves them, with their whole histories; their peaks as they were."""
    book = m.beam_book
    for g in groups:
        if len(g.rows) == 1:
            continue
        peak, done = g.peak_pages, len(g.rows[0].output_ids)
        book.enter(g, [r.req_pool_idx for r in g.rows], [list(r.kv_pages) for r in g.rows],
                   [0] * len(g.rows), g.rows[0].prefix_pages)
        book._fit(tokens=done)
        for r in g.rows:
            book.tokens[r.req_pool_idx, :done] = r.output_ids
            r.output_ids = BookTokens(book, r.req_pool_idx, g)
            r.kv_pages = BookPages(book, r.req_pool_idx, g)
        g.steps, g.peak_pages = done, peak


def reference_enter(self, group, table_rows, pages, tokens, prefix):
    """`BeamBook.enter` as it was, one group at a time."""
    n = len(pages[0])
    self._fit(pages=n, tokens=1)
    rows = np.array(table_rows, dtype=np.int64)
    held = np.array(pages, dtype=np.int64).reshape(len(rows), n)
    self.pages[rows, :n] = held
    self.tokens[rows, 0] = tokens
    own = held[:, prefix:].ravel()
    np.add.at(self.refs, own, 1)
    group.table_rows, group.npages, group.steps = rows, n, 1
    self.version += 1
    group.held = len(np.unique(own))
    group.peak_pages = max(group.peak_pages, prefix + group.held)


def reference_follow_beams(self, group, choices, length):
    old = group.rows
    if all(p == j for j, (p, _) in enumerate(choices)):
        for row, (_, token) in zip(old, choices):
            row.output_ids.append(token)
        # (the list books kept the peak as it was here; the beam book counts it every step)
        pre = old[0].prefix_pages
        held = {pg for r in old for pg in r.kv_pages[pre:]}
        group.peak_pages = max(group.peak_pages, pre + len(held))
        return
    full, pre = length // self.page_size, old[0].prefix_pages
    pages = [old[p].kv_pages[:full] + row.kv_pages[full:] for row, (p, _) in zip(old, choices)]
    kept = {pg for own in pages for pg in own[pre:]}
    self.token_to_kv.allocator.free(sorted({pg for r in old for pg in r.kv_pages[pre:]}
                                           - kept))
    outputs = [old[p].output_ids + [token] for p, token in choices]
    for row, own, out in zip(old, pages, outputs):
        row.kv_pages, row.output_ids = own, out
    group.peak_pages = max(group.peak_pages, pre + len(kept))


def reference_beam_moves(self, groups):
    ps = self.memory.page_size
    table_rows, shared_end, copy_len = [], [], []
    for g in groups:
        steady = len(g.rows) > 1
        for r in g.rows:
            length = r.kv_len + 1 if steady else 0
            table_rows.append(r.req_pool_idx)
            shared_end.append(length - length % ps)
            copy_len.append(length % ps)
    sizes = [len(g.rows) for g in groups]
    return (torch.tensor(table_rows), torch.tensor(shared_end), torch.tensor(copy_len),
            max(1, max(copy_len)), torch.tensor([0] + sizes, dtype=torch.int64).cumsum(0),
            max(sizes))


def reference_rows_ahead(running, prev, page_size):
    in_prev = {id(r) for r in prev if r is not None}
    rows, pages = [], 0
    for r in running:
        g = r.beam
        booked = g is not None and g.table_rows is not None
        # (a booked group's rows continue the step in flight with its first row, or join)
        pending = 1 if id(g.rows[0] if booked else r) in in_prev else 0
        if g is not None and not booked and pending:
            continue  # (its first step is in flight: its rows do not exist yet)
        if not pending and not booked and r.seq_len - r.kv_len != 1:
            return None
        if len(r.output_ids) + pending < r.sampling_params.max_new_tokens:
            rows.append(r)
            pages += r.kv_len == len(r.kv_pages) * page_size
    return rows, pages


def reference_lay_out(reqs, prev):
    groups = sorted({id(r.beam): r.beam for r in reqs if r.beam is not None}.values(),
                    key=lambda g: (len(g.rows), g.keep))
    beam_rows = [r for g in groups for r in g.rows]
    where = {id(r): i for i, r in enumerate(prev or ()) if r is not None}
    others = [r for r in reqs if r.beam is None]
    fresh = [r for r in others if id(r) not in where]
    cont = [r for r in others if id(r) in where]
    if not where:
        return StepRows(beam_rows + others, groups, [])
    # beam rows not in the step in flight join (-1: the host's tokens and scores)
    beam_prev = [where.get(id(r), -1) for r in beam_rows]
    if not cont and all(p < 0 for p in beam_prev):
        return StepRows(beam_rows + fresh, groups, [])
    return StepRows(beam_rows + cont + fresh, groups, beam_prev + [where[id(r)] for r in cont],
                    -1 in beam_prev)


def make_groups(rng: random.Random, n: int, steady: bool = True) -> list[BeamGroup]:
    groups, page, idx = [], 0, 0
    for i in range(n):
        beams = rng.randint(2, 5)
        sp = SamplingParams(max_new_tokens=rng.randint(5, 60), num_beams=beams)
        head = Req(rid=str(i), encoder_input_ids=[5], decoder_input_ids=[0], sampling_params=sp)
        g = BeamGroup(rows=[head], stop_ids=frozenset(rng.sample(range(9), rng.randint(0, 3))))
        head.beam = g
        done, pre = rng.randint(0, 50), rng.randint(0, 1)
        if steady or rng.random() < 0.7:
            g.rows += [Req(rid=f"{i}-{j}", encoder_input_ids=[5], decoder_input_ids=[0],
                           sampling_params=sp) for j in range(1, beams)]
        own = done // PS + 1 + rng.randint(0, 1)  # (a page added by the next step's launch)
        base = list(range(page, page + own))
        page += own
        for j, r in enumerate(g.rows):
            r.beam, r.req_pool_idx, r.prefix_pages = g, idx, min(pre, (done + 1) // PS)
            idx += 1
            r.output_ids = [rng.randrange(100) for _ in range(done)]
            r.kv_len = done + 1
            # shares its first pages with row 0: only full pages (each row's last ones are
            # its own), and at least the prefix
            split = rng.randint(r.prefix_pages, min(own, (done + 1) // PS))
            r.kv_pages = base[:split] + list(range(page, page + own - split)) if j else base
            page += own - split if j else 0
        g.peak_pages = rng.randint(0, 3)
        groups.append(g)
    return groups


def _books(groups):
    return [([list(r.kv_pages) for r in g.rows], [list(r.output_ids) for r in g.rows],
             g.peak_pages) for g in groups]


def reference_alloc_next(self, reqs):
    ps, alloc, slots = self.page_size, self.token_to_kv.allocator.alloc, []
    for r in reqs:
        pos, pages = r.kv_len, r.kv_pages
        if pos == len(pages) * ps:
            pages.append(alloc(1)[0])
        r.kv_len = pos + 1
        slots.append(pages[pos // ps] * ps + pos % ps)
    return slots


@pytest.mark.parametrize("seed", range(20))
def test_follow_beams_matches_reference(seed):
    """Every group's step at once in the beam book == the list books, group by group (then a
    second step on the result, which the book's first step left)."""
    rng = random.Random(seed)
    states = []
    for in_book in (True, False):
        rng.seed(seed)
        groups, m = make_groups(rng, 60), _memory()
        if in_book:
            _into_book(m, groups)
        for _ in range(2):
            steps = []
            for g in groups:
                k = len(g.rows)
                if rng.random() < 0.2:
                    choices = [(j, rng.randrange(100)) for j in range(k)]  # every row runs on
                else:
                    choices = [(rng.randrange(k), rng.randrange(100)) for _ in range(k)]
                steps.append(choices)
            if in_book:
                offsets = np.cumsum([0] + [len(g.rows) for g in groups])
                parents = np.array([offsets[i] + p for i, c in enumerate(steps)
                                    for p, _ in c])
                tokens = np.array([t for c in steps for _, t in c])
                m.follow_beams(groups, parents, tokens)
            else:
                for g, choices in zip(groups, steps):
                    # positions written: the head's fill ids
                    reference_follow_beams(m, g, choices, g.rows[0].seq_len)
        states.append((_books(groups), sorted(p for f in m.token_to_kv.allocator.freed
                                              for p in f)))
        if in_book:
            for g in groups:  # the book's own accounting agrees with its rows
                m.beam_book.owned(g, g.rows[0].prefix_pages)
    assert states[0] == states[1]


@pytest.mark.parametrize("seed", range(10))
def test_alloc_beam_next_matches_reference(seed):
    """The beam rows' next slots from the book (a page more for each row at a page boundary)
    == the per-row list books' (`alloc_next` as it was)."""
    rng = random.Random(seed)
    states = []
    for in_book in (True, False):
        rng.seed(seed)
        groups, m = make_groups(rng, 40), _memory()
        for g in groups:  # (rows at a page boundary, and rows inside a page)
            for r in g.rows:
                r.kv_len = len(r.kv_pages) * PS - rng.choice([0, 0, 3])
            for r in g.rows[1:]:
                r.kv_len = g.rows[0].kv_len
        if in_book:
            _into_book(m, groups)
            slots = m.alloc_beam_next(groups).tolist()
        else:
            slots = reference_alloc_next(m, [r for g in groups for r in g.rows])
        states.append((slots, _books(groups), [r.kv_len for g in groups for r in g.rows]))
    assert states[0] == states[1]


@pytest.mark.parametrize("seed", range(10))
def test_beam_moves_matches_reference(seed):
    rng = random.Random(seed)
    groups = make_groups(rng, 40, steady=False)
    m = _memory()
    _into_book(m, groups)
    launcher = StepLauncher(None, m, 100, (1,), "cpu")
    got = launcher._beam_moves(groups)
    want = reference_beam_moves(launcher, groups)
    fields = (got.table_rows, got.shared_end, got.copy_len, got.copy_width, got.starts,
              got.max_beams)
    for a, b in zip(fields, want):
        if isinstance(b, torch.Tensor):
            assert torch.equal(a, b)
        else:
            assert a == b


@pytest.mark.parametrize("seed", range(10))
def test_lay_out_and_rows_ahead_match_reference(seed):
    rng = random.Random(seed)
    groups = make_groups(rng, 12)
    if seed % 2:  # (rows_ahead reads a group's lengths from the beam book)
        _into_book(_memory(), groups)
    plain = [Req(rid=f"p{i}", encoder_input_ids=[5], decoder_input_ids=[0],
                 sampling_params=SamplingParams(max_new_tokens=rng.randint(1, 9)))
             for i in range(15)]
    for r in plain:
        r.output_ids = [3] * rng.randint(0, 8)
        r.kv_len = len(r.fill_ids) - rng.choice([0, 1])
        r.kv_pages = [0] * rng.randint(0, 2)
    reqs = [r for g in groups for r in g.rows] + plain
    rng.shuffle(reqs)
    partly = [r if r.beam is not None or rng.random() < 0.7 else None for r in reqs]
    laid = lay_out(reqs, None).reqs  # (the beam rows first, as a step lays them out)
    # (the last: one group not in the step in flight, as after its first step: it joins)
    cases = (None, [], [None, None], reqs, partly, rng.sample(reqs, len(reqs)), laid,
             laid[:len(laid) // 2] + [None] + laid[len(laid) // 2:],
             [r for r in laid if r.beam is not groups[0]])
    # `running` holds a group in the book by its first row (the others are its rows)
    booked = {id(g) for g in groups if g.table_rows is not None}
    running = [r for r in reqs if r.beam is None or id(r.beam) not in booked
               or r is r.beam.rows[0]]
    expanded = [x for r in running for x in
                (r.beam.rows if r.beam is not None and id(r.beam) in booked else [r])]

    def rows_of(result):
        if result is None:
            return None
        got, pages = result
        return [x for r in got for x in
                (r.beam.rows if r.beam is not None and id(r.beam) in booked else [r])], pages

    joined = 0
    order = GroupMemo(beam_order)  # (the launcher's: kept while the same requests come)
    beam_only = [r for r in laid if r.beam is not None]
    for prev in cases:
        a, b = lay_out(reqs, prev), reference_lay_out(reqs, prev)
        joined += a.joining
        assert (a.reqs, a.groups, a.prev_rows, a.joining) == (b.reqs, b.groups, b.prev_rows,
                                                              b.joining)
        assert a.beam_rows == sum(len(g.rows) for g in b.groups)
        kept = lay_out(reqs, prev, order)
        assert (kept.reqs, kept.groups, kept.prev_rows, kept.joining, kept.beam_rows) == (
            a.reqs, a.groups, a.prev_rows, a.joining, a.beam_rows)
        # beam rows alone, as in the step before (the steady beam step)
        a, b = lay_out(beam_only, beam_only, order), reference_lay_out(beam_only, beam_only)
        assert (a.reqs, a.groups, a.prev_rows, a.joining) == (b.reqs, b.groups, b.prev_rows,
                                                              b.joining)
        assert a.pending == [int(p >= 0) for p in b.prev_rows] + [0] * (len(b.reqs)
                                                                        - len(b.prev_rows))
        a, b = lay_out(running, prev), reference_lay_out(running, prev)  # (first rows alone)
        assert (a.reqs, a.groups, a.prev_rows, a.joining) == (b.reqs, b.groups, b.prev_rows,
                                                              b.joining)
        for p in (prev or [], reqs):
            assert rows_of(rows_ahead(running, p, PS)) == reference_rows_ahead(expanded, p, PS)
    assert joined  # (a group joined beside continuing rows)


@pytest.mark.parametrize("seed", range(6))
def test_groups_enter_the_book_together_as_one_by_one(seed):
    """`BeamBook.enter_many` (a wave's first steps at once) leaves the book and the groups
    (table rows, pages, held pages, peak) as the one-group `enter` it replaced: groups of different
    page counts and radix-owned prefixes, rows sharing all but a last page or all pages."""
    rng = random.Random(seed)
    made = []
    for _ in range(2):
        rng.seed(seed)
        groups = [g for g in make_groups(rng, 30) if len(g.rows) > 1]
        entries = [(g, [r.req_pool_idx for r in g.rows], [list(r.kv_pages) for r in g.rows],
                    [rng.randrange(50) for _ in g.rows], g.rows[0].prefix_pages)
                   for g in groups]
        made.append((groups, entries))
    (one, by_one), (many, together) = made
    a, b = BeamBook(400, 8192, PS), BeamBook(400, 8192, PS)
    for entry in by_one:
        reference_enter(a, *entry)
    b.enter_many(together)
    assert len({len(e[2][0]) for e in together}) > 1  # (groups of different page counts)
    assert any(e[4] for e in together)  # (and radix-owned prefixes)
    assert np.array_equal(a.refs, b.refs) and np.array_equal(a.tokens, b.tokens)
    for g, h in zip(one, many):
        assert g.table_rows.tolist() == h.table_rows.tolist()
        assert (g.npages, g.steps, g.held, g.peak_pages) == (h.npages, h.steps, h.held,
                                                             h.peak_pages)
        rows = g.table_rows
        assert np.array_equal(a.pages[rows, :g.npages], b.pages[rows, :g.npages])
