"""The Python engine under interruption and large lists (issue 39, item 8): Ctrl-C aborts
the call's requests, shutdown() fails blocked callers at once, and a list longer than
max_batch_inputs (an HTTP limit) is served in chunks, in order."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.frontend.engine import EngineShutdownError
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.timing import within

LONG = {"max_new_tokens": 400, "ignore_eos": True, "temperature": 0}


def _engine(**kw) -> Seq2SeqEngine:
    return Seq2SeqEngine(model_path=str(default_demo_path()), device="cpu",
                         **{"max_running_requests": 16, **kw})


def _idle_within(engine, seconds: float) -> float:
    start, limit = time.monotonic(), within(seconds)
    while True:
        s = engine.stats()
        if s["running_requests"] == 0 and s["waiting_requests"] == 0:
            return time.monotonic() - start
        assert time.monotonic() - start < limit, s
        time.sleep(0.05)


@pytest.fixture
def python_ctrl_c():
    """Python's own Ctrl-C handler for the test (a CI worker once ran this after something in
    its process had replaced it: the SIGINT raised nothing), the previous one back after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_aborts_the_whole_call(python_ctrl_c):
    with _engine() as engine:
        main = threading.get_ident()
        threading.Timer(1.0, signal.pthread_kill, (main, signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            engine.generate([f"translate digits to English: {i}" for i in range(200)], LONG)
        _idle_within(engine, 2.0)  # before: 16 running, 184 waiting
        start = time.monotonic()
        out = engine.generate("translate digits to English: 5", {"max_new_tokens": 4})
        assert out["meta_info"]["finish_reason"] is not None
        assert time.monotonic() - start < within(2.0)
        engine.check_integrity()


def test_shutdown_fails_blocked_callers_promptly():
    engine = _engine()
    failed: list[BaseException] = []

    def call():
        try:
            engine.generate([f"translate digits to English: {i}" for i in range(100)], LONG)
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            failed.append(e)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(1.0)
    start = time.monotonic()
    engine.shutdown()
    caller.join(timeout=10)
    assert not caller.is_alive(), "the caller is still blocked in generate()"
    assert time.monotonic() - start < 10
    assert len(failed) == 1 and isinstance(failed[0], EngineShutdownError), failed
    with pytest.raises(EngineShutdownError):
        engine.generate("translate digits to English: 5")


def test_a_list_over_max_batch_inputs_is_served_in_order():
    prompts = [f"translate digits to English: {i % 10}" for i in range(1_100)]
    with _engine(max_running_requests=256) as engine:  # one chunk of 1024, one of 76
        start = time.monotonic()
        out = engine.generate(prompts, {"max_new_tokens": 2, "temperature": 0})
        seconds = time.monotonic() - start
        expected = {d: engine.generate(f"translate digits to English: {d}",
                                       {"max_new_tokens": 2, "temperature": 0})["text"]
                    for d in range(10)}
        assert len(out) == 1_100
        assert [r["text"] for r in out] == [expected[i % 10] for i in range(1_100)]
        assert len(set(expected.values())) > 1
        print(f"1,100 prompts (over max_batch_inputs 1024) in {seconds:.1f} s")
        engine.check_integrity()
