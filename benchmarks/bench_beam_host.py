"""The host's per-step beam search work on the CPU, without a model: N fake groups of k beams
(rows 40 tokens into a decode, 16-token pages), timed piece by piece as the scheduler runs them
each decode step: `advance` of every group (the step's candidates as the sampler hands them
over), `RequestMemory.follow_beams` (beams that reorder: the beam book's step of all groups),
the beam rows' decode columns (`schedule_batch._beam_columns`), `StepLauncher._beam_moves`,
`step_plan.lay_out` and `step_plan.rows_ahead`.

    python benchmarks/bench_beam_host.py --groups 512 --beams 4
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from seq2serve.runtime.attention.forward_batch import ForwardMode
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.executor.sampling_batch import SamplingBatch
from seq2serve.runtime.scheduler import beam_search
from seq2serve.runtime.scheduler.beam_book import BeamBook, BookPages, BookTokens
from seq2serve.runtime.scheduler.beam_search import BeamGroup
from seq2serve.runtime.scheduler.req import Req
from seq2serve.runtime.scheduler.request_memory import RequestMemory
from seq2serve.runtime.scheduler.schedule_batch import _beam_columns
from seq2serve.runtime.scheduler.step_launcher import StepLauncher
from seq2serve.runtime.scheduler.step_plan import lay_out, rows_ahead

PS, VOCAB, DONE = 16, 32000, 40  # page size, vocabulary, tokens generated so far


class _Allocator:
    def free(self, pages) -> None:
        pass


class _Pool:
    page_size = PS
    allocator = _Allocator()


def make_groups(n: int, beams: int) -> list[BeamGroup]:
    sp = SamplingParams(max_new_tokens=200, num_beams=beams)
    groups, page = [], 0
    for i in range(n):
        head = Req(rid=str(i), encoder_input_ids=[5] * 30, decoder_input_ids=[0],
                   sampling_params=sp)
        g = BeamGroup(rows=[head], stop_ids=frozenset({1}))
        head.beam = g
        g.rows += [Req(rid=f"{i}-{j}", encoder_input_ids=head.encoder_input_ids,
                       decoder_input_ids=[0], sampling_params=sp) for j in range(1, beams)]
        for j, r in enumerate(g.rows):
            r.beam, r.req_pool_idx = g, i * beams + j
            r.output_ids = [7 + j] * DONE
            r.kv_len = DONE  # (the decoder prompt's position counted in)
            r.kv_pages = list(range(page, page + DONE // PS + 1))
            page += DONE // PS + 1
        g.scores = [-1.0 * j for j in range(beams)]
        groups.append(g)
    return groups


def timed(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=512)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    groups = make_groups(args.groups, args.beams)
    keep = groups[0].keep
    rng = np.random.default_rng(0)
    values = np.sort(rng.uniform(-30, -1, (args.groups, keep)).astype(np.float32), 1)[:, ::-1]
    rows = rng.integers(0, args.beams, (args.groups, keep))
    tokens = rng.integers(2, VOCAB, (args.groups, keep))  # nothing stops: steady decoding
    values, flat_ids = values.reshape(-1).copy(), (rows * VOCAB + tokens).reshape(-1)
    saved = [(g.scores, g.hyps, g.improvable, g.done) for g in groups]

    def reset() -> None:
        for g, (s, h, i, d) in zip(groups, saved):
            g.scores, g.hyps, g.improvable, g.done = s, list(h), i, d

    rules = beam_search if hasattr(beam_search, "advance_groups") else _host_rules()
    if rules is not None:
        def advance() -> None:  # the step's candidates as numpy arrays (the sampler's)
            rules.advance_groups(groups, values, flat_ids, VOCAB)
    else:
        def advance() -> None:  # before: .tolist() in the sampler, then group by group
            v, f = values.tolist(), flat_ids.tolist()
            start = 0
            for g in groups:
                g.advance(v[start:start + keep], f[start:start + keep], VOCAB)
                start += keep

    def run_advance() -> None:
        reset()
        advance()

    memory = RequestMemory.__new__(RequestMemory)
    memory.token_to_kv, memory.page_size = _Pool(), PS
    book = memory.beam_book = BeamBook(args.groups * args.beams,
                                       args.groups * args.beams * (DONE // PS + 1), PS)
    for g in groups:  # (into the book as a first step leaves a group, with their histories)
        book.enter(g, [r.req_pool_idx for r in g.rows], [list(r.kv_pages) for r in g.rows],
                   [0] * args.beams, 0)
        book._fit(tokens=DONE)
        for r in g.rows:
            book.tokens[r.req_pool_idx, :DONE] = r.output_ids
            r.output_ids = BookTokens(book, r.req_pool_idx, g)
            r.kv_pages = BookPages(book, r.req_pool_idx, g)
        g.steps = DONE
    moved = [(0, 9), (0, 10), (1, 11), (2, 12)][:args.beams]
    moved += [(j, 13) for j in range(len(moved), args.beams)]
    parents = np.array([i * args.beams + p for i in range(args.groups) for p, _ in moved])
    next_tokens = np.array([t for _ in groups for _, t in moved])
    saved_book = (book.pages.copy(), book.tokens.copy(), book.refs.copy(),
                  [(g.steps, g.held, g.peak_pages) for g in groups])

    def restore() -> None:
        book.pages[:], book.tokens[:], book.refs[:] = saved_book[:3]
        for g, (steps, held, peak) in zip(groups, saved_book[3]):
            g.steps, g.held, g.peak_pages = steps, held, peak
            for r in g.rows:
                r.kv_len = DONE

    def follow_timed() -> float:
        best = float("inf")
        for _ in range(args.reps):
            restore()
            t = time.perf_counter()
            memory.follow_beams(groups, parents, next_tokens)
            best = min(best, time.perf_counter() - t)
        return best * 1e3

    def columns_timed() -> float:
        best = float("inf")
        for _ in range(args.reps):
            restore()
            t = time.perf_counter()
            _beam_columns(groups, memory)
            best = min(best, time.perf_counter() - t)
        return best * 1e3

    launcher = StepLauncher(None, memory, VOCAB, (1,), "cpu")
    reqs = [r for g in groups for r in g.rows]
    results = {
        "advance": timed(run_advance, args.reps),
        "follow_beams": follow_timed(),
        "decode columns": columns_timed(),
        "_beam_moves": timed(lambda: launcher._beam_moves(groups, 1), args.reps),
        "from_reqs": timed(lambda: SamplingBatch.from_reqs(
            reqs, VOCAB, (1,), "cpu", pending=1,
            beams=launcher._beam_layout(groups, ForwardMode.DECODE, None, None)), args.reps),
        "lay_out": timed(lambda: lay_out(reqs, reqs), args.reps),
        # (`running` holds a group by its first row)
        "rows_ahead": timed(lambda: rows_ahead([g.rows[0] for g in groups], reqs, PS),
                            args.reps),
    }
    print(f"{args.groups} groups x {args.beams} beams, best of {args.reps} (ms a step):")
    for name, ms in results.items():
        print(f"  {name:14s} {ms:7.3f}  ({ms * 1e3 / args.groups:5.2f} us a group)")
    print(f"  {'total':14s} {sum(results.values()):7.3f}")


def _host_rules():
    """The host's numpy rules, which left the runtime for the tests when the rules moved to
    the device (None in a tree from before them)."""
    try:
        from seq2serve.tests import beam_host_rules
    except ImportError:
        return None
    return beam_host_rules


if __name__ == "__main__":
    main()
