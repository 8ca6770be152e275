"""Long audio's windows merged with their timestamps (runtime/frontend/timed_merge.py) against
HF's own merge, `WhisperTokenizer._decode_asr(..., return_timestamps=True)` as the ASR
pipeline calls it (strides in seconds), on random windows shaped as the timestamp rules shape
them: non-decreasing timestamps in pairs, text from one script of the whole audio (so that
overlaps agree, mostly), segments that cross the strides, segments and windows without
text, an unclosed last segment, an end of text; and windows decoded more than once (HF's
default: again from the last complete segment), their decodes end to end, each decode's
timestamps counting from its own seek."""

from __future__ import annotations

import random

import pytest

from seq2serve.runtime.frontend.audio_chunks import windows
from seq2serve.runtime.frontend.timed_merge import TimedWindow, merge_timed

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import WhisperTokenizer

    from seq2serve.tests.whisper_checkpoints import write_whisper_checkpoint

    path = write_whisper_checkpoint("multilingual", tmp_path_factory.mktemp("tm") / "m",
                                    timestamps=True)
    return WhisperTokenizer.from_pretrained(path)


def _window(rng: random.Random, script: list[int], start_s: float, length_s: float,
            begin: int, eot: int) -> list[int]:
    """A window's ids: segments of the script's words at their times, each opened and
    closed by timestamps on the window's clock (0.02 s steps)."""
    ids, t = [], rng.choice([0, 0, rng.randrange(0, 100)])
    limit = int(length_s / 0.02)
    if rng.random() < 0.1:
        return [eot]  # no text at all
    while t < limit:
        ids.append(begin + t)
        end = min(limit, t + rng.randrange(1, 400))
        words = [script[int(start_s + x * 0.02)] for x in range(t, end, 40)]
        if rng.random() < 0.1:
            words = [rng.randrange(60, 90) for _ in words]  # a window that disagrees
        elif rng.random() < 0.1:
            words = []  # a segment without text
        ids.extend(words)
        if rng.random() < 0.08:
            break  # cut off mid-segment: no closing timestamp
        ids.append(begin + end)
        if rng.random() < 0.15:
            break  # a single closing timestamp ends the window
        t = end + rng.choice([0, 0, rng.randrange(0, 50)])
    return ids + [eot]


def _redecoded(rng: random.Random, script: list[int], start_s: float, length_s: float,
               begin: int, eot: int) -> list[int]:
    """A window decoded 2 or 3 times, as HF's generate returns it: every decode but the last
    ends with a pair (its last segment closed, the next one opened) and the next decode
    starts at that segment's end, its timestamps from 0 again; the last decode is
    `_window`'s (any ending)."""
    ids, seek = [], 0.0
    for _ in range(rng.randrange(1, 3)):
        part = _window(rng, script, start_s + seek, length_s - seek, begin, eot)[:-1]
        stamps = [t for t in part if t >= begin]
        if len(stamps) < 2 or length_s - seek < 2:
            break
        if part[-1] < begin:  # cut off mid-segment: closed
            part.append(stamps[-1] + rng.randrange(1, 20))
        if part[-2] < begin:  # the next segment opened
            part.append(part[-1] + rng.choice([0, 0, rng.randrange(0, 20)]))
        ids += part
        seek += (part[-2] - begin) * 0.02  # the closed segment's end
        if part[-2] == begin:
            break
    return ids + _window(rng, script, start_s + seek, max(length_s - seek, 1.0), begin, eot)


@pytest.mark.parametrize("seed", range(40))
def test_merge_is_hfs_decode_asr(tokenizer, seed):
    rng = random.Random(seed)
    begin = tokenizer.convert_tokens_to_ids("<|notimestamps|>") + 1
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    seconds = rng.choice([35, 52.5, 95, 140.3])
    chunk_s, stride_s = rng.choice([(30, 5), (30, 5), (20, 4), (30, 0)])
    script = [rng.randrange(33, 120) for _ in range(int(seconds) + 31)]
    outputs, timed = [], []
    for w in windows(int(seconds * 16_000), chunk_s * 16_000, stride_s * 16_000,
                     stride_s * 16_000):
        stride = ((w.end - w.start) / 16_000, w.stride_left / 16_000, w.stride_right / 16_000)
        make = _redecoded if rng.random() < 0.4 else _window
        ids = make(rng, script, w.start / 16_000, stride[0], begin, eot)
        outputs.append({"tokens": torch.tensor([ids]), "stride": stride})
        timed.append(TimedWindow(ids, *stride))
    text, optional = tokenizer._decode_asr(outputs, return_timestamps=True,
                                           return_language=False, time_precision=0.02)
    got_text, chunks = merge_timed(timed, begin, set(tokenizer.all_special_ids),
                                   tokenizer.decode)
    assert got_text == text
    assert [((c.start, c.end), c.text) for c in chunks] == [
        (tuple(c["timestamp"]), c["text"]) for c in optional["chunks"]]
    assert "".join(tokenizer.decode(c.tokens) for c in chunks) == text
