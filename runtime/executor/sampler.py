"""Turns logits into next tokens: penalties, bans, grammar masks (runtime/grammar/bitmask.py),
temperature, top-k / top-p / min-p (token_filter.py), and sampling that is reproducible per
request when seeded (seeded_race.py: the noise depends on the seed, the step and the token's
index only, never on the batch the request happens to share; on CUDA the same race runs as one
kernel, runtime/kernels/triton_race.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from seq2serve.runtime.executor.beam_rules import BeamArena
from seq2serve.runtime.executor.beam_topk_torch import row_topk_beams
from seq2serve.runtime.executor.sampling_batch import SamplingBatch
from seq2serve.runtime.executor.seeded_race import block_size, race
from seq2serve.runtime.executor.token_filter import filter_probs
from seq2serve.runtime.grammar.bitmask import apply_bitmask


@dataclass
class StepOutput:
    """One decoder step's result, from the sampler to the scheduler: the only step output type.

    The tensors are on the device (`next_token_ids` is the next decode step's input);
    `copy_to_host` queues their copy to pinned host memory without waiting, and `wait` blocks
    until it has landed and sets the host lists (`token_ids`, `token_logprobs`, `top`)."""

    next_token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None = None  # [B] float32, log p of the chosen token
    top_logprob_ids: torch.Tensor | None = None  # [B, K]
    top_logprobs: torch.Tensor | None = None  # [B, K]
    # beam search: each group's best candidates, groups in the batch's bucket order
    beam_values: torch.Tensor | None = None  # [sum of keeps] float32 accumulated log-probs
    beam_ids: torch.Tensor | None = None  # [sum of keeps] int64: row in group * vocab + token
    # ... the running beams HF's rules chose on the device (beam_rules.py; for groups past
    # their first step their tokens are in next_token_ids): each beam row's parent row and
    # running score
    beam_parents: torch.Tensor | None = None  # [beam rows] int64, batch rows
    beam_running_scores: torch.Tensor | None = None  # [beam rows] float32, stays on the device
    # ... and what the host reads of the step, each group's num_beams entries one group after
    # another: [3, n] int64 (parent row in the group, token, the K best candidates' ids),
    # [2, n] float32 (running score, finished hypothesis' score or -inf), [groups] bool done
    beam_ints: torch.Tensor | None = None
    beam_floats: torch.Tensor | None = None
    beam_done: torch.Tensor | None = None
    # EXTEND: log-probs of the scored decoder input tokens (`DecoderBatch.input_logprobs`)
    input_logprobs: torch.Tensor | None = None  # [n] float32
    # the sampled rows' logits [B, vocab], as computed (a CUDA graph's are its output buffer:
    # valid until the next forward)
    logits: torch.Tensor | None = field(default=None, repr=False)
    # set by wait()
    token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] | None = None
    top: list[list[tuple[int, float]]] | None = None
    # (parents, tokens, top ids, running scores, hypothesis scores, done) as numpy arrays
    beam_step: tuple[np.ndarray, ...] | None = None
    input_token_logprobs: list[float] | None = None
    device_seconds: float = 0.0  # the device's time on this step (CUDA: between its events)
    _host: tuple = field(default=(), repr=False)
    _event: torch.cuda.Event | None = field(default=None, repr=False)
    started: torch.cuda.Event | None = field(default=None, repr=False)
    # a step sampled late (ModelRunner.forward(defer=True)): the device's wait between its
    # forward's end and its sampler's start, left out of device_seconds
    idle: tuple[torch.cuda.Event, torch.cuda.Event] | None = field(default=None, repr=False)

    def _tensors(self) -> tuple:
        return (self.next_token_ids, self.logprobs, self.top_logprob_ids, self.top_logprobs,
                self.beam_ints, self.beam_floats, self.beam_done, self.input_logprobs)

    def copy_to_host(self) -> StepOutput:
        """Queue the copy. With a `started` event (the model runner records one just before
        the step's first device work), the device time from it to the copy's end becomes
        `device_seconds` (the device reaches it only when done with the step before)."""
        if not self.next_token_ids.is_cuda:
            self._host = self._tensors()
            return self

        def pinned(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(
                t, non_blocking=True)

        self._host = tuple(pinned(t) for t in self._tensors())
        self._event = torch.cuda.Event(enable_timing=self.started is not None)
        self._event.record()
        return self

    def wait(self) -> StepOutput:
        if self._event is not None:
            self._event.synchronize()
            if self.started is not None:
                busy = self.started.elapsed_time(self._event)
                if self.idle is not None:
                    busy -= self.idle[0].elapsed_time(self.idle[1])
                self.device_seconds = busy / 1e3
        (ids, logprobs, top_ids, top_vals, beam_ints, beam_floats, beam_done,
         input_logprobs) = self._host or self._tensors()
        self.token_ids = ids.tolist()
        if logprobs is not None:
            self.token_logprobs = logprobs.tolist()
        if top_vals is not None:
            self.top = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), top_vals.tolist())]
        if beam_ints is not None:
            ints, floats = beam_ints.numpy(), beam_floats.numpy()
            self.beam_step = (ints[0], ints[1], ints[2], floats[0], floats[1],
                              beam_done.numpy())
        if input_logprobs is not None:
            self.input_token_logprobs = input_logprobs.tolist()
        return self


class Sampler:
    """`suppressed`: tokens the model never generates (Marian's pad, generation_config.json's
    single-token bad_words_ids), banned as HF's NoBadWordsLogitsProcessor bans them: from the
    logits, and for beam rows from the log-probs (so they keep the full softmax's values)."""

    def __init__(self, suppressed: tuple[int, ...] = (), device: str = "cpu") -> None:
        self.suppressed = (torch.tensor(sorted(set(suppressed)), dtype=torch.int64,
                                        device=device) if suppressed else None)
        self.device = device
        self.arenas: dict[int, BeamArena] = {}  # the beam groups' state, by num_beams

    def suppress(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` with the suppressed tokens at -inf (in place; no-op without any)."""
        if self.suppressed is not None:
            logits.index_fill_(-1, self.suppressed, float("-inf"))
        return logits

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        """The argmax over the tokens the model may generate."""
        if self.suppressed is None:
            return logits.argmax(dim=-1)
        return logits.index_fill(-1, self.suppressed, float("-inf")).argmax(dim=-1)

    def __call__(self, logits: torch.Tensor, sb: SamplingBatch) -> StepOutput:
        if sb.beam_rows and _plain_beams(sb, logits.is_cuda):
            return self._fused_beams(logits, sb)
        model_logits, logits = logits, logits.float()
        if sb.beam_rows:  # HF's beam search: the processors act on log-probs
            r = sb.beam_rows
            head = torch.log_softmax(logits[:r], dim=-1)
            logits = torch.cat([head, logits[r:]]) if r < logits.shape[0] else head
        elif logits is model_logits and (self.suppressed is not None
                                         or sb.grammar_rows is not None
                                         or sb.timestamps is not None):
            logits = logits.clone()  # the step output keeps the model's logits as they were
        self.suppress(logits)
        if sb.penalty_ids is not None:
            logits = _apply_penalties(logits, sb)
        if sb.banned_rows is not None:
            logits[sb.banned_rows, sb.banned_cols] = float("-inf")
        if sb.grammar_rows is not None:  # each grammar row's allowed tokens only
            apply_bitmask(logits, sb.grammar_rows, sb.grammar_mask)
        if sb.timestamps is not None:  # after every ban, as HF's processor comes after them
            sb.timestamps.apply(logits)
        if sb.forced_rows is not None:  # HF's ForcedEOSTokenLogitsProcessor, applied last
            logits[sb.forced_rows] = float("-inf")
            logits[sb.forced_rows[:, None], sb.forced_ids[None, :]] = 0.0
        out = StepOutput(next_token_ids=self._sample(logits, sb))
        if sb.beam_rows:
            out.beam_values, out.beam_ids = _beam_candidates(logits, sb)
            self._beam_rules(out, sb, logits.shape[-1])
        if sb.want_logprobs:
            logprobs = torch.log_softmax(logits, dim=-1)
            out.logprobs = logprobs.gather(1, out.next_token_ids[:, None]).squeeze(1)
            if sb.top_logprobs_num > 0:
                vals, ids = logprobs.topk(min(sb.top_logprobs_num, logprobs.shape[-1]), dim=-1)
                out.top_logprobs, out.top_logprob_ids = vals, ids
        return out

    def _fused_beams(self, logits: torch.Tensor, sb: SamplingBatch) -> StepOutput:
        """The beam candidates straight from the model's logits (no torch top-k over [groups,
        rows * vocab], no argmax over the rows: triton_beam_topk.py on CUDA, without even a
        float32 copy or a log-softmax; on the CPU each row's own top-k, beam_topk_torch.py);
        the rows after the beam rows as `__call__` treats them. A beam row's next token is
        the argmax of its log-probs (the lower token where rounding makes two equal), as
        `_sample` gives it; `_beam_rules` overwrites it for groups past their first step."""
        r = sb.beam_rows
        if logits.is_cuda:
            from seq2serve.runtime.kernels.triton_beam_topk import beam_topk  # (CUDA only)

            values, ids, tokens = beam_topk(logits[:r], sb.beam_scores, sb.beam_buckets,
                                            self.suppressed, argmax=True)
        else:
            values, ids, tokens = row_topk_beams(logits[:r], sb.beam_scores,
                                                 sb.beam_buckets, self.suppressed)
        if r < logits.shape[0]:
            tokens = torch.cat([tokens, self(logits[r:], _after_beams(sb)).next_token_ids])
        out = StepOutput(next_token_ids=tokens, beam_values=values, beam_ids=ids)
        self._beam_rules(out, sb, logits.shape[-1])
        return out

    def _beam_rules(self, out: StepOutput, sb: SamplingBatch, vocab: int) -> None:
        """HF's rules on the device over the step's candidates (`out.beam_values`,
        `out.beam_ids`), bucket by bucket, in each group's arena slot (the groups entering
        this step first written in): the running beams' tokens (into `next_token_ids`, for
        groups past their first step: a group at its first step keeps its one row's token,
        the host makes its rows), parents and scores, and what the host reads. (A batch
        without slots, made by a test of the candidates alone, stops at the candidates.)"""
        if sb.beam_slots is None:
            return
        for k, *columns in sb.beam_enter:
            if k not in self.arenas:
                self.arenas[k] = BeamArena(k, self.device)
            self.arenas[k].enter(*columns)
        rows_total = sb.beam_rows
        device = out.beam_values.device
        parents = torch.arange(rows_total, device=device)
        running = torch.zeros(rows_total, dtype=torch.float32, device=device)
        entries = sum(groups * k for (groups, _, _), k in zip(sb.beam_buckets, sb.beam_ks))
        ints = torch.empty(3, entries, dtype=torch.int64, device=device)
        floats = torch.empty(2, entries, dtype=torch.float32, device=device)
        done = torch.empty(sum(g for g, _, _ in sb.beam_buckets), dtype=torch.bool,
                           device=device)
        row0 = cand0 = group0 = e0 = 0
        for (groups, rows, keep), k in zip(sb.beam_buckets, sb.beam_ks):
            v = out.beam_values[cand0:cand0 + groups * keep].view(groups, keep)
            f = out.beam_ids[cand0:cand0 + groups * keep].view(groups, keep)
            # (rows == k: the group's rows continue their parents; one row: its first step)
            self.arenas[k].step_into(sb.beam_slots[group0:group0 + groups], v, f, vocab, ints,
                                     floats, done, e0, group0,
                                     (parents, out.next_token_ids, running, row0)
                                     if rows > 1 else None)
            row0 += groups * rows
            cand0 += groups * keep
            group0 += groups
            e0 += groups * k
        out.beam_parents, out.beam_running_scores = parents, running
        out.beam_ints, out.beam_floats, out.beam_done = ints, floats, done

    @staticmethod
    def _sample(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
        argmax = logits.argmax(dim=-1)
        if sb.all_greedy:
            return argmax
        probs = torch.softmax(logits / sb.temperatures, dim=-1)
        if sb.filtered is not None:
            probs = filter_probs(probs, sb)
        if probs.is_cuda:  # the race as one kernel (torch's is ~25 small ones)
            from seq2serve.runtime.kernels.triton_race import race_kernel  # (Triton: CUDA only)

            sampled = race_kernel(probs, sb.keys, block_size(probs.shape[-1]))
        else:
            sampled = race(probs, sb.keys)
        return torch.where(sb.greedy, argmax, sampled)


def _plain_beams(sb: SamplingBatch, cuda: bool = True) -> bool:
    """Nothing but the log-softmax, the static suppressed tokens and the top-k acts on the
    batch's beam rows, and no log-probs are returned: the fused beam path applies. Every
    per-row rule is required absent from the whole batch (conservatively: the beam rows'
    own would do). On CUDA each group's `keep` must fit the kernel (Triton is imported only
    there: a CPU install may lack it)."""
    plain = (not sb.want_logprobs and sb.penalty_ids is None and sb.banned_rows is None
             and sb.grammar_rows is None and sb.timestamps is None and sb.forced_rows is None)
    if not plain or not cuda:
        return plain
    from seq2serve.runtime.kernels.triton_beam_topk import MAX_KEEP

    return all(keep <= MAX_KEEP for _, _, keep in sb.beam_buckets)


def _after_beams(sb: SamplingBatch) -> SamplingBatch:
    """`sb` for its rows after the beam rows (those rows' tensors; no beams). Only for a batch
    `_plain_beams` accepts: its penalty, ban, grammar and forced fields are all None."""
    r = sb.beam_rows

    def rest(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[r:]

    return replace(sb, temperatures=rest(sb.temperatures), greedy=rest(sb.greedy),
                   top_ks=rest(sb.top_ks), top_ps=rest(sb.top_ps), min_ps=rest(sb.min_ps),
                   keys=rest(sb.keys), filtered=rest(sb.filtered), beam_rows=0,
                   beam_scores=None, beam_buckets=(), beam_moves=None, beam_slots=None,
                   beam_ks=(), beam_enter=())


def _beam_candidates(logprobs: torch.Tensor, sb: SamplingBatch) -> tuple[torch.Tensor,
                                                                         torch.Tensor]:
    """Each beam group's best `keep` (score + log-prob, row * vocab + token), best first; one
    top-k per bucket of equally shaped groups."""
    scores = logprobs[:sb.beam_rows] + sb.beam_scores
    vocab, start, values, ids = scores.shape[-1], 0, [], []
    for groups, rows, keep in sb.beam_buckets:
        block = scores[start:start + groups * rows].view(groups, rows * vocab)
        v, i = block.topk(keep, dim=-1)
        values.append(v.flatten())
        ids.append(i.flatten())
        start += groups * rows
    return torch.cat(values), torch.cat(ids)


def _apply_penalties(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
    batch, vocab = logits.shape

    def counts_of(ids: torch.Tensor) -> torch.Tensor:
        c = torch.zeros(batch, vocab + 1, device=logits.device)
        c.scatter_add_(1, ids, torch.ones_like(ids, dtype=c.dtype))
        return c[:, :vocab]

    seen = counts_of(sb.penalty_ids) > 0
    penalized = torch.where(logits > 0, logits / sb.repetition, logits * sb.repetition)
    logits = torch.where(seen, penalized, logits)
    counts = counts_of(sb.output_counts_ids)
    return logits - sb.frequency * counts - sb.presence * (counts > 0).float()
