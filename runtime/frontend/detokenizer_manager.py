"""The detokenizer's process: turns token ids from the scheduler into text, incrementally, and
forwards everything to the tokenizer manager (with several HTTP processes, each output and
control reply to the process whose request it is: `request_ids.server_of`)."""

from __future__ import annotations

import logging
import signal
import traceback

import zmq

from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.frontend.incremental_detokenizer import (
    IncrementalDetokenizer,
    batch_decoder,
)
from seq2serve.runtime.frontend.request_ids import server_of
from seq2serve.runtime.memory.collector import freeze_heap
from seq2serve.runtime.messages.io_struct import (
    BatchTokenOutput,
    ControlReply,
    DetokenizeSettings,
    token_outputs,
)
from seq2serve.runtime.messages.ipc import IpcNames, parent_alive, socket

logger = logging.getLogger(__name__)


class DetokenizerManager:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalDetokenizer] = {}
        self.decode = batch_decoder(tokenizer)

    def handle(self, batch: BatchTokenOutput) -> None:
        """Every output's text, with the windows of a round of requests decoded in one call
        per `skip_special_tokens` setting (one by one, 3 decodes a token held the process at a
        core with 128 fast streams, and their events came in bursts). A round holds each
        request once: merged steps (`_merged`) may carry a request's outputs of several."""
        round_: list = []
        seen: set[str] = set()
        for out in batch.outputs:
            if out.error is not None:
                continue
            if out.rid in seen:
                self._round(round_)
                round_, seen = [], set()
            round_.append(out)
            seen.add(out.rid)
        self._round(round_)

    def _round(self, outs: list) -> None:
        steps = []  # (output, state, where its windows start in its group, how many)
        seqs: dict[bool, list[list[int]]] = {True: [], False: []}
        for out in outs:
            state = self.states.get(out.rid)
            if state is None:  # a request's first output carries its settings
                settings = out.detokenize or DetokenizeSettings()
                state = IncrementalDetokenizer(self.tokenizer, settings.skip_special_tokens,
                                               list(settings.stop))
                self.states[out.rid] = state
            windows = state.push(out.new_token_ids)
            group = seqs[state.skip_special_tokens]
            steps.append((out, state, len(group), len(windows)))
            group += windows
        texts = {skip: self.decode(group, skip) if group else [] for skip, group in seqs.items()}
        for out, state, at, n in steps:
            finished = out.finished_reason is not None
            matched = (out.finished_reason or {}).get("matched")
            out.text = state.finish_step(texts[state.skip_special_tokens][at:at + n], finished,
                                         matched if isinstance(matched, str) else None)
            if finished:
                del self.states[out.rid]


def run_detokenizer_process(args: ServerArgs, ipc: IpcNames, ready_pipe, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        manager = DetokenizerManager(load_tokenizer(args.tokenizer_path or args.model_path))
        ctx = zmq.Context()
        recv = socket(ctx, zmq.PULL, ipc.detokenizer_input, bind=True)
        sends = [socket(ctx, zmq.PUSH, e, bind=False) for e in ipc.tokenizer_inputs]
    except Exception as e:  # noqa: BLE001 - reported to the parent
        ready_pipe.send({"status": "error", "type": type(e).__name__, "message": str(e),
                         "traceback": traceback.format_exc()})
        return
    freeze_heap()  # the tokenizer and imports: out of the collector's full passes
    ready_pipe.send({"status": "ready"})
    poller = zmq.Poller()
    poller.register(recv, zmq.POLLIN)
    while True:
        if not poller.poll(500):
            if not parent_alive(parent_pid):
                return
            continue
        for msg in _merged(_waiting(recv)):
            if isinstance(msg, BatchTokenOutput):
                manager.handle(msg)
            if len(sends) == 1:
                sends[0].send_pyobj(msg)
                continue
            for server, part in _routed(msg):
                sends[server].send_pyobj(part)


def _waiting(recv, most: int = 64) -> list:
    """The messages already queued on `recv` (at least one is), up to `most`, each step's
    streamed-token columns as TokenOutputs."""
    msgs = [recv.recv_pyobj()]
    while len(msgs) < most:
        try:
            msgs.append(recv.recv_pyobj(zmq.NOBLOCK))
        except zmq.Again:
            break
    for m in msgs:
        if isinstance(m, BatchTokenOutput):
            m.outputs = token_outputs(m.outputs)
    return msgs


def _routed(msg) -> list[tuple[int, object]]:
    """(HTTP process, message) pairs: a batch split by its outputs' processes (in order), a
    control reply to the process that asked."""
    if isinstance(msg, ControlReply):
        return [(server_of(msg.tag), msg)]
    parts: dict[int, list] = {}
    for out in msg.outputs:
        parts.setdefault(server_of(out.rid), []).append(out)
    return [(server, BatchTokenOutput(outs)) for server, outs in parts.items()]


def _merged(msgs: list) -> list:
    """Consecutive step outputs as one batch (in order: a request's outputs stay in their
    order, and other messages keep their place): when the scheduler runs ahead of this
    process, the HTTP process then loads one message instead of several."""
    out: list = []
    for m in msgs:
        if isinstance(m, BatchTokenOutput) and out and isinstance(out[-1], BatchTokenOutput):
            out[-1].outputs.extend(m.outputs)  # (the messages are this process's own copies)
        else:
            out.append(m)
    return out
