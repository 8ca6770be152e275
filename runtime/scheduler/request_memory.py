"""The one place that allocates and frees a request's memory in every pool and cache."""

from __future__ import annotations

from collections import Counter
from operator import attrgetter

import numpy as np
import torch

from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
from seq2serve.encoders.encoder_cache import EncoderCache, EncoderCacheEntry, EncoderJob, EncodeWork
from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool
from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool
from seq2serve.runtime.scheduler.beam_book import BeamBook, BookPages, BookTokens
from seq2serve.runtime.scheduler.beam_search import BeamGroup
from seq2serve.runtime.scheduler.beam_slots import BeamSlots
from seq2serve.runtime.scheduler.radix_cache import RadixCache
from seq2serve.runtime.scheduler.req import Req

_STEPS, _NPAGES = attrgetter("steps"), attrgetter("npages")  # (a beam group's, in C loops)


class InputsNeeded(Exception):
    """An encoder input must be encoded but its data can no longer be read (its sender has
    released it: the request was aborted meanwhile)."""


class RequestMemory:
    """Ownership contract: from `admit` until `release`/`finish`, a request owns its table row
    (`req_pool_idx`) and the pages `kv_pages[prefix_pages:]`; its first `prefix_pages` pages
    belong to the radix cache, which keeps them while the request holds its `prefix_node`
    lock. Its cross K/V belong to the encoder cache; the request holds a reference to each
    entry in `cross_entries`. Only this class touches the allocators and caches, so `check`
    can account for every slot: free + cached + owned by live requests = total.
    """

    def __init__(self, req_to_token: ReqToTokenPool, token_to_kv: TokenToKVPool,
                 cross_kv: CrossKVPool | None, encoder_cache: EncoderCache | None,
                 radix: RadixCache) -> None:
        self.req_to_token = req_to_token
        self.token_to_kv = token_to_kv
        self.cross_kv = cross_kv
        self.encoder_cache = encoder_cache
        self.radix = radix
        self.page_size = token_to_kv.page_size
        # an eviction walks the whole radix tree (thousands of nodes on a busy server): each
        # frees a slice of the pool at once, least recently used first, so that the next
        # steps' few pages need no walk
        self.evict_ahead_pages = max(1, token_to_kv.allocator.num_pages // 64)
        self.beam_slots = BeamSlots()  # the groups' slots in the device's beam state
        self.beam_book = BeamBook(req_to_token.size, token_to_kv.allocator.num_pages,
                                  self.page_size)
        # admissions' table rows (a cached prefix's slots, the cross K/V's), written to the
        # device together by `flush_writes` before anything reads them: table -> rows, values
        self.pending: dict[str, tuple[list[int], list[torch.Tensor]]] = {}

    # --- sizes -------------------------------------------------------------------------------
    def pages_to_grow(self, req: Req, new_len: int) -> int:
        return max(0, self.token_to_kv.pages_for(new_len) - len(req.kv_pages))

    def make_room(self, pages: int) -> bool:
        """Evict cached prefixes until `pages` decoder KV pages are free (and a slice more,
        `evict_ahead_pages`, when it evicts at all)."""
        free = self.token_to_kv.allocator.num_free
        if free < pages:
            self.radix.evict(max(pages - free, self.evict_ahead_pages))
        return self.token_to_kv.allocator.num_free >= pages

    # --- admission ---------------------------------------------------------------------------
    def admit(self, req: Req, reserve_pages: int = 0) -> list[EncoderJob] | None:
        """Give `req` a table row, its cross K/V (from the encoder cache where it can) and
        decoder pages for its whole current sequence (reusing a cached prefix where it can),
        keeping `reserve_pages` free for others. Returns the encoder work still to do, or
        None with nothing held when memory is short; raises InputsNeeded (nothing held) when
        an input to encode has no data any more. A beam request also reserves the table rows
        of its other beams."""
        if self.req_to_token.num_free < req.sampling_params.num_beams:
            return None
        jobs: list[EncoderJob] = []
        fresh = not req.cross_entries  # a retracted request keeps its cross K/V
        if fresh and req.segments:
            jobs = self._acquire_cross(req)
            if jobs is None:
                return None
        # the decoder prefix: at least the last token is computed, for its logits
        match = self.radix.match_prefix(req.namespace, req.fill_ids[: req.max_cached_prefix],
                                        req.user)
        pages, node = match.pages, match.node
        self.radix.lock(node)
        need = self.token_to_kv.pages_for(req.seq_len) - len(pages)
        if not self.make_room(need + reserve_pages):
            self.radix.unlock(node)
            if fresh:
                self._release_cross(req)
            return None
        req.req_pool_idx = self.req_to_token.alloc()
        req.prefix_node, req.prefix_pages = node, len(pages)
        req.kv_pages = pages + self.token_to_kv.allocator.alloc(need)
        req.kv_len = req.cached_tokens = len(pages) * self.page_size
        req.cached_public_tokens = match.public_pages * self.page_size
        if req.kv_len:  # the prefix's slots, for attention
            self._write("req_to_token", req.req_pool_idx,
                        self.token_to_kv.slots(pages, 0, req.kv_len))
        for e in req.cross_entries:
            self._write("req_to_cross", req.req_pool_idx, e.handle.loc)
        if fresh:
            req.encoder_cache_hit = bool(req.segments) and all(
                j.work is not EncodeWork.ENCODE for j in jobs)
        if req.beam is not None:
            req.beam.spare_rows = [self.req_to_token.alloc()
                                   for _ in range(req.sampling_params.num_beams - 1)]
        return jobs

    def _write(self, table: str, row: int, values: torch.Tensor) -> None:
        """Queue a table write (a row's values in order: several for one row continue it)."""
        rows, vals = self.pending.setdefault(table, ([], []))
        if rows and rows[-1] == row:  # (a request's next cross entry: after the one before)
            vals[-1] = torch.cat([vals[-1], values])
        else:
            rows.append(row)
            vals.append(values)

    def flush_writes(self) -> None:
        """The queued admissions' table writes, on the device now (one per table)."""
        for table, (rows, values) in self.pending.items():
            self.req_to_token.write_rows(table, rows, values)
        self.pending.clear()

    def _acquire_cross(self, req: Req) -> list[EncoderJob] | None:
        """Raises InputsNeeded (nothing held) if an input whose data is gone must be encoded."""
        cache, ns, segs = self.encoder_cache, req.namespace[0], req.segments
        # cached inputs first: making room for a new one evicts unused entries, which must
        # not be the ones this request is about to use
        order = sorted(range(len(segs)),
                       key=lambda i: not cache.cached((ns, segs[i].key), req.user))
        got: dict[int, tuple[EncoderCacheEntry, EncodeWork]] = {}
        for i in order:
            acquired = cache.acquire((ns, segs[i].key), segs[i].length, req.user)
            if acquired is None:
                break
            got[i] = acquired
        req.cross_entries = [got[i][0] for i in sorted(got)]
        if len(got) < len(segs):
            self._release_cross(req)
            return None
        if any(got[i][1] is EncodeWork.ENCODE and seg.missing_data
               for i, seg in enumerate(segs)):
            self._release_cross(req)
            raise InputsNeeded(req.rid)
        req.encoder_public_hits = sum(work is not EncodeWork.ENCODE and entry.public
                                      for entry, work in got.values())
        return [EncoderJob(entry, work, seg) for seg, (entry, work) in
                ((segs[i], got[i]) for i in range(len(segs))) if work is not EncodeWork.NONE]

    def _release_cross(self, req: Req) -> None:
        for e in req.cross_entries:
            self.encoder_cache.release(e)
        req.cross_entries = []

    # --- growing -----------------------------------------------------------------------------
    def alloc_tokens(self, req: Req, new_len: int) -> torch.Tensor | None:
        """Slots for decoder positions [req.kv_len, new_len) (CPU int32), growing the request's
        pages as needed; None (and nothing allocated) when the pool is short."""
        grow = self.pages_to_grow(req, new_len)
        if grow:
            pages = self.token_to_kv.allocator.alloc(grow)
            if pages is None:
                return None
            req.kv_pages.extend(pages)
        slots = self.token_to_kv.slots(req.kv_pages, req.kv_len, new_len)
        req.kv_len = new_len
        return slots

    def alloc_next(self, reqs: list[Req]) -> list[int] | None:
        """The slot of each request's next decoder position (the decode fast path: one loop
        for the batch); None when a new page is needed and the pool has none (the requests
        before it keep their new slots)."""
        ps, alloc, slots = self.page_size, self.token_to_kv.allocator.alloc, []
        for r in reqs:
            pos, pages = r.kv_len, r.kv_pages
            if pos == len(pages) * ps:
                new = alloc(1)
                if new is None:
                    return None
                pages.append(new[0])
            r.kv_len = pos + 1
            slots.append(pages[pos // ps] * ps + pos % ps)
        return slots

    # --- beams -------------------------------------------------------------------------------
    def reorder_beams(self, steps: list[tuple[BeamGroup, list[tuple[int, int]]]]
                      ) -> list[BeamGroup]:
        """The first step of each (group, choices): row j of the group starts with token
        `choices[j][1]` after the prompt of its one row (the user's request). The other rows
        are created on the reserved table rows and share the prompt's pages; a partly filled
        last page, which every row would write, is copied for each row but the first. The
        group enters the beam book. The device work of all groups is done in a few batched
        copies. Returns the groups left unchanged because the pool had no room for their
        copies."""
        plan, entries = _DeviceCopies(), []
        failed = [g for g, choices in steps if not self._first_step(g, choices, plan, entries)]
        self.beam_book.enter_many(entries)  # (all the groups' books in a few array operations)
        plan.apply(self.req_to_token, self.token_to_kv)
        return failed

    def _first_step(self, group: BeamGroup, choices: list[tuple[int, int]],
                    plan: _DeviceCopies, entries: list) -> bool:
        (head,) = group.rows
        assert all(p == 0 for p, _ in choices), "a first step continues the one row"
        ps, length = self.page_size, head.kv_len
        partial = length % ps  # positions filled in the last page
        copies = len(choices) - 1 if partial else 0
        if not self.make_room(copies):
            return False
        rows = [head] + group.spawn_rows(len(choices) - 1)
        pages, fresh = [list(head.kv_pages)], self.token_to_kv.allocator.alloc(copies)
        for row in rows[1:]:  # new rows read the same cross K/V and prompt pages
            plan.cross.append((head.req_pool_idx, row.req_pool_idx))
            plan.tables.append((head.req_pool_idx, row.req_pool_idx))
            own = list(head.kv_pages)
            if partial:
                page = fresh.pop()
                plan.pages.append((own[-1], page, partial))
                plan.fixes.append((row.req_pool_idx, length - partial, page * ps, partial))
                own[-1] = page
            pages.append(own)
        group.rows = rows
        entries.append((group, [r.req_pool_idx for r in rows], pages,
                        [token for _, token in choices], head.prefix_pages))
        for row in rows:
            row.kv_len = length
            row.kv_pages = BookPages(self.beam_book, row.req_pool_idx, group)
            row.output_ids = BookTokens(self.beam_book, row.req_pool_idx, group)
        return True

    def alloc_beam_next(self, groups: list[BeamGroup],
                        lengths: np.ndarray | None = None) -> np.ndarray | None:
        """The slot of each beam row's next decoder position (the rows of `groups` in order,
        every group in the beam book; `lengths`: each group's rows' kv_len, if the caller has
        them), a new page for each row of a group at a page boundary; None (nothing
        allocated) when the pool is short."""
        ps = self.page_size
        if lengths is None:
            lengths = np.fromiter((g.rows[0].kv_len for g in groups), dtype=np.int64,
                                  count=len(groups))
        sizes, rows, _ = self.beam_book.rows_of(groups)
        npages = np.fromiter(map(_NPAGES, groups), dtype=np.int64, count=len(groups))
        at_boundary = np.flatnonzero(lengths == npages * ps)
        if at_boundary.size:
            new = self.token_to_kv.allocator.alloc(int(sizes[at_boundary].sum()))
            if new is None:
                return None
            self.beam_book.grow([groups[i] for i in at_boundary.tolist()], new)
        slots = self.beam_book.slots(rows, np.repeat(lengths, sizes))
        for g, n in zip(groups, (lengths + 1).tolist()):
            for r in g.rows:
                r.kv_len = n
        return slots

    def follow_beams(self, groups: list[BeamGroup], parents: np.ndarray,
                     tokens: np.ndarray) -> None:
        """The books of a beam step the device has already made (`move_pages`) for `groups`
        (each past its first step): their rows, in order, continue rows `parents` (indices
        into that concatenation) with `tokens`. Pages no row holds any more are freed;
        nothing is allocated (BeamBook.follow)."""
        prompt, prefix = self.beam_book.prompts_of(groups)
        steps = np.fromiter(map(_STEPS, groups), dtype=np.int64,
                            count=len(groups))  # (= len(output_ids))
        freed = self.beam_book.follow(groups, parents, tokens, prompt + steps, prefix)
        if freed:
            self.token_to_kv.allocator.free(freed)

    def release_beams(self, group: BeamGroup, keep_cross: bool = False) -> None:
        """Free everything a beam group holds (its rows' shared pages once). Its rows' tokens
        and pages become lists again (the user's request keeps its own tokens)."""
        head = group.rows[0]
        if group.slot is not None:
            self.beam_slots.give(group.num_beams, group.slot)
            group.slot = None
        pre = head.prefix_pages
        if group.table_rows is not None:
            prefix = head.kv_pages[:pre]
            head.output_ids = list(head.output_ids)
            self.token_to_kv.allocator.free(self.beam_book.leave(group, pre))
            head.kv_pages = prefix
        else:  # (before its first step: the one row's lists)
            self.token_to_kv.allocator.free(head.kv_pages[pre:])
            head.kv_pages = head.kv_pages[:pre]
        for r in group.rows[1:]:
            self.req_to_token.free(r.req_pool_idx)
            r.req_pool_idx, r.kv_pages, r.kv_len, r.output_ids = None, [], 0, []
        for idx in group.spare_rows:
            self.req_to_token.free(idx)
        group.spare_rows = []
        self.release(head, keep_cross)

    # --- releasing ---------------------------------------------------------------------------
    def finish(self, req: Req) -> None:
        """A finished request: offer its computed decoder K/V to the radix cache, then release."""
        if req.req_pool_idx is None:
            return self.release(req)
        full = req.kv_len // self.page_size  # only whole pages are shared
        tokens = req.fill_ids[: full * self.page_size]
        duplicates = self.radix.insert(req.namespace, tokens, req.kv_pages[:full], req.user,
                                       cached_pages=req.prefix_pages)
        self.token_to_kv.allocator.free(duplicates + req.kv_pages[full:])
        req.kv_pages = []
        self.release(req)

    def release(self, req: Req, keep_cross: bool = False) -> None:
        """Free what the request owns (keeping its cross K/V references if `keep_cross`)."""
        if len(req.kv_pages) > req.prefix_pages:
            self.token_to_kv.allocator.free(req.kv_pages[req.prefix_pages:])
        req.kv_pages, req.prefix_pages, req.kv_len = [], 0, 0
        if req.prefix_node is not None:
            self.radix.unlock(req.prefix_node)
            req.prefix_node = None
        if req.req_pool_idx is not None:
            self.req_to_token.free(req.req_pool_idx)
            req.req_pool_idx = None
        if not keep_cross:
            self._release_cross(req)

    # --- integrity ---------------------------------------------------------------------------
    def check(self, live: list[Req]) -> None:
        """Raise AssertionError unless free + cached + owned by `live` = total, in every pool."""
        if self.pending:
            raise AssertionError(f"table writes queued but not made: {sorted(self.pending)}")
        rows, owned, groups = [], [], {}
        for r in live:
            if r.beam is not None:
                groups[id(r.beam)] = r.beam
            else:
                rows += [] if r.req_pool_idx is None else [r.req_pool_idx]
                owned += r.kv_pages[r.prefix_pages:]
        for g in groups.values():  # a group's rows share pages: each counts once
            rows += [r.req_pool_idx for r in g.rows if r.req_pool_idx is not None] + g.spare_rows
            pre = g.rows[0].prefix_pages
            owned += (self.beam_book.owned(g, pre) if g.table_rows is not None
                      else g.rows[0].kv_pages[pre:])
        self.req_to_token.check(rows)
        slots = [(g.num_beams, g.slot) for g in groups.values() if g.slot is not None]
        held = {k: n for k, n in self.beam_slots.held.items() if n}
        if len(set(slots)) != len(slots) or held != dict(Counter(k for k, _ in slots)):
            raise AssertionError(f"beam slots held {held}, by running groups {sorted(slots)}")
        self.token_to_kv.allocator.check(owned + self.radix.owned_pages())
        if self.radix.host is not None:  # the host tier holds cached copies only
            self.radix.host.allocator.check(self.radix.host_pages())
        if self.cross_kv is not None:
            self.cross_kv.allocator.check(self.encoder_cache.owned_pages())
            if self.encoder_cache.host is not None:
                self.encoder_cache.host.allocator.check(self.encoder_cache.host_pages())
            refs: dict[int, int] = {}
            for r in live:
                for e in r.cross_entries:
                    refs[id(e)] = refs.get(id(e), 0) + 1
            for e in self.encoder_cache.all_entries():
                if e.refs != refs.get(id(e), 0):
                    raise AssertionError(f"encoder cache entry {e.key[1][:8]} has {e.refs} "
                                         f"references but {refs.get(id(e), 0)} live holders")

    def usage(self) -> dict[str, float]:
        out = {"kv_used_tokens": self.token_to_kv.allocator.num_used * self.page_size,
               "kv_total_tokens": self.token_to_kv.capacity_tokens, **self.radix.stats()}
        if self.cross_kv is not None:
            out["cross_used_tokens"] = self.cross_kv.allocator.num_used * self.cross_kv.page_size
            out["cross_total_tokens"] = self.cross_kv.capacity_tokens
            out.update(self.encoder_cache.stats())
        return out


class _DeviceCopies:
    """The device side of a beam step, gathered over all groups and done in a few copies:
    table rows copied whole (positions past a row's length are never read), the first slots
    of copied last pages fixed in the tables, and those pages' K/V copied in every layer."""

    def __init__(self) -> None:
        self.tables: list[tuple[int, int]] = []  # (source row, destination row)
        self.cross: list[tuple[int, int]] = []
        self.pages: list[tuple[int, int, int]] = []  # (source page, new page, slots to copy)
        self.fixes: list[tuple[int, int, int, int]] = []  # (row, first position, slot, count)

    def apply(self, req_to_token: ReqToTokenPool, kv: TokenToKVPool) -> None:
        ps = kv.page_size
        for table, pairs in (("req_to_token", self.tables), ("req_to_cross", self.cross)):
            if pairs:
                src, dst = zip(*pairs)
                req_to_token.copy_rows(table, list(src), list(dst))
        if self.pages:
            src = [pg * ps + i for pg, _, n in self.pages for i in range(n)]
            dst = [pg * ps + i for _, pg, n in self.pages for i in range(n)]
            kv.copy_slots(torch.tensor(src), torch.tensor(dst))
            rows = [r for r, _, _, n in self.fixes for _ in range(n)]
            pos = [p + i for _, p, _, n in self.fixes for i in range(n)]
            slots = [s + i for _, _, s, n in self.fixes for i in range(n)]
            req_to_token.scatter(rows, pos, slots)
