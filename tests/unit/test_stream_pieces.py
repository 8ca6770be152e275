"""The HTTP process's per-request pieces (TokenizerManager._next / _stream): outputs that
came while the event loop was busy go out as one piece, in order, with nothing lost or
reordered, errors after them still raised, and a token that arrives alone is never held
back. The manager is made without its processes (only its stream bookkeeping runs)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from seq2serve.runtime.frontend.tokenizer_manager import (EngineDeadError, TokenizerManager,
                                                          _ReqState)
from seq2serve.runtime.frontend.request_ids import scoped_rid
from seq2serve.runtime.messages.io_struct import TokenOutput


def _manager() -> TokenizerManager:
    tm = object.__new__(TokenizerManager)
    tm.metrics, tm.link = None, SimpleNamespace(router=None)
    return tm


def _out(i: int, finished: bool = False, **kw) -> TokenOutput:
    return TokenOutput(rid="r", new_token_ids=[i], text=f"<{i}>", completion_tokens=i,
                       new_logprobs=[-float(i)], new_top_logprobs=[[(i, -float(i))]],
                       finished_reason={"type": "length"} if finished else None, **kw)


def test_outputs_that_queued_up_go_out_as_one_piece():
    async def go():
        tm, s = _manager(), _ReqState(rid=scoped_rid(None, "r"), index=0)
        for i in (1, 2, 3):
            s.queue.put_nowait(_out(i, input_logprobs=[None, -0.5] if i == 1 else None))
        piece = await tm._next(s)
        assert piece.new_token_ids == [1, 2, 3] and piece.text == "<1><2><3>"
        assert piece.new_logprobs == [-1.0, -2.0, -3.0]
        assert piece.new_top_logprobs == [[(1, -1.0)], [(2, -2.0)], [(3, -3.0)]]
        assert piece.completion_tokens == 3 and piece.input_logprobs == [None, -0.5]
        assert s.output_ids == [1, 2, 3] and s.text == "<1><2><3>"
        assert s.logprobs == [-1.0, -2.0, -3.0] and not s.finished

        s.queue.put_nowait(_out(4, finished=True))
        s.queue.put_nowait(_out(99))  # nothing is merged past the finish
        last = await tm._next(s)
        assert last.new_token_ids == [4] and s.finished and s.queue.qsize() == 1

    asyncio.run(go())


@pytest.mark.parametrize("error", [EngineDeadError("scheduler died"),
                                   TokenOutput(rid="r", new_token_ids=[], error="bad input")])
def test_an_error_behind_queued_outputs_comes_after_them(error):
    async def go():
        tm, s = _manager(), _ReqState(rid=scoped_rid(None, "r"), index=0)
        for item in (_out(1), _out(2), error):
            s.queue.put_nowait(item)
        assert (await tm._next(s)).new_token_ids == [1, 2]
        with pytest.raises((EngineDeadError, ValueError), match="died|bad input"):
            await tm._next(s)

    asyncio.run(go())


def test_a_stream_sends_each_token_as_it_comes_when_the_loop_keeps_up():
    async def go():
        tm, s = _manager(), _ReqState(rid=scoped_rid(None, "r"), index=0)
        chunks = []

        async def feed():
            for i in range(1, 6):
                s.queue.put_nowait(_out(i, finished=i == 5))
                await asyncio.sleep(0.01)

        feeder = asyncio.create_task(feed())
        async for chunk in tm._stream([s], logprob=True):
            chunks.append(chunk)
        await feeder
        assert [c["output_ids"] for c in chunks] == [[1], [2], [3], [4], [5]]
        assert [c["logprobs"] for c in chunks] == [[-1.0], [-2.0], [-3.0], [-4.0], [-5.0]]
        assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length"}

    asyncio.run(go())


def test_a_stream_that_fell_behind_catches_up_in_fewer_pieces():
    async def go():
        tm = _manager()
        states = [_ReqState(rid=scoped_rid(None, f"r{k}"), index=k) for k in range(2)]
        for s in states:
            for i in range(1, 5):
                s.queue.put_nowait(_out(i, finished=i == 4))
        pieces = [c async for c in tm._stream(states, logprob=False)]
        assert sorted(c["index"] for c in pieces) == [0, 1]
        assert all(c["output_ids"] == [1, 2, 3, 4] and c["text"] == "<1><2><3><4>"
                   for c in pieces)

    asyncio.run(go())
