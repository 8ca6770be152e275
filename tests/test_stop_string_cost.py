"""Stop strings cost the same per token whatever their length (issue 39, item 2): the
detokenizer's hold-back and the scheduler's check, against the straightforward definitions."""

from __future__ import annotations

import random
import time

import pytest

from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.frontend.incremental_detokenizer import IncrementalDetokenizer
from seq2serve.runtime.frontend.stop_matcher import StopMatcher
from seq2serve.runtime.scheduler.req import Req
from seq2serve.runtime.tools.demo_checkpoint import ASSETS


@pytest.fixture(scope="module", params=["t5-tokenizer", "llama3-tokenizer"])
def tok(request):
    return load_tokenizer(str(ASSETS / request.param))


def _held(text: str, stop: list[str]) -> int:
    """The definition: the longest suffix of text that is a proper prefix of a stop string."""
    return max((k for s in stop for k in range(1, min(len(s) - 1, len(text)) + 1)
                if text.endswith(s[:k])), default=0)


def test_stop_matcher_holds_what_the_definition_holds():
    rng = random.Random(0)
    for _ in range(2000):
        stop = ["".join(rng.choice("ab c") for _ in range(rng.randint(1, 6)))
                for _ in range(rng.randint(1, 4))]
        m, text = StopMatcher(stop), ""
        for _ in range(25):
            piece = "".join(rng.choice("abc ") for _ in range(rng.randint(0, 3)))
            text += piece
            m.feed(piece)
            assert m.held == _held(text, stop), (stop, text)


def _detokenize_seconds(tok, ids, stop) -> float:
    d = IncrementalDetokenizer(tok, True, stop)
    start = time.perf_counter()
    for t in ids:
        d.add([t])
    return time.perf_counter() - start


def test_detokenizer_cost_does_not_grow_with_stop_length(tok):
    """Before: 16 stop strings of 10,000 characters made a token ~50x dearer."""
    ids = tok("one two three four five six seven eight nine ten " * 20,
              add_special_tokens=False).input_ids[:200]
    huge = [("xy" * 5000)[:-1] + str(i) for i in range(16)]
    # interleaved, the best of 7 each: a busy machine slows both alike (CI's two cores ran
    # this beside other test processes; a 50x regression stays far past the bound)
    times = [(_detokenize_seconds(tok, ids, ["zq"]), _detokenize_seconds(tok, ids, huge))
             for _ in range(7)]
    short, long = min(t for t, _ in times), min(t for _, t in times)
    assert long < 5 * short + 0.02, (short, long)


def _old_check(req: Req, decode) -> str | None:
    """The scheduler's check before the fix: a window as long as the longest stop string."""
    stop = req.sampling_params.stop
    window = req.output_ids[-(max(map(len, stop)) + 8):]
    text, before = decode(window), decode(window[:-1])
    return next((s for s in stop if text.find(s, max(0, len(before) - len(s) + 1)) >= 0), None)


def test_scheduler_check_matches_the_long_window(tok):
    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    rng = random.Random(1)
    words = "Hello world, how are you? Grüße aus Köln 日本語のテキスト 🎉 emoji".split()
    for _ in range(40):
        text = " ".join(rng.choice(words) for _ in range(40))
        ids = tok(text, add_special_tokens=False).input_ids
        full = decode(ids)
        stop = [full[i:i + rng.randint(1, 30)] for i in
                (rng.randrange(len(full)) for _ in range(rng.randint(1, 3)))] + ["never there"]
        req = Req(rid="r", encoder_input_ids=[], decoder_input_ids=[0],
                  sampling_params=SamplingParams(stop=stop))
        for t in ids:
            req.output_ids.append(t)
            assert req._new_stop_string(decode) == _old_check(req, decode), (stop, req.output_ids)


def test_scheduler_check_decodes_a_short_window(tok):
    """The decoded length per token is bounded, whatever the stop strings' length."""
    decoded = []

    def decode(ids):
        decoded.append(len(ids))
        return tok.decode(ids, skip_special_tokens=True)

    ids = tok("one two three four five six seven " * 60, add_special_tokens=False).input_ids
    req = Req(rid="r", encoder_input_ids=[], decoder_input_ids=[0],
              sampling_params=SamplingParams(stop=["x" * 1024]))
    for t in ids:
        req.output_ids.append(t)
        assert req._new_stop_string(decode) is None
    assert max(decoded[4:]) <= 16, max(decoded[4:])
