"""The scheduler's process: owns the model and the device, receives requests over ZMQ, runs
steps, and streams token ids to the detokenizer."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import traceback

import zmq

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.memory.collector import CollectorPauses, FullPasses, freeze_heap
from seq2serve.runtime.memory.host_memory import PeriodicTrim
from seq2serve.runtime.messages.io_struct import (
    AbortRequest,
    BatchTokenOutput,
    ControlReply,
    ControlRequest,
    TokenizedRequest,
    TokenOutput,
)
from seq2serve.runtime.messages.ipc import IpcNames, parent_alive, socket
from seq2serve.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

_IDLE_POLL_MS = 500  # how often an idle scheduler checks that its parent is alive
# A CPU scheduler's forwards free host memory every step, and glibc keeps it for reuse: it is
# handed back when the scheduler goes idle (at most once a second). Not on a GPU: there the
# host heap barely churns, and with the trim the offline bench's first tokens came 220 ms
# later (the trim after its warm-up stalled the run's first step; H100, 21.3k vs 31.9k tok/s).
_IDLE_TRIM_S = 1.0


def run_scheduler_process(args: ServerArgs, ipc: IpcNames, ready_pipe, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    _setup_logging(args)
    try:
        model_config = ModelConfig.from_path(args.model_path)
        tokenizer = load_tokenizer(args.tokenizer_path or args.model_path)
        scheduler = Scheduler(args, model_config, tokenizer)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        ready_pipe.send({"status": "error", "type": type(e).__name__, "message": str(e),
                         "traceback": traceback.format_exc()})
        return
    # the model, torch and the warm-up out of the collector's full passes: with them in, a
    # full pass stalled every stream for tens of ms under a steady load (collector.py)
    freeze_heap()
    ready_pipe.send({"status": "ready", "info": scheduler_info(scheduler)})
    SchedulerLoop(scheduler, ipc, parent_pid).run()


def scheduler_info(scheduler: Scheduler) -> dict:
    runner = scheduler.worker.model_runner
    mem = scheduler.memory
    arch = scheduler.model_config.arch
    return {
        # what the TokenizerManager needs to prepare the model's own inputs besides text
        # (the model's config says; Mllama: its image processor's settings)
        **arch.frontend_info(),
        "architecture": scheduler.model_config.architecture,
        "decoder_start_token_id": arch.decoder_start_token_id,
        "forced_bos_token_id": scheduler.model_config.forced_bos_token_id,
        "min_length": scheduler.model_config.generation_min_length,
        **dataclasses.asdict(scheduler.limits),  # what a request may be (ModelLimits)
        "encoder_cache": mem.encoder_cache is not None and mem.encoder_cache.enabled,
        "device": runner.device,
        **scheduler.worker.layout(),  # tensor-parallel ranks and their devices
        "dtype": str(runner.dtype).removeprefix("torch."),
        "attention_backend": runner.backend_name,
        "pid": os.getpid(),
    }


class SchedulerLoop:
    def __init__(self, scheduler: Scheduler, ipc: IpcNames, parent_pid: int) -> None:
        self.scheduler = scheduler
        self.parent_pid = parent_pid
        ctx = zmq.Context()
        self.recv = socket(ctx, zmq.PULL, ipc.scheduler_input, bind=True)
        self.send = socket(ctx, zmq.PUSH, ipc.detokenizer_input, bind=False)
        self.poller = zmq.Poller()
        self.poller.register(self.recv, zmq.POLLIN)
        self.trim = PeriodicTrim() if scheduler.device == "cpu" else None
        self.gc_pauses = CollectorPauses()
        # full collections off the allocation count: when idle, else every interval
        self.full_passes = FullPasses(scheduler.args.gc_full_pass_interval)

    def run(self) -> None:
        busy = False
        while True:
            if busy and not self.scheduler.has_work and self.trim is not None:
                self.trim.maybe(_IDLE_TRIM_S)  # just went idle
            busy = self.scheduler.has_work
            self.full_passes.maybe(idle=not busy)
            timeout = 0 if busy else _IDLE_POLL_MS
            if not self.poller.poll(timeout) and not self.scheduler.has_work:
                if not parent_alive(self.parent_pid):
                    return
                if self.scheduler.args.debug_checks:
                    self.scheduler.check_integrity()
                continue
            outputs = self._drain()
            if self.scheduler.has_work:
                outputs += self.scheduler.step_items()  # (StreamedTokens among them)
            if outputs:
                self.send.send_pyobj(BatchTokenOutput(outputs))

    def _drain(self) -> list:
        out: list = []
        while True:
            try:
                msg = self.recv.recv_pyobj(zmq.NOBLOCK)
            except zmq.Again:
                return out
            if isinstance(msg, (TokenizedRequest, list)):  # a list: one call's requests
                for tr in msg if isinstance(msg, list) else [msg]:
                    try:
                        self.scheduler.add_request(tr)
                    except ValueError as e:
                        out.append(TokenOutput(rid=tr.rid, new_token_ids=[], error=str(e),
                                               finished_reason={"type": "abort",
                                                                "message": str(e)}))
            elif isinstance(msg, AbortRequest):
                aborted = self.scheduler.abort_request(msg.rid)
                if aborted is not None:
                    out.append(aborted)
            elif isinstance(msg, ControlRequest):
                # replies go out at once, ahead of this step's tokens
                self.send.send_pyobj(self._control(msg))

    def _control(self, msg: ControlRequest) -> ControlReply:
        s = self.scheduler
        try:
            if msg.kind == "check_integrity":
                s.check_integrity()
                return ControlReply(msg.kind, msg.tag, True, {"idle": not s.has_work})
            if msg.kind == "stats":
                return ControlReply(msg.kind, msg.tag, True, {**s.stats(), **s.worker.layout(),
                                                              **s.worker.host_caches(),
                                                              **self.gc_pauses.stats(),
                                                              **self.full_passes.stats()})
            if msg.kind == "flush_cache":
                return ControlReply(msg.kind, msg.tag, s.flush_cache())
        except AssertionError as e:
            return ControlReply(msg.kind, msg.tag, False, {"error": str(e)})
        return ControlReply(msg.kind, msg.tag, False, {"error": f"unknown control {msg.kind!r}"})


def _setup_logging(args: ServerArgs) -> None:
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(processName)s %(name)s: %(message)s")
