"""The Scheduler: a waiting queue and a running batch, continuous batching.

Each `step()` admits waiting requests (encoder stage for those that need it) and runs one
decoder forward: a DECODE step for every running request, the admitted ones whose decoder
prompt is one token (T5's start token) among them as new rows, or, when an admitted request
has a longer decoder prompt, one EXTEND batch of the admitted requests' prompts (with
`--chunked-prefill-size`, a long one's next chunk, a decode step of the others between two
chunks: `_next_chunk`). Which rows a
step computes and where their inputs come from is `step_plan.py`; building and launching it,
`step_launcher.py`. Finished requests leave and free their memory at once. When the KV pool cannot hold the next decode step, the requests with the
least progress are retracted (memory freed, cross K/V kept) and resumed later by recomputing.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from itertools import repeat
from operator import attrgetter, is_not, itemgetter
from typing import Protocol

import numpy as np
import torch

from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
from seq2serve.encoders.encoder_cache import EncoderCache
from seq2serve.encoders.encoder_input import EncoderSegment
from seq2serve.encoders.encoder_stage import EncoderStage
from seq2serve.runtime.attention.forward_batch import ForwardMode
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.executor.sampler import StepOutput
from seq2serve.runtime.executor.worker import ModelWorker
from seq2serve.runtime.executor.worker_batch import DecoderBatch, EncodeBatch
from seq2serve.runtime.memory.cache_sharing import SharingRule
from seq2serve.runtime.memory.host_kv_pool import host_pools
from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool
from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool
from seq2serve.runtime.messages.io_struct import (
    DetokenizeSettings,
    OutputItem,
    StreamedTokens,
    TokenizedRequest,
    TokenOutput,
    token_outputs,
)
from seq2serve.runtime.messages.model_limits import ModelLimits
from seq2serve.runtime.scheduler.beam_search import BeamGroup, follow_device_rules
from seq2serve.runtime.scheduler.grammar_compiles import GrammarCompiles
from seq2serve.runtime.scheduler.grammar_rows import (
    DEAD_END,
    Grammars,
    accept_tokens,
    beam_grammars,
    set_beam_grammars,
)
from seq2serve.runtime.scheduler.policy import FairPolicy
from seq2serve.runtime.scheduler.radix_cache import RadixCache
from seq2serve.runtime.scheduler.req import READS_HISTORY, FinishReason, Req
from seq2serve.runtime.scheduler.request_memory import InputsNeeded, RequestMemory
from seq2serve.runtime.scheduler.schedule_batch import ScheduleBatch
from seq2serve.runtime.scheduler.step_launcher import InFlight, StepLauncher
from seq2serve.runtime.scheduler.step_plan import (
    chunk_end,
    chunkable,
    joins_decode,
    overlappable,
    rows_ahead,
)

logger = logging.getLogger(__name__)

# a beam group's rows, its first row, a request's finish (C-loop getters)
_ROWS = attrgetter("rows")
_FIRST, _REASON = itemgetter(0), attrgetter("finished_reason")


def _entries(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices starts[i], ..., starts[i] + counts[i] - 1, for every i in turn."""
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(starts, counts) + within


def _sharing(args: ServerArgs) -> SharingRule:
    return SharingRule(args.cache_public_min_users, args.cache_window_seconds)


def _cache_hits(r: Req) -> dict[str, int]:
    """What a request got from public and from its user's private cache entries."""
    encoder_hits = len(r.segments) if r.encoder_cache_hit else 0
    return {"prefix_public_tokens": r.cached_public_tokens,
            "prefix_private_tokens": r.cached_tokens - r.cached_public_tokens,
            "encoder_public": r.encoder_public_hits,
            "encoder_private": encoder_hits - r.encoder_public_hits}


class Executor(Protocol):
    """What the scheduler needs of whatever runs its batches (`ModelWorker`; tests use a fake
    that needs no model): the pools to allocate from and two calls."""

    device: str
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: TokenToKVPool
    cross_kv_pool: CrossKVPool | None

    def launch(self, batch: DecoderBatch) -> StepOutput:
        """Start an EXTEND or DECODE forward; returns before the device is done, with the
        output's copy to the host queued (`StepOutput.wait`)."""

    def forward_encode(self, batch: EncodeBatch) -> torch.Tensor | None:
        """Write the cross K/V of an ENCODE batch; returns the new encoder outputs, packed."""

    # optional (`ModelWorker` has them): `late_sampling` True and `launch_forward(batch)`,
    # `launch` in two halves, which lets rows with grammars, penalties or n-gram bans run in
    # the overlap schedule


