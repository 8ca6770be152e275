"""The host's per-step beam search work on the CPU, without a model: N fake groups of k beams
(rows 40 tokens into a decode, 16-token pages), timed piece by piece as the scheduler runs them
each decode step: `advance` of every group (the step's candidates as the sampler hands them
over), `RequestMemory.follow_beams` (beams that reorder), `StepLauncher._beam_moves`,
`step_plan.lay_out` and `step_plan.rows_ahead`.

    python benchmarks/bench_beam_host.py --groups 512 --beams 4
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.scheduler import beam_search
from seq2serve.runtime.scheduler.beam_search import BeamGroup
from seq2serve.runtime.scheduler.req import Req
from seq2serve.runtime.scheduler.request_memory import RequestMemory
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

    if hasattr(beam_search, "advance_groups"):
        def advance() -> None:  # the step's candidates as numpy arrays (the sampler's)
            beam_search.advance_groups(groups, values, flat_ids, VOCAB)
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
    base = [[(list(r.output_ids), list(r.kv_pages)) for r in g.rows] for g in groups]
    moved = [[(0, 9), (0, 10), (1, 11), (2, 12)][:args.beams] for _ in groups]
    for c in moved:
        c += [(j, 13) for j in range(len(c), args.beams)]

    def follow() -> None:
        for g, c in zip(groups, moved):
            memory.follow_beams(g, c, DONE + 1)

    def follow_timed() -> float:
        best = float("inf")
        for _ in range(args.reps):
            for g, b in zip(groups, base):
                for r, (out, pages) in zip(g.rows, b):
                    r.output_ids, r.kv_pages = list(out), list(pages)
            t = time.perf_counter()
            follow()
            best = min(best, time.perf_counter() - t)
        return best * 1e3

    launcher = StepLauncher(None, memory, VOCAB, (1,), "cpu")
    reqs = [r for g in groups for r in g.rows]
    results = {
        "advance": timed(run_advance, args.reps),
        "follow_beams": follow_timed(),
        "_beam_moves": timed(lambda: launcher._beam_moves(groups, 1), args.reps),
        "lay_out": timed(lambda: lay_out(reqs, reqs), args.reps),
        "rows_ahead": timed(lambda: rows_ahead(reqs, reqs, PS), args.reps),
    }
    print(f"{args.groups} groups x {args.beams} beams, best of {args.reps} (ms a step):")
    for name, ms in results.items():
        print(f"  {name:14s} {ms:7.3f}  ({ms * 1e3 / args.groups:5.2f} us a group)")
    print(f"  {'total':14s} {sum(results.values()):7.3f}")


if __name__ == "__main__":
    main()
