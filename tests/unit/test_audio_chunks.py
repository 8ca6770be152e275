"""Long audio's windows and merge (runtime/frontend/audio_chunks.py) against HF's ASR
pipeline's own functions: `chunk_iter`'s windows for every kind of length, and the Whisper
tokenizer's `_find_longest_common_sequence` over window sequences that overlap, disagree in
their overlaps, or share nothing."""

from __future__ import annotations

import numpy as np
import pytest

from seq2serve.runtime.frontend.audio_chunks import (
    CHUNK_SAMPLES,
    STRIDE_SAMPLES,
    chunking,
    merge_tokens,
    text_tokens,
    windows,
)

pytest.importorskip("transformers")


class _Positions:
    """A stand-in feature extractor for `chunk_iter`: a chunk of `np.arange` samples tells
    where it lies."""

    sampling_rate = 16_000

    def __call__(self, chunk, **_):
        return {"first": int(chunk[0]), "last": int(chunk[-1])}


def _hf_windows(n: int, chunk: int, left: int, right: int) -> list[tuple]:
    from transformers.pipelines.automatic_speech_recognition import chunk_iter

    return [(item["first"], item["last"] + 1, item["stride"][1], item["stride"][2])
            for item in chunk_iter(np.arange(n), _Positions(), chunk, left, right)]


@pytest.mark.parametrize("n", [1, 79_999, 480_000, 480_001, 560_000, 560_001, 800_000,
                               800_001, 1_520_000, 1_600_000, 1_600_123, 3_333_333])
def test_windows_are_the_pipelines(n):
    ours = [(w.start, w.end, w.stride_left, w.stride_right) for w in windows(n)]
    assert ours == _hf_windows(n, CHUNK_SAMPLES, STRIDE_SAMPLES, STRIDE_SAMPLES)


def test_other_chunkings_and_a_chunk_without_a_step():
    for n, chunk, left, right in ((1_000, 100, 10, 30), (999, 100, 0, 0), (1_001, 100, 45, 5)):
        ours = [(w.start, w.end, w.stride_left, w.stride_right)
                for w in windows(n, chunk, left, right)]
        assert ours == _hf_windows(n, chunk, left, right)
    with pytest.raises(ValueError, match="leaves no step"):
        windows(1_000, 100, 50, 50)
    assert chunking() == (480_000, 80_000, 80_000)  # the pipeline's sixth by default
    assert chunking(12.5, 2) == (200_000, 32_000, 32_000)
    for bad, named in (((31,), "chunk_length_s must be in"), ((0,), "chunk_length_s must"),
                       ((10, 5), "stride_length_s must be"), ((10, -1), "stride_length_s")):
        with pytest.raises(ValueError, match=named):
            chunking(*bad)


def _overlapping(rng: np.random.Generator, windows: int, vocab: int) -> list[list[int]]:
    """Windows of one random text, each starting before the last one ended, with a few
    tokens changed (windows disagree in their overlaps, as real ones do), some empty."""
    text = rng.integers(0, vocab, size=40 * windows).tolist()
    out, start = [], 0
    for _ in range(windows):
        length = int(rng.integers(0, 60))
        seq = list(text[start:start + length])
        for i in rng.integers(0, max(1, len(seq)), size=int(rng.integers(0, 4))):
            if seq:
                seq[i] = int(rng.integers(0, vocab))
        out.append(seq)
        start += int(rng.integers(5, 45))
    return out


def test_merge_is_the_pipelines():
    from transformers.models.whisper.tokenization_whisper import (
        _find_longest_common_sequence,
    )

    rng = np.random.default_rng(0)
    trimmed = 0
    for case in range(300):
        seqs = _overlapping(rng, int(rng.integers(1, 7)), vocab=(4, 20, 300)[case % 3])
        nonempty = [s for s in seqs if s]  # the pipeline passes only windows with text
        expected = _find_longest_common_sequence(nonempty) if nonempty else []
        assert merge_tokens(seqs) == expected, seqs
        trimmed += len(expected) < sum(map(len, nonempty))
    assert trimmed > 200, "most cases must exercise an overlap"
    assert merge_tokens([[1, 2, 3], [7, 8]]) == [1, 2, 3, 7, 8]  # nothing shared: joined


def test_text_tokens_leave_out_specials_and_timestamps():
    assert text_tokens([5, 50257, 6, 50364, 50363, 7], {50257, 50363}, 50364) == [5, 6, 7]
