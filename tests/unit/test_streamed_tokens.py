"""A step's plain streamed tokens travel as columns (`StreamedTokens`), and become, in the
detokenizer, the same TokenOutputs the scheduler builds one by one for every other output:
checked against a scheduler whose every output is built one by one (shared cache isolation:
each output carries its cache hits), over a pickle and a real ZMQ socket."""

from __future__ import annotations

import dataclasses
import pickle

import zmq

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.frontend.detokenizer_manager import _waiting
from seq2serve.runtime.messages.io_struct import (
    BatchTokenOutput,
    StreamedTokens,
    TokenOutput,
    token_outputs,
)
from seq2serve.runtime.scheduler.scheduler import Scheduler
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.fake_executor import FakeExecutor
from seq2serve.tests.helpers import request

CONFIG = ModelConfig.from_path(str(default_demo_path()))  # config.json only: no weights load
COMPARED = ("rid", "new_token_ids", "finished_reason", "prompt_tokens", "completion_tokens",
            "cached_tokens", "encoder_cache_hit", "detokenize", "error")


def _arrivals():
    def streamed(rid, enc, n, **kw):
        tr = request(rid, enc, [0], max_new_tokens=n, ignore_eos=True, **kw)
        tr.stream = True
        return tr

    return {
        0: [streamed(f"s{k}", [100 + k, 101, 1], 5 + k) for k in range(4)]
        + [request("whole", [90, 1], [0], max_new_tokens=4, ignore_eos=True)],
        2: [streamed("late", [60, 61, 62, 1], 6, skip_special_tokens=False),
            streamed("prompted", [61, 1], 3)],
        3: [streamed("one", [63, 1], 1)],
    }


def _run(isolation: str) -> tuple[list[list], int]:
    """Every step's items, and how many rows came as columns."""
    args = ServerArgs(model_path=CONFIG.model_path, device="cpu", cache_isolation=isolation)
    sched = Scheduler(args, CONFIG, None, FakeExecutor(args, CONFIG))
    arrivals, steps, columns, step = _arrivals(), [], 0, 0
    while sched.has_work or step <= max(arrivals):
        for tr in arrivals.get(step, []):
            sched.add_request(tr)
        items = sched.step_items()
        columns += sum(len(i.rids) for i in items if isinstance(i, StreamedTokens))
        steps.append(items)
        step += 1
    return steps, columns


def _fields(outs: list[TokenOutput]) -> dict[str, list[tuple]]:
    """Each request's outputs in order (the order between requests carries nothing)."""
    by_rid: dict[str, list[tuple]] = {}
    for o in outs:
        by_rid.setdefault(o.rid, []).append(tuple(getattr(o, f) for f in COMPARED))
    return by_rid


def test_columns_give_the_outputs_built_one_by_one():
    columnar, columns = _run("user")
    one_by_one, none = _run("shared")
    assert none == 0 and columns > 20  # (28 streamed tokens after the 6 first ones)
    assert len(columnar) == len(one_by_one)
    for items, reference in zip(columnar, one_by_one):
        sent = pickle.loads(pickle.dumps(BatchTokenOutput(items)))  # as ZMQ carries it
        assert _fields(token_outputs(sent.outputs)) == _fields(reference)
    finals = [o for items in columnar for o in token_outputs(items) if o.finished_reason]
    assert {o.rid for o in finals} == {"s0", "s1", "s2", "s3", "whole", "late", "prompted",
                                      "one"}
    late = [o for items in columnar for o in token_outputs(items) if o.rid == "late"]
    assert late[0].detokenize is not None and not late[0].detokenize.skip_special_tokens
    assert all(o.detokenize is None for o in late[1:])


def test_the_detokenizer_reads_columns_as_token_outputs():
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind("inproc://streamed-tokens")
    push.connect("inproc://streamed-tokens")
    cols = StreamedTokens()
    cols.add("a", 5, 10, 2, 4, True)
    cols.add("b", 6, 11, 3, 0, False)
    done = TokenOutput(rid="c", new_token_ids=[7], finished_reason={"type": "length"},
                       prompt_tokens=3, completion_tokens=9)
    try:
        push.send_pyobj(BatchTokenOutput([cols, done]))
        [msg] = _waiting(pull)
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()
    assert all(isinstance(o, TokenOutput) for o in msg.outputs)
    a, b, c = (dataclasses.asdict(o) for o in msg.outputs)
    assert (a["rid"], a["new_token_ids"], a["prompt_tokens"], a["completion_tokens"],
            a["cached_tokens"], a["encoder_cache_hit"]) == ("a", [5], 10, 2, 4, True)
    assert (b["rid"], b["new_token_ids"], b["completion_tokens"]) == ("b", [6], 3)
    assert a["finished_reason"] is None and c == dataclasses.asdict(done)