class Scheduler:
    def __init__(self, args: ServerArgs, model_config: ModelConfig, tokenizer=None,
                 executor: Executor | None = None, policy: FairPolicy | None = None) -> None:
        self.args = args
        self.model_config = model_config
        self.tokenizer = tokenizer  # decodes output tails for stop strings
        self.worker = executor if executor is not None else ModelWorker(args, model_config)
        w = self.worker
        self.device = w.device
        self.encoder_cache = None
        shared = args.cache_isolation == "shared"  # each cache counts its own promotions
        host_kv, host_cross = host_pools(args.host_cache_gb, w.token_to_kv_pool, w.cross_kv_pool)
        if hasattr(w, "mirror"):  # tensor parallelism: every rank copies its slice too
            w.mirror({"host_token_to_kv": host_kv, "host_cross_kv": host_cross})
        if w.cross_kv_pool is not None:
            self.encoder_cache = EncoderCache(w.cross_kv_pool,
                                              enabled=not args.disable_encoder_cache,
                                              hidden_budget_bytes=args.encoder_hidden_cache_mb << 20,
                                              sharing=_sharing(args) if shared else None,
                                              host=host_cross)
        self.radix = RadixCache(w.token_to_kv_pool.allocator, args.page_size,
                                enabled=not args.disable_radix_cache,
                                sharing=_sharing(args) if shared else None, host=host_kv)
        self.memory = RequestMemory(w.req_to_token_pool, w.token_to_kv_pool,
                                    w.cross_kv_pool, self.encoder_cache, self.radix)
        self.encoder_stage = EncoderStage(self.worker, self.encoder_cache,
                                          args.max_encoder_batch_tokens)
        arch = model_config.arch
        self.limits = ModelLimits(  # sent to the frontend at start-up (scheduler_info)
            vocab_size=arch.vocab_size,
            input_vocab_size=arch.input_vocab_size,
            is_encoder_decoder=arch.is_encoder_decoder,
            context_length=w.req_to_token_pool.max_context_len,
            max_encoder_len=w.req_to_token_pool.max_encoder_len,
            kv_capacity_tokens=w.token_to_kv_pool.capacity_tokens,
            cross_capacity_tokens=0 if w.cross_kv_pool is None else w.cross_kv_pool.capacity_tokens)
        eos = set(model_config.eos_token_ids)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_ids = tuple(sorted(eos))
        self.waiting = policy if policy is not None else FairPolicy()  # admission order
        self.running: list[Req] = []  # a beam group by its first row (its rows: `beam.rows`)
        # every rid (a beam request's result rids too) a request was added under -> it; a hint
        # that `find` confirms, rebuilt from the live requests when it outgrows them
        self.by_rid: dict[str, Req] = {}
        # per forward mode: how many forwards and the largest batch (counters, not a log: a
        # server runs millions of forwards)
        self.forwards: Counter[str] = Counter()
        self.max_batch: dict[str, int] = {}
        self.num_retractions = 0
        self.overlap = not args.disable_overlap_schedule
        # rows whose sampling reads every generated token run ahead where the executor can
        # sample a step after its forward (step_plan.overlappable)
        self.late_sampling = getattr(self.worker, "late_sampling", False)
        self.wait_seconds = 0.0
        self.device_seconds = 0.0  # the device's busy time on decoder forwards (CUDA events)
        self.in_flight: InFlight | None = None
        # chunked prefill: the request whose prompt is part computed (held apart from `running`
        # until its last chunk is launched), and whether the running batch decodes next
        self.chunked: Req | None = None
        self.decode_turn = False
        self.launcher = StepLauncher(self.worker, self.memory, model_config.vocab_size,
                                     self.eos_ids, self.device,
                                     forced_eos=model_config.forced_eos_token_ids,
                                     begin_suppressed=model_config.begin_suppressed_token_ids,
                                     timestamp_tokens=model_config.timestamp_tokens)
        self.notices: list[TokenOutput] = []  # requests refused at admission
        # beam groups that ended (finished or aborted) this step and the one before: their
        # rows and they refer to each other, a cycle that reference counts cannot free, so a
        # group lets go of its rows once no step in flight holds them (`_unlink_ended`)
        self.ending: list[BeamGroup] = []
        self.ended: list[BeamGroup] = []
        self.grammars = Grammars(tokenizer, model_config.vocab_size, self.eos_ids,
                                 args.grammar_backend)
        self.compiles = GrammarCompiles(self.grammars)  # requests whose grammar compiles

    # --- requests in -------------------------------------------------------------------------
    def add_request(self, tr: TokenizedRequest) -> None:
        """Queue a request; ValueError (naming the problem) if it can never run."""
        arch = self.model_config.arch
        sp = tr.sampling_params
        sp.validate(arch.vocab_size)
        if self.find(tr.rid) is not None:
            raise ValueError(f"request id {tr.rid!r} is already in use")
        self.limits.check(tr.encoder_input_ids, tr.decoder_input_ids, sp.max_new_tokens,
                          sum(p.num_tokens for p in tr.encoder_inputs))
        if sp.timestamps and self.model_config.timestamp_tokens is None:
            raise ValueError("timestamps: this model has no timestamp tokens (Whisper's, "
                             "after generation_config.json's no_timestamps_token_id)")
        if sp.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model directory has none")
        if tr.encoder_inputs and not arch.num_cross_attn_layers:
            raise ValueError("this model takes no encoder inputs besides text")
        if sp.is_beam:
            self._check_beam_request(tr)
        k = tr.logprob_start_len
        if k is not None and not (tr.return_logprob and 0 <= k <= len(tr.decoder_input_ids)):
            raise ValueError(f"logprob_start_len {k} needs return_logprob and a value in [0, "
                             f"{len(tr.decoder_input_ids)}] (the decoder input's length)")
        req = Req(
            rid=tr.rid, encoder_input_ids=list(tr.encoder_input_ids),
            decoder_input_ids=list(tr.decoder_input_ids), sampling_params=sp,
            stream=tr.stream, return_logprob=tr.return_logprob,
            top_logprobs_num=tr.top_logprobs_num, logprob_start_len=k,
            encoder_key=tr.encoder_key,
            encoder_inputs=list(tr.encoder_inputs), cross_spans=tr.cross_spans, user=tr.user,
            beam_rids=list(tr.beam_rids) if tr.beam_rids else None, embed=tr.embed,
        )
        if sp.is_beam:  # (a grammar's end is an EOS even with ignore_eos: grammar_rows.py)
            ignored = sp.ignore_eos and sp.grammar is None
            stops = set(sp.stop_token_ids) | (set() if ignored else set(self.eos_ids))
            req.beam = BeamGroup(rows=[req], stop_ids=frozenset(stops),
                                 forced=tr.decoder_forced)
        if req.encoder_input_ids:
            key = tr.encoder_key or "tokens:" + ",".join(map(str, req.encoder_input_ids))
            req.segments.append(EncoderSegment(key, req.encoder_len, token_ids=req.encoder_input_ids))
        req.segments += [EncoderSegment(p.key, p.num_tokens, payload=p) for p in req.encoder_inputs]
        # every cached entry lives in a namespace: the user's (when isolated), and for decoder
        # prefixes, the encoder inputs they were computed under
        user_ns = (tr.user or "") if self.args.cache_isolation == "user" else ""
        req.namespace = (user_ns, *(seg.key for seg in req.segments))
        self._index(req)
        # its matcher now if its grammar is compiled; else it waits for the compile thread
        if self.compiles.start(req, tr.group or tr.rid):
            self.waiting.push(req, tr.group or tr.rid)

    def _take_compiled(self) -> None:
        """Queue the requests whose grammars have compiled; refuse those whose did not."""
        for c, error in self.compiles.finished():
            if error is None:
                self.waiting.push(c.req, c.group)
            else:
                message = str(error)
                self.notices.append(TokenOutput(rid=c.req.rid, new_token_ids=[], error=message,
                                                finished_reason={"type": "abort",
                                                                 "message": message}))

    def _check_beam_request(self, tr: TokenizedRequest) -> None:
        sp = tr.sampling_params
        if tr.stream or tr.return_logprob:
            raise ValueError(f"{'stream' if tr.stream else 'return_logprob'} cannot be combined "
                             f"with num_beams > 1: a beam search result is known only when it "
                             f"ends")
        rids = tr.beam_rids or [tr.rid]
        if len(rids) != sp.num_return_sequences or rids[0] != tr.rid:
            raise ValueError(f"beam_rids must hold num_return_sequences "
                             f"({sp.num_return_sequences}) rids, the first being rid")
        if sp.num_beams > self.args.max_running_requests:
            raise ValueError(f"num_beams ({sp.num_beams}) is over max_running_requests "
                             f"({self.args.max_running_requests}): each beam is a running row")
        pool = self.memory.token_to_kv
        pages = sp.num_beams * pool.pages_for(len(tr.decoder_input_ids) + sp.max_new_tokens)
        if pages > pool.allocator.num_pages:
            raise ValueError(f"num_beams ({sp.num_beams}) x (decoder prompt + max_new_tokens) "
                             f"needs {pages * pool.page_size} KV tokens, over the pool's "
                             f"{pool.capacity_tokens}")

    def abort_request(self, rid: str) -> TokenOutput | None:
        """Finish a queued or running request now and free its memory. A beam request's other
        result rids get their abort outputs with the next step."""
        req = self.find(rid)
        if req is None:
            return None
        if self.compiles.drop(req):
            pass  # its grammar was still compiling: not queued yet, nothing held
        elif req in self.waiting:
            self.waiting.remove(req)
        elif req is self.chunked:  # (a chunk in flight is not processed: it is finished)
            self.chunked = None
        elif req.beam is not None:
            self.running = [r for r in self.running if r.beam is not req.beam]
        else:
            self.running.remove(req)
        req.finished_reason = FinishReason("abort", message="aborted by the client")
        if req.beam is not None:
            self.memory.release_beams(req.beam)
            self.ending.append(req.beam)
            self.notices += [TokenOutput(rid=other, new_token_ids=[],
                                         finished_reason=req.finished_reason.to_json())
                             for other in (req.beam_rids or [req.rid])[1:]]
        else:
            self.memory.release(req)
        return self._output(req, [])

    def find(self, rid: str) -> Req | None:
        """The request of `rid` (for a beam request: of any of its result rids) while it is
        queued or running. `by_rid` names the candidate; it counts only if still held, so
        a request that left by any path is not found (without a walk over every request)."""
        r = self.by_rid.get(rid)
        if r is None or not self._holds(r):
            return None
        return r.beam.rows[0] if r.beam is not None else r

    def _holds(self, req: Req) -> bool:
        return (req in self.running or req is self.chunked or req in self.waiting
                or req in self.compiles)

    def _index(self, req: Req) -> None:
        """`req`'s rids into `by_rid` (its last output takes them out); the hints of requests
        that left without one (refused at admission) are dropped once they outnumber the
        live ones."""
        for rid in req.beam_rids or [req.rid]:
            self.by_rid[rid] = req
        live = len(self.running) + len(self.waiting) + len(self.compiles) + 1
        if len(self.by_rid) > 4 * live * max(1, len(req.beam_rids or ())) + 1024:
            held = [*self.running, *self.waiting, *self.compiles, req,
                    *([self.chunked] if self.chunked else [])]
            self.by_rid = {rid: r for r in held for rid in r.beam_rids or [r.rid]}

    # --- the loop body -----------------------------------------------------------------------
    @property
    def running_rows(self) -> int:
        """Decoder rows of the running requests: a beam group (in `running` by its first row,
        the user's request) runs num_beams of them."""
        return sum(r.sampling_params.num_beams for r in self.running)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.in_flight or self.notices
                    or self.chunked or self.compiles)

    def step(self) -> list[TokenOutput]:
        """`step_items()` with every output a TokenOutput (what an in-process caller reads)."""
        return token_outputs(self.step_items())

    def step_items(self) -> list[OutputItem]:
        """Run one decoder forward, with the encoder stage before it when admitted requests
        have new encoder inputs.

        With the overlap schedule every step that can be is pipelined: its batch is launched
        on the device before the previous step's tokens are read back and processed, so the
        host's bookkeeping runs while the device computes. Outputs then lag by one step, and
        a request that just finished may compute one extra token, which is dropped. Admitting
        a request drains nothing: its encoder pass is queued behind the step in flight, and
        it becomes a row of the next decode step (`step_plan.joins_decode`) or, with a longer
        decoder prompt, of an EXTEND launched before the step in flight is read."""
        if self.compiles:
            if not (self.waiting or self.running or self.in_flight or self.chunked):
                self.compiles.wait(0.01)  # nothing else to do: no spinning meanwhile
            self._take_compiled()
        outputs = self._step()
        if self.notices:
            outputs, self.notices = self.notices + outputs, []
        return outputs

    def _step(self) -> list[OutputItem]:
        if self.chunked is not None:
            return self._next_chunk()
        admitted, jobs = self._admit()
        if jobs:  # queued on the device's stream behind the step in flight: nothing waits
            self.encoder_stage.run(jobs)
            self._count(ForwardMode.ENCODE.value, len(jobs))
        assert all(r.cross_ready for r in admitted)
        if any(r.embed for r in admitted):  # done: no decoder step
            self.notices += [self._finish_embedding(r) for r in admitted if r.embed]
            admitted = [r for r in admitted if not r.embed]
        if admitted and not all(joins_decode(r) for r in admitted):
            return self._extend(admitted)  # (the one-token requests ride along)
        self.running += admitted  # new rows of the next decode step
        if self.running:
            return self._decode_step()
        outputs = self._flush()
        self._unlink_ended(idle=True)
        self.launcher.forget()  # (no batch: its rows and groups are not held)
        self.memory.beam_book.forget()
        if not outputs and self.args.debug_checks:
            self.check_integrity()
        return outputs

    def _next_chunk(self) -> list[OutputItem]:
        """A step while a prompt is prefilled in chunks (no admission meanwhile): a decode
        step of the running batch after each chunk, then the prompt's next chunk. A last
        chunk of one token is a row of the decode step (`joins_decode`)."""
        if self.decode_turn and self.running:
            self.decode_turn = False
            return self._decode_step()
        req, self.chunked = self.chunked, None
        if joins_decode(req):
            self.running.append(req)
            return self._decode_step()
        return self._extend([req])

    def _chunk(self, reqs: list[Req]) -> tuple[Req, int] | None:
        """The request of an EXTEND whose prompt this step computes a chunk of, and where the
        chunk ends: the last one, when chunkable and past the step's prefill budget."""
        size = self.args.chunked_prefill_size
        if size is None or not chunkable(reqs[-1]):
            return None
        others = sum(r.seq_len - r.kv_len for r in reqs[:-1])
        end = chunk_end(reqs[-1], min(size, self.args.max_prefill_tokens) - others)
        return (reqs[-1], end) if end < reqs[-1].seq_len else None

    def _extend(self, admitted: list[Req]) -> list[OutputItem]:
        """The decoder prompts of `admitted` as one EXTEND (the last one's next chunk only,
        when it is prefilled in chunks: it waits in `chunked`, out of the running batch, and
        is not sampled). With the overlap schedule it is launched before the step in flight
        is read, and the next decode step takes its sampled tokens on the device (a beam
        group's first step included: the group sits that step out, `rows_ahead`); a request
        whose rules read every generated token and cannot run ahead runs it with the host
        waiting."""
        chunk = self._chunk(admitted)
        part = chunk[0] if chunk is not None else None
        if self.overlap and overlappable(admitted, self.late_sampling):
            launched = self._launch(ForwardMode.EXTEND, admitted, chunk=chunk)
            outputs = self._flush()
            self.in_flight = launched
            # (finished ones leave when it is read)
            self.running += [r for r in admitted if r is not part]
        else:
            outputs = self._flush()
            outputs += self._run(ForwardMode.EXTEND, admitted, chunk)
            # (a beam request retracted at its first step is back in the queue, not running)
            self.running.extend(r for r in admitted if not r.finished
                                and r.req_pool_idx is not None and r is not part)
        self.chunked, self.decode_turn = part, part is not None
        return outputs

    def _decode_step(self) -> list[OutputItem]:
        prev = self.in_flight
        if self.overlap and prev is not None and overlappable(self.running, self.late_sampling):
            # each running request was in `prev` (one token the host has not seen, on the
            # device) or is fresh (one token to compute, on the host: its last token read, or
            # just admitted)
            ahead = rows_ahead(self.running, prev.batch.sampled, self.memory.page_size)
            if ahead is not None and ahead[0] and self.memory.make_room(ahead[1]):
                self.in_flight = self._launch(ForwardMode.DECODE, ahead[0], prev=prev)
                outputs = self._resolve(prev)
                # the sampling fields that read the rows' last tokens (grammar masks,
                # penalties, n-gram bans), now that the host has them (the device runs the
                # forward meanwhile)
                self.launcher.complete(self.in_flight)
                return outputs
        outputs = self._flush()
        if not self.running:
            return outputs
        self._make_room_for_decode()
        if not self.running:
            return outputs
        if self.overlap and overlappable(self.running, self.late_sampling):
            self.in_flight = self._launch(ForwardMode.DECODE, list(self.running))
            return outputs
        return outputs + self._run(ForwardMode.DECODE, list(self.running))

    def _flush(self) -> list[OutputItem]:
        """Read back and process the step still in flight, if any."""
        if self.in_flight is None:
            return []
        f, self.in_flight = self.in_flight, None
        return self._resolve(f)

    def _admit(self) -> tuple[list[Req], list]:
        """Take waiting requests (in fair order) while slots, pools and the prefill budget allow;
        returns them and the encoder work they still need."""
        admitted: list[Req] = []
        jobs: list = []
        size = self.args.chunked_prefill_size  # (also the step's prefill budget)
        budget = min(self.args.max_prefill_tokens, size or self.args.max_prefill_tokens)
        rows = self.running_rows
        while self.waiting:
            req = self.waiting.peek()
            if rows + req.sampling_params.num_beams > self.args.max_running_requests:
                break
            cut = size is not None and chunkable(req)  # its prompt may start with a chunk
            if admitted and req.seq_len > budget and not (cut and budget > 0):
                break
            # keep a page free for every running row's next decode step
            reserve = rows + req.sampling_params.num_beams - 1
            try:
                req_jobs = self.memory.admit(req, reserve_pages=reserve)
            except InputsNeeded:
                self.waiting.drop()
                message = "the request's encoder input data is no longer available"
                self.notices.append(TokenOutput(rid=req.rid, new_token_ids=[], error=message,
                                                finished_reason={"type": "abort",
                                                                 "message": message}))
                continue
            if req_jobs is None:
                break
            admitted.append(self.waiting.admit())
            jobs += req_jobs
            budget -= req.seq_len
            rows += req.sampling_params.num_beams
            if cut and budget < 0:  # (prefilled in chunks from this step on: the last)
                break
        self.memory.flush_writes()  # (their table rows, all at once)
        return admitted, jobs

    def _make_room_for_decode(self) -> None:
        def need() -> int:
            # (a beam group's rows are all as long as its first: each needs as many)
            return sum(self.memory.pages_to_grow(r, r.seq_len) * r.sampling_params.num_beams
                       for r in self.running)

        while not self.memory.make_room(need()):
            if self.chunked is not None:  # no token yet: the least progress of all
                self._retract(self.chunked)
                continue
            victim = self.waiting.victim(self.running)
            assert len(self.running) > 1, "a lone request always fits (checked at admission)"
            self._retract(victim)

    def _retract(self, victim: Req) -> None:
        """Free a running request's decoder memory (its cross K/V stay) and queue it again: it
        resumes by recomputing its tokens. A beam group starts over from its prompt (beam
        search is deterministic, so the result is the same)."""
        if victim.beam is not None:
            group = victim.beam
            self.running = [r for r in self.running if r.beam is not group]
            self.memory.release_beams(group, keep_cross=True)
            group.reset()
            victim = group.rows[0]
            victim.output_ids = []
            if victim.grammar is not None:  # (its matcher followed the beam it ran)
                victim.grammar.reset()
        else:
            if victim is self.chunked:  # (its chunks start over: nothing of it was cached)
                self.chunked, victim.input_logprobs_part = None, []
            else:
                self.running.remove(victim)
            self.memory.release(victim, keep_cross=True)
        victim.num_retractions += 1
        self.num_retractions += 1
        self.waiting.push_front(victim)
        logger.info("retracted %s to make room (KV pool full)", victim.rid)

    def _run(self, mode: ForwardMode, reqs: list[Req],
             chunk: tuple[Req, int] | None = None) -> list[OutputItem]:
        return self._resolve(self._launch(mode, reqs, chunk=chunk))

    def _launch(self, mode: ForwardMode, reqs: list[Req], prev: InFlight | None = None,
                chunk: tuple[Req, int] | None = None) -> InFlight:
        launched = self.launcher.launch(mode, reqs, prev, chunk)
        self._count(mode.value, launched.batch.batch_size)
        return launched

    def _resolve(self, f: InFlight) -> list[OutputItem]:
        assert f.pending is not None, "a step with late grammar masks is completed first"
        start = time.perf_counter()
        result = f.pending.wait()
        self.wait_seconds += time.perf_counter() - start  # the host idle, waiting for the device
        self.device_seconds += result.device_seconds
        return self._process(f.batch, result)

    def _process(self, batch: ScheduleBatch, result: StepOutput) -> list[OutputItem]:
        """Append each request's new token and check its stop conditions. Streaming requests
        get an output every step; the others one output, with everything, when they finish."""
        outputs: list[OutputItem] = []
        streamed = StreamedTokens()  # the rows whose output is their token alone
        plain = self.args.cache_isolation != "shared"  # (shared: each output has its hits)
        now = time.monotonic()
        ids = result.token_ids
        if batch.scored:
            _hand_out_input_logprobs(batch.scored, result.input_token_logprobs,
                                     batch.prefilling)
        # the rows that take a token: not those finished (or aborted) while this step was in
        # flight, nor beam rows (they advance by group, below), nor a prompt's chunk before
        # its last, nor a request only scored (max_new_tokens 0: nothing is generated)
        reqs, taking, unsampled = batch.reqs, [], []
        for i in range(batch.beam_rows, len(reqs)):  # (a decode step's beam rows lead)
            req = reqs[i]
            if not (req.beam is not None or req.finished or req in batch.prefilling):
                (taking if req.sampling_params.max_new_tokens else unsampled).append(i)
        allowed = accept_tokens(reqs, taking, ids)  # the grammar rows' tokens, all at once
        outputs += [self._finish_unsampled(reqs[i], now) for i in unsampled]
        finished: set[Req] = set()
        for i in taking:
            req = reqs[i]
            token = ids[i]
            if (req.grammar is not None and not allowed.get(i, False)
                    and not self._forced_last(req, token)):
                outputs.append(self._end_dead_grammar(req))
                continue
            req.output_ids.append(token)
            if req.first_token_time is None:
                req.first_token_time = now
            logprobs = top = None
            if req.return_logprob and result.token_logprobs is not None:
                logprobs = [result.token_logprobs[i]]
                req.output_logprobs += logprobs
                if req.top_logprobs_num:
                    top = [result.top[i][: req.top_logprobs_num]]
                    req.output_top_logprobs += top
            req.check_finished(self.eos_ids, self._decode_tail)
            if not req.finished and req.grammar is not None and req.grammar.terminated:
                req.finished_reason = FinishReason("stop")  # the grammar is complete
            if req.finished:
                req.finish_time = now
                kv_bytes = self._kv_bytes(req, len(req.kv_pages))
                self.memory.finish(req)
                finished.add(req)  # (out of the running batch below, all in one pass)
                if not req.stream:  # everything at once
                    outputs.append(self._output(req, req.output_ids, req.output_logprobs or None,
                                                req.output_top_logprobs or None))
                    outputs[-1].extra["kv_bytes"] = kv_bytes
                    continue
            if not req.stream:
                continue
            if plain and req.announced and not req.finished and logprobs is None:
                streamed.add(req.rid, token, _prompt_tokens(req), len(req.output_ids),
                             req.cached_tokens, req.encoder_cache_hit)
            else:
                outputs.append(self._output(req, [token], logprobs, top))
        if finished:
            self.running = [r for r in self.running if r not in finished]
        if batch.beam_groups:
            outputs += self._beam_steps(batch.beam_groups, result, now)
        self._unlink_ended()
        return [streamed, *outputs] if streamed.rids else outputs

    def _unlink_ended(self, idle: bool = False) -> None:
        """The groups that ended before the step just processed was launched: no batch holds
        them now (a step in flight was launched after they left `running`), so they let go of
        their rows and reference counts free both. `idle`: nothing in flight, all of them."""
        for g in self.ended + (self.ending if idle else []):
            g.rows = []
        self.ended, self.ending = ([], []) if idle else (self.ending, [])

    def _forced_last(self, req: Req, token: int) -> bool:
        """The model's forced EOS as a request's last token (max_new_tokens): it overrides the
        grammar, as HF's ForcedEOSTokenLogitsProcessor overrides every other processor."""
        return (token in self.model_config.forced_eos_token_ids
                and len(req.output_ids) + 1 >= req.sampling_params.max_new_tokens)

    def _end_dead_grammar(self, req: Req) -> TokenOutput:
        """A request whose grammar allows no token of the vocabulary: ended with an error."""
        req.finished_reason = FinishReason("abort", message=DEAD_END)
        self.memory.release(req)
        if req in self.running:
            self.running.remove(req)
        out = self._output(req, [])
        out.error = DEAD_END
        return out

    def _finish_unsampled(self, req: Req, now: float) -> TokenOutput:
        """A request with max_new_tokens 0 after its extend (its input scored, if asked)."""
        req.finished_reason = FinishReason("length")
        req.first_token_time = req.finish_time = now
        kv_bytes = self._kv_bytes(req, len(req.kv_pages))
        self.memory.finish(req)
        if req in self.running:  # (an EXTEND read a step late)
            self.running.remove(req)
        out = self._output(req, [])
        out.extra["kv_bytes"] = kv_bytes
        return out

    def _finish_embedding(self, req: Req) -> TokenOutput:
        """An embedding request after the encoder stage: its input's pooled encoder output
        (`EncoderCacheEntry.embedding`; reading it waits for the encoder pass). Its decoder
        pages were never computed: released, not offered to the radix cache."""
        [entry] = req.cross_entries
        assert entry.embedding is not None, "every encoded or projected entry is pooled"
        req.finished_reason = FinishReason("stop")
        req.first_token_time = req.finish_time = time.monotonic()
        embedding = entry.embedding.tolist()
        self.memory.release(req)
        out = self._output(req, [])
        out.extra["embedding"] = embedding
        return out

    def _beam_steps(self, groups: list[BeamGroup], result: StepOutput,
                    now: float) -> list[TokenOutput]:
        """Take the step HF's rules made on the device (`executor/beam_rules.py`) into every
        beam group of the batch: its hypotheses, running scores and end (`follow_device_rules`);
        groups past their first step were moved on the device already, the host follows in
        its books, all together; groups at their first step get their rows here, together."""
        parents, tokens, top_ids, scores, hyp_scores, done = result.beam_step
        heads = list(map(_FIRST, map(_ROWS, groups)))
        ended = np.fromiter(map(is_not, map(_REASON, heads), repeat(None)), dtype=bool,
                            count=len(groups))  # (aborted while the step was in flight)
        if ended.all():
            return []
        sizes = np.fromiter(map(len, map(_ROWS, groups)), dtype=np.int64, count=len(groups))
        k = np.fromiter((h.sampling_params.num_beams for h in heads), dtype=np.int64,
                        count=len(groups))
        first_rows = np.cumsum(sizes) - sizes
        if ended.any():  # (the live groups' entries only)
            live_at = np.flatnonzero(~ended)
            entries = _entries((np.cumsum(k) - k)[live_at], k[live_at])
            parents, tokens, top_ids = parents[entries], tokens[entries], top_ids[entries]
            scores, hyp_scores, done = scores[entries], hyp_scores[entries], done[live_at]
            groups, sizes, k = [groups[i] for i in live_at.tolist()], sizes[live_at], k[live_at]
            first_rows = first_rows[live_at]
        one_row = sizes == 1  # (groups at their first step)
        for i in np.flatnonzero(one_row).tolist():
            if groups[i].rows[0].first_token_time is None:
                groups[i].rows[0].first_token_time = now
        first = follow_device_rules(groups, parents, tokens, scores, top_ids, hyp_scores, done,
                                    self.model_config.vocab_size, k)
        outputs, first_steps, finished = [], [], set()
        for i in np.flatnonzero(done).tolist():
            outputs += self._finish_beams(groups[i], now)
            finished.add(groups[i])
        for i in np.flatnonzero(one_row & ~done).tolist():
            a, n = int(first[i]), int(k[i])
            first_steps.append((groups[i], list(zip(parents[a:a + n].tolist(),
                                                    tokens[a:a + n].tolist()))))
        if finished:  # (one pass over the running batch, however many groups finished)
            self.running = [r for r in self.running if r.beam not in finished]
        moving = np.flatnonzero(~one_row & ~done)
        if moving.size:
            movers = groups if moving.size == len(groups) else [groups[i] for i in
                                                                 moving.tolist()]
            entries = (_entries(first[moving], k[moving]) if moving.size != len(groups)
                       else slice(None))
            self._follow_beams(movers, parents[entries], tokens[entries], k[moving])
        grammars = [beam_grammars(g, choices) for g, choices in first_steps]
        failed = self.memory.reorder_beams(first_steps)
        for (g, _), grammar in zip(first_steps, grammars):
            if g in failed:
                self._retract(g.rows[0])  # no room to copy the pages the beams now write
            else:  # (the head joins the running batch with the other admitted requests;
                # it stands for its group's rows there)
                set_beam_grammars(g, grammar)
        return outputs

    def _follow_beams(self, groups: list[BeamGroup], local: np.ndarray, tokens: np.ndarray,
                      k: np.ndarray) -> None:
        """The host's books of groups past their first step, which the device has moved:
        their rows, group after group (`k[i]` of group i), continue their group's rows
        `local` with `tokens`."""
        offsets = np.repeat(np.cumsum(k) - k, k)  # (every group's rows: num_beams of them)
        # (a grammar row reads its history: a C loop finds none, the usual case)
        heads = list(map(_FIRST, map(_ROWS, groups)))
        with_grammar = ([i for i, h in enumerate(heads) if h.grammar is not None]
                        if any(map(READS_HISTORY, heads)) else [])
        starts = (np.cumsum(k) - k).tolist()
        grammars = [beam_grammars(groups[i], list(zip(local[starts[i]:starts[i] + k[i]].tolist(),
                                                      tokens[starts[i]:starts[i] + k[i]].tolist())))
                    for i in with_grammar]
        self.memory.follow_beams(groups, offsets + local, tokens)
        for i, grammar in zip(with_grammar, grammars):
            set_beam_grammars(groups[i], grammar)

    def _finish_beams(self, group: BeamGroup, now: float) -> list[TokenOutput]:
        """A finished beam group: one output per result, best first. (The caller takes it out
        of the running batch.)"""
        head = group.rows[0]
        kv_bytes = self._kv_bytes(head, group.peak_pages)
        results = group.results()  # (before the release: it reads the rows' books)
        self.memory.release_beams(group)
        head.finish_time = now
        head.output_ids = results[0].tokens
        outputs = []
        for rid, hyp in zip(head.beam_rids or [head.rid], results):
            ended = bool(hyp.tokens) and hyp.tokens[-1] in group.stop_ids
            head.finished_reason = (FinishReason("stop", matched=hyp.tokens[-1]) if ended
                                    else FinishReason("length"))
            head.announced = False  # each result rid gets its detokenizer settings
            out = self._output(head, hyp.tokens)
            out.rid, out.completion_tokens = rid, len(hyp.tokens)
            out.extra.update(beam_score=hyp.score, kv_bytes=kv_bytes)
            outputs.append(out)
        head.finished_reason = FinishReason(**outputs[0].finished_reason)
        self.ending.append(group)
        return outputs

    def _kv_bytes(self, req: Req, pages: int) -> int:
        """KV bytes a request holds, on all ranks: `pages` decoder pages and its cross K/V."""
        def per_slot(p) -> int:
            return 2 * p.num_layers * p.num_kv_heads * p.head_dim * p.dtype.itemsize

        pool, cross = self.memory.token_to_kv, self.memory.cross_kv
        total = pages * pool.page_size * per_slot(pool)
        if cross is not None:
            total += sum(e.handle.loc.numel() for e in req.cross_entries) * per_slot(cross)
        return total * self.args.tp_size  # each tensor-parallel rank holds its heads' slice

    def _decode_tail(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _output(self, req: Req, new_ids: list[int], logprobs=None, top=None) -> TokenOutput:
        if req.finished:  # its last output: its rids leave the index
            for rid in req.beam_rids or [req.rid]:
                if self.by_rid.get(rid) is req:
                    del self.by_rid[rid]
        out = TokenOutput(
            rid=req.rid, new_token_ids=new_ids,
            finished_reason=req.finished_reason.to_json() if req.finished else None,
            prompt_tokens=_prompt_tokens(req),
            cached_tokens=req.cached_tokens, encoder_cache_hit=req.encoder_cache_hit,
            completion_tokens=len(req.output_ids),
            new_logprobs=logprobs, new_top_logprobs=top,
        )
        if self.args.cache_isolation == "shared":
            out.cache_hits = _cache_hits(req)
        if not req.announced:  # the detokenizer keeps these from the first output on
            req.announced = True
            out.input_logprobs = req.input_logprobs
            sp = req.sampling_params
            out.detokenize = DetokenizeSettings(tuple(sp.stop), sp.skip_special_tokens)
        if req.finish_time is not None and req.first_token_time is not None:
            # the scheduler's own clock: queueing + prefill, and the decode phase
            out.extra = {"scheduler_ttft": req.first_token_time - req.arrival_time,
                         "decode_seconds": req.finish_time - req.first_token_time}
        return out

    def _count(self, mode: str, batch_size: int) -> None:
        self.forwards[mode] += 1
        self.max_batch[mode] = max(self.max_batch.get(mode, 0), batch_size)

    # --- operations --------------------------------------------------------------------------
    def stats(self) -> dict:
        return {
            "running_requests": self.running_rows,
            "waiting_requests": len(self.waiting),
            "encoder_forwards": self.encoder_stage.num_forwards,
            "encoder_inputs": self.encoder_stage.num_encoded_inputs,  # inputs encoded
            "encoder_projections": self.encoder_stage.num_projected_inputs,
            "encoder_seconds": self.encoder_stage.seconds,
            "forwards": sum(self.forwards.values()),
            "max_batch_size": self.max_batch.get(ForwardMode.DECODE.value, 0),
            # per forward mode (extend, decode, encode): forwards run, largest batch
            "forwards_by_mode": dict(self.forwards), "max_batch_by_mode": dict(self.max_batch),
            "retractions": self.num_retractions,
            **self.grammars.stats(), "grammar_compiling": len(self.compiles),
            "late_sampling_steps": self.launcher.late_steps,
            "host_wait_seconds": self.wait_seconds,
            "device_busy_seconds": self.device_seconds,
            **self.memory.usage(),
        }

    def flush_cache(self) -> bool:
        """Drop every cached decoder prefix and encoder output that no live request holds."""
        self.radix.flush()
        if self.encoder_cache is not None:
            self.encoder_cache.flush()
        return True

    # --- integrity ---------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Every slot of every pool is free or owned by a live request (AssertionError if not)."""
        chunked = [self.chunked] if self.chunked is not None else []
        self.memory.check(list(self.running) + list(self.waiting) + chunked)


def _prompt_tokens(req: Req) -> int:
    return len(req.encoder_input_ids) or len(req.decoder_input_ids)


def _hand_out_input_logprobs(scored: list[tuple[Req, int]], values: list[float],
                             prefilling: list[Req]) -> None:
    """Each scored request's share of an EXTEND's input log-probs (None for position 0),
    kept apart until its prompt's last chunk (`prefilling`: the others)."""
    start = 0
    for req, count in scored:
        got = (values or [])[start:start + count]
        if req in prefilling:
            req.input_logprobs_part += got
        else:
            head: list[float | None] = [None] if req.logprob_start_len == 0 else []
            req.input_logprobs, req.input_logprobs_part = head + req.input_logprobs_part + got, []
        start += count
