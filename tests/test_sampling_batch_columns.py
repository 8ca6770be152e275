"""SamplingBatch.from_reqs, rewritten for speed (its columns once per distinct SamplingParams
object, the ban rules only where some row has one, numpy for the per-row arrays), against the
code it replaced (kept here as the reference): every field, tensors with their dtypes, on
random batches of greedy, sampled and beam rows. No model."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.timestamp_tokens import TimestampTokens
from seq2serve.runtime.executor.sampling_batch import (
    SamplingBatch,
    SamplingRow,
    TimestampRows,
    _keys,
    banned_ngram_tokens,
)
from seq2serve.runtime.scheduler.req import Req


def reference_from_reqs(cls, reqs: list[SamplingRow], vocab_size: int, eos_ids: tuple[int, ...],
                        device: str, pending: int | list[int] = 0,
                        beams: dict | None = None, forced_eos: tuple[int, ...] = (),
                        begin_suppressed: tuple[int, ...] = (),
                        grammar: tuple[list[int], torch.Tensor] | None = None,
                        timestamp_tokens: TimestampTokens | None = None) -> SamplingBatch:
    sps = [r.sampling_params for r in reqs]
    pend = pending if isinstance(pending, list) else [pending] * len(reqs)

    def col(values, dtype=torch.float32):
        return torch.tensor(values, dtype=dtype).view(-1, 1).to(device, non_blocking=True)

    greedy = [sp.is_greedy or sp.is_beam for sp in sps]  # beams draw no random numbers
    top_ks = [sp.top_k_or_none or vocab_size for sp in sps]
    top_ps = [sp.top_p for sp in sps]
    min_ps = [sp.min_p for sp in sps]
    sampled = [not g for g in greedy]
    filtered = [s and (k < vocab_size or p < 1.0 or m > 0.0)
                for s, k, p, m in zip(sampled, top_ks, top_ps, min_ps)]
    widths = [k for f, k in zip(filtered, top_ks) if f]
    seeded = any(sp.seed is not None for sp, s in zip(sps, sampled) if s)
    penalized = any(sp.has_penalties for sp in sps)

    banned_rows, banned_cols = [], []
    for i, (r, sp, p) in enumerate(zip(reqs, sps, pend)):
        if begin_suppressed and len(r.output_ids) + p == 0:
            banned_rows += [i] * len(begin_suppressed)
            banned_cols += list(begin_suppressed)
        if len(r.output_ids) + p < sp.min_new_tokens:
            ban = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(eos_ids))
            banned_rows += [i] * len(ban)
            banned_cols += sorted(ban)
        if sp.no_repeat_ngram_size:
            ban = banned_ngram_tokens(r.fill_ids, sp.no_repeat_ngram_size)
            banned_rows += [i] * len(ban)
            banned_cols += ban

    forced = [i for i, (r, sp) in enumerate(zip(reqs, sps))
              if forced_eos and len(r.output_ids) + pend[i] + 1 >= sp.max_new_tokens]

    def padded(seqs: list[list[int]]) -> torch.Tensor:
        width = max(1, max(len(s) for s in seqs))
        t = torch.full((len(seqs), width), vocab_size, dtype=torch.int64)
        for i, s in enumerate(seqs):
            t[i, : len(s)] = torch.tensor(s, dtype=torch.int64)
        return t.to(device, non_blocking=True)

    stamped = [i for i, sp in enumerate(sps) if sp.timestamps]
    if stamped:
        assert timestamp_tokens is not None, "refused at admission: no timestamp tokens"
        assert not any(pend[i] for i in stamped), "timestamp rows never run ahead"
        stamps = TimestampRows.of(stamped, [reqs[i].output_ids for i in stamped],
                                  timestamp_tokens, vocab_size, device)

    return cls(
        temperatures=col([1.0 if g else sp.temperature for g, sp in zip(greedy, sps)]),
        greedy=torch.tensor(greedy, dtype=torch.bool).to(device, non_blocking=True),
        all_greedy=all(greedy),
        top_ks=torch.tensor(top_ks).to(device) if any(k < vocab_size for k in top_ks) else None,
        top_ps=col(top_ps) if any(p < 1.0 for p in top_ps) else None,
        min_ps=col(min_ps) if any(p > 0.0 for p in min_ps) else None,
        filtered=torch.tensor(filtered).to(device, non_blocking=True)
        if any(filtered) else None,
        filter_width=max(widths) if widths and max(widths) < vocab_size else None,
        seeded=seeded,
        keys=None if all(greedy) else _keys(reqs, sps, pend, seeded, device),
        penalty_ids=padded([r.fill_ids if sp.repetition_penalty != 1.0 else []
                            for r, sp in zip(reqs, sps)]) if penalized else None,
        output_counts_ids=padded([r.output_ids for r in reqs]) if penalized else None,
        repetition=col([sp.repetition_penalty for sp in sps]) if penalized else None,
        frequency=col([sp.frequency_penalty for sp in sps]) if penalized else None,
        presence=col([sp.presence_penalty for sp in sps]) if penalized else None,
        banned_rows=torch.tensor(banned_rows, dtype=torch.int64).to(device)
        if banned_rows else None,
        banned_cols=torch.tensor(banned_cols, dtype=torch.int64).to(device)
        if banned_rows else None,
        forced_rows=torch.tensor(forced, dtype=torch.int64).to(device) if forced else None,
        forced_ids=torch.tensor(forced_eos, dtype=torch.int64).to(device)
        if forced else None,
        want_logprobs=any(r.return_logprob for r in reqs),
        top_logprobs_num=max((r.top_logprobs_num for r in reqs), default=0),
        grammar_rows=list(grammar[0]) if grammar else None,
        grammar_mask=grammar[1].to(device, non_blocking=True) if grammar else None,
        timestamps=stamps if stamped else None,
        **(beams or {}),
    )


def _params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=rng.choice([1, 2, 5, 50]), min_new_tokens=rng.choice([0, 0, 1, 3]),
        temperature=rng.choice([0, 0.7, 1, 1.3]), top_p=rng.choice([1.0, 0.9, 1]),
        top_k=rng.choice([-1, 0, 1, 5, 40]), min_p=rng.choice([0.0, 0.05]),
        repetition_penalty=rng.choice([1.0, 1.0, 1.2]),
        frequency_penalty=rng.choice([0.0, 0.5]), stop_token_ids=rng.choice([[], [3], [3, 4]]),
        ignore_eos=rng.choice([True, False]), seed=rng.choice([None, None, 7]),
        num_beams=rng.choice([1, 1, 4]), no_repeat_ngram_size=rng.choice([0, 0, 0, 2]))


def _same(a, b, name: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, name
        assert a.shape == b.shape and torch.equal(a, b), name
    else:
        assert type(a) is type(b) and a == b, name


@pytest.mark.parametrize("seed", range(10))
def test_from_reqs_matches_reference(seed):
    rng = random.Random(seed)
    for trial in range(60):
        pool = [_params(rng) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.3:  # steady beam search: nothing but beam rows, no bans
            pool = [SamplingParams(temperature=0, num_beams=4, max_new_tokens=50,
                                   ignore_eos=rng.random() < 0.5)]
        reqs = []
        for i in range(rng.randint(1, 12)):
            r = Req(rid=str(i), encoder_input_ids=[1], decoder_input_ids=[0, 5][:rng.randint(1, 2)],
                    sampling_params=rng.choice(pool), return_logprob=rng.random() < 0.1)
            r.output_ids = [rng.randrange(10) for _ in range(rng.choice([0, 0, 1, 2, 4, 49]))]
            reqs.append(r)
        pending = rng.choice([0, 1, [rng.randint(0, 1) for _ in reqs]])
        kw = dict(forced_eos=rng.choice([(), (2,)]), begin_suppressed=rng.choice([(), (5, 6)]))
        torch.manual_seed(trial)  # (the noise keys of sampled rows)
        want = reference_from_reqs(SamplingBatch, reqs, 50, (2,), "cpu", pending=pending, **kw)
        torch.manual_seed(trial)
        got = SamplingBatch.from_reqs(reqs, 50, (2,), "cpu", pending=pending, **kw)
        for f in dataclasses.fields(SamplingBatch):
            _same(getattr(want, f.name), getattr(got, f.name), f.name)
