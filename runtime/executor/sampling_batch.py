"""The sampling parameters of one batch as tensors (built once per batch by the scheduler)."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

import numpy as np
import torch

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.timestamp_tokens import TimestampTokens
from seq2serve.runtime.executor.beam_step import BeamMoves
from seq2serve.runtime.executor.sampling_columns import FixedColumns, SamplingMemo
from seq2serve.runtime.executor.seeded_race import row_key
from seq2serve.runtime.executor.timestamp_rules import TimestampRows

_OUTPUT_IDS = attrgetter("output_ids")


class SamplingRow(Protocol):
    """What sampling reads of a request (the scheduler's Req has these)."""

    sampling_params: SamplingParams
    output_ids: list[int]
    fill_ids: list[int]
    return_logprob: bool
    top_logprobs_num: int


@dataclass
class SamplingBatch:
    temperatures: torch.Tensor  # [B, 1] float32; greedy rows hold 1.0 (they take the argmax)
    greedy: torch.Tensor  # [B] bool
    all_greedy: bool
    top_ks: torch.Tensor | None  # [B] int64, vocab size where disabled; None if no row uses it
    top_ps: torch.Tensor | None  # [B, 1] float32
    min_ps: torch.Tensor | None  # [B, 1] float32
    # [B] int64 noise keys (seeded_race.py): from (seed, tokens generated so far) where seeded,
    # else random; None when every row is greedy
    keys: torch.Tensor | None
    # penalties
    penalty_ids: torch.Tensor | None  # [B, L] int64 token ids seen, padded with vocab_size
    output_counts_ids: torch.Tensor | None  # [B, L2] generated ids only, padded with vocab_size
    repetition: torch.Tensor | None  # [B, 1]
    frequency: torch.Tensor | None  # [B, 1]
    presence: torch.Tensor | None  # [B, 1]
    # tokens that may not be sampled yet (min_new_tokens): parallel row/column index tensors
    banned_rows: torch.Tensor | None
    banned_cols: torch.Tensor | None
    # rows whose next token is their last (max_new_tokens): only the model's forced EOS ids
    # may come, scored 0 (HF's ForcedEOSTokenLogitsProcessor); None if no row is forced
    forced_rows: torch.Tensor | None
    forced_ids: torch.Tensor | None
    # log probabilities to return
    want_logprobs: bool
    top_logprobs_num: int
    # beam search: the first `beam_rows` rows are beam rows. Their logits become log-probs
    # before the penalties and bans (HF's order), plus each row's beam score; then each
    # group's best `keep` candidates over its rows. Groups come in buckets of equal (rows,
    # keep), in row order.
    beam_rows: int = 0
    beam_scores: torch.Tensor | None = None  # [beam_rows, 1] float32
    beam_buckets: tuple[tuple[int, int, int], ...] = ()  # (groups, rows per group, keep)
    # HF's rules on the device (beam_rules.py): each group's slot in its num_beams' arena
    # ([groups] int64, bucket order), each bucket's num_beams, and the groups that enter
    # their arena this step (their first): (num_beams, slots, forced, max_new_tokens,
    # early_stopping, length_penalty, stop ids, keep), the last seven one entry a group
    beam_slots: torch.Tensor | None = None
    beam_ks: tuple[int, ...] = ()
    beam_enter: tuple[tuple, ...] = ()
    # groups past their first step: the device moves their pages to the beams it chose
    beam_moves: BeamMoves | None = None
    # top-k / top-p / min-p: the rows with a rule ([B] bool; None if no sampled row has one),
    # and, when every such row has a top_k, the largest (the filter's width, on the host)
    filtered: torch.Tensor | None = None
    filter_width: int | None = None
    seeded: bool = False  # a sampled row has a seed (its draws must be the keys')
    # grammar rows (runtime/grammar/): their batch rows (host ints) and the packed token
    # bitmask [B, ceil(vocab / 32)] int32 (only their rows read), filled on the host from each
    # row's matcher before the launch; disallowed tokens get -inf before any choice (beam
    # rows: in log-probs)
    grammar_rows: list[int] | None = None
    grammar_mask: torch.Tensor | None = None
    # Whisper's timestamp rules for the rows that ask for them (timestamp_rules.py); their
    # bounds come from each row's generated tokens, which the host has (no step ahead)
    timestamps: TimestampRows | None = None

    @classmethod
    def beam_layout(cls, scores: list[float] | torch.Tensor, buckets: list[tuple[int, int, int]],
                    device: str, moves: BeamMoves | None = None,
                    slots: list[int] | np.ndarray | None = None, ks: tuple[int, ...] = (),
                    enter: tuple[tuple, ...] = ()) -> dict:
        """The beam fields, to pass to `from_reqs(beams=...)`. `scores`: the rows' running
        scores, from the host's books or (a step ahead of them) the device's last choice;
        `slots`, `ks`, `enter`: the device rules' fields (`beam_slots`, ...)."""
        if not isinstance(scores, torch.Tensor):
            scores = torch.tensor(scores, dtype=torch.float32).to(device, non_blocking=True)
        if slots is not None:
            slots = torch.from_numpy(np.asarray(slots, dtype=np.int64)).to(device,
                                                                           non_blocking=True)
        return {"beam_rows": scores.numel(), "beam_scores": scores.view(-1, 1),
                "beam_buckets": tuple(buckets), "beam_moves": moves, "beam_slots": slots,
                "beam_ks": tuple(ks), "beam_enter": tuple(enter)}

    @classmethod
    def from_reqs(cls, reqs: list[SamplingRow], vocab_size: int, eos_ids: tuple[int, ...],
                  device: str, pending: int | list[int] = 0,
                  beams: dict | None = None, forced_eos: tuple[int, ...] = (),
                  begin_suppressed: tuple[int, ...] = (),
                  grammar: tuple[list[int], torch.Tensor] | None = None,
                  timestamp_tokens: TimestampTokens | None = None,
                  memo: SamplingMemo | None = None,
                  generated: np.ndarray | None = None) -> SamplingBatch:
        """`pending`: tokens each request (or, a list, each row) has generated that the host
        has not seen yet (the overlap scheduler's one step of lag; 0 for a row whose input
        is on the host); they count for seeds and min_new_tokens.
        `beams`: `beam_layout(...)` when the batch has beam search rows. `forced_eos`: the
        model's forced_eos_token_id(s), forced on a row's last token. `begin_suppressed`:
        tokens banned as a row's first generated token (HF's
        SuppressTokensAtBeginLogitsProcessor: Whisper's begin_suppress_tokens). `grammar`: the
        grammar rows and their host bitmask (`grammar_rows`, `grammar_mask`; a mask of None is
        filled later, before the sampler runs: `StepLauncher.complete`).
        `timestamp_tokens`: the model's, for the rows whose sampling params ask for
        timestamps (Whisper). `memo`: keeps the columns of the rows while they stay (the
        scheduler's, across steps). `generated`: each row's generated tokens as the host has
        them, where the caller knows them cheaper than `len(output_ids)` row by row."""
        # (per-row attributes read with map/attrgetter: C loops, this runs every step; what
        # depends on the rows alone is kept by `memo` while they stay)
        fixed = (memo.columns(reqs, vocab_size, device) if memo is not None
                 else FixedColumns.of(reqs, vocab_size, device))
        sps = fixed.sps
        pend = pending if isinstance(pending, list) else [pending] * len(reqs)
        # each request's generated tokens, those still on the device counted in
        if generated is None:
            generated = np.fromiter(map(len, map(_OUTPUT_IDS, reqs)), dtype=np.int64,
                                    count=len(reqs))
        done = generated + np.array(pend, dtype=np.int64)

        banned_rows, banned_cols = [], []
        # (the ban rules, row by row, only when a row has one: min_new_tokens not reached, a
        # first token with begin_suppressed, an n-gram rule)
        if ((done < fixed.min_new).any() or (begin_suppressed and (done == 0).any())
                or fixed.ngram):
            for i, (r, sp, n) in enumerate(zip(reqs, sps, done.tolist())):
                if begin_suppressed and n == 0:
                    banned_rows += [i] * len(begin_suppressed)
                    banned_cols += list(begin_suppressed)
                if n < sp.min_new_tokens:
                    ban = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(eos_ids))
                    banned_rows += [i] * len(ban)
                    banned_cols += sorted(ban)
                if sp.no_repeat_ngram_size:
                    ban = banned_ngram_tokens(r.fill_ids, sp.no_repeat_ngram_size)
                    banned_rows += [i] * len(ban)
                    banned_cols += ban

        forced = (np.flatnonzero(done + 1 >= fixed.max_new) if forced_eos
                  else np.zeros(0, dtype=np.int64))

        def padded(seqs: list[list[int]]) -> torch.Tensor:
            width = max(1, max(len(s) for s in seqs))
            t = torch.full((len(seqs), width), vocab_size, dtype=torch.int64)
            for i, s in enumerate(seqs):
                t[i, : len(s)] = torch.tensor(list(s), dtype=torch.int64)  # (a beam row's: a view)
            return t.to(device, non_blocking=True)

        stamped = fixed.stamped
        if stamped:
            assert timestamp_tokens is not None, "refused at admission: no timestamp tokens"
            assert not any(pend[i] for i in stamped), "timestamp rows never run ahead"
            stamps = TimestampRows.of(stamped, [reqs[i].output_ids for i in stamped],
                                      timestamp_tokens, vocab_size, device)
        penalized = fixed.penalized

        return cls(
            **fixed.fields,
            keys=None if fixed.fields["all_greedy"] else _keys(reqs, sps, pend,
                                                               fixed.seeded, device),
            penalty_ids=padded([r.fill_ids if sp.repetition_penalty != 1.0 else []
                                for r, sp in zip(reqs, sps)]) if penalized else None,
            output_counts_ids=padded([r.output_ids for r in reqs]) if penalized else None,
            banned_rows=torch.tensor(banned_rows, dtype=torch.int64).to(device, non_blocking=True)
            if banned_rows else None,
            banned_cols=torch.tensor(banned_cols, dtype=torch.int64).to(device, non_blocking=True)
            if banned_rows else None,
            forced_rows=(torch.from_numpy(forced).to(device, non_blocking=True)
                         if forced.size else None),
            forced_ids=torch.tensor(forced_eos, dtype=torch.int64).to(device, non_blocking=True)
            if forced.size else None,
            grammar_rows=list(grammar[0]) if grammar else None,
            grammar_mask=grammar[1].to(device, non_blocking=True)
            if grammar and grammar[1] is not None else None,
            timestamps=stamps if stamped else None,
            **(beams or {}),
        )


def _keys(reqs: list[SamplingRow], sps: list[SamplingParams], pending: list[int],
          seeded: bool, device: str) -> torch.Tensor:
    keys = torch.randint(0, 1 << 32, (len(reqs),), dtype=torch.int64)
    if seeded:
        keys = torch.tensor([k if sp.seed is None else row_key(sp.seed, len(r.output_ids) + p)
                             for k, sp, r, p in zip(keys.tolist(), sps, reqs, pending)],
                            dtype=torch.int64)
    return keys.to(device, non_blocking=True)


def banned_ngram_tokens(seq: list[int], n: int) -> list[int]:
    """Tokens that would repeat an n-gram of `seq` (HF's NoRepeatNGramLogitsProcessor, over
    the whole decoder sequence, prompt included)."""
    if len(seq) + 1 < n:
        return []
    prefix = tuple(seq[len(seq) - n + 1:])
    return sorted({seq[i + n - 1] for i in range(len(seq) - n + 1)
                   if tuple(seq[i:i + n - 1]) == prefix})
