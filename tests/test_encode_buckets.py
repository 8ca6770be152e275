"""Encoder passes padded to a few token counts (runtime/executor/encode_buckets.py): the sizes
stay few and close above the real count, and a padded pass changes nothing a request sees:
with the padding forced on the CPU (it is on by default only on CUDA), every source's greedy
tokens equal Hugging Face's, for T5 (relative position buckets) and the BART family's Marian
and NLLB (learned and sinusoidal positions, NLLB's counted from the pad id), sources of
different lengths in one pass; a source sent again is served from the encoder cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from seq2serve.models.row_buckets import bucket_rows as bucket_tokens
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.executor.encode_buckets import PAD_SEGMENT
from seq2serve.tests.bart_checkpoints import write_bart_checkpoint
from seq2serve.tests.bart_oracle import hf_generate
from seq2serve.tests.helpers import (
    T5_CONFIGS,
    hf_greedy,
    make_scheduler,
    make_t5,
    request,
    run_to_completion,
)

MAX_NEW = 6


def test_bucket_sizes_are_few_and_close_above():
    seen: dict[int, set[int]] = {}
    for n in range(1, 20000):
        b = bucket_tokens(n)
        assert n <= b < n + max(64, n // 8 + 1), n
        assert bucket_tokens(b) == b  # (a bucket is its own)
        seen.setdefault(n.bit_length(), set()).add(b)
    assert all(len(sizes) <= 9 for sizes in seen.values())  # ~8 an octave
    assert len({bucket_tokens(n) for n in range(1, 20000)}) < 80
    assert bucket_tokens(1000, limit=1010) == 1010 and bucket_tokens(1000, limit=900) == 1000


def _sources(vocab: int, eos: int) -> list[list[int]]:
    """Sources of 3 to 41 tokens (a pass of them pads by 26 tokens: several PAD_SEGMENT-long
    inputs and a shorter one would be needed for larger passes)."""
    lens = [3, 17, 41, 9, 30]
    return [[5 + (7 * i + 3 * j) % (vocab - 10) for j in range(n - 1)] + [eos]
            for i, n in enumerate(lens)]


def _run_padded(path: str, sources: list[list[int]], start: list[int]) -> tuple[dict, list]:
    sched = make_scheduler(path)
    runner = sched.worker.model_runner
    runner.encode_buckets = True
    seen = []
    encode = runner.model.encode

    def counting(eb):
        seen.append((int(eb.token_ids.numel()), list(eb.segment_lens)))
        return encode(eb)

    runner.model.encode = counting
    for i, ids in enumerate(sources):
        sched.add_request(request(f"r{i}", ids, list(start), max_new_tokens=MAX_NEW))
    got = run_to_completion(sched)
    # (the same source again: an encoder-cache hit, its cross K/V those the padded pass wrote)
    sched.add_request(request("again", sources[0], list(start), max_new_tokens=MAX_NEW))
    got.update(run_to_completion(sched))
    return got, seen


@pytest.mark.parametrize("name", ["t5_relu_untied", "mt5_gated_untied"])
def test_padded_t5_passes_give_hfs_tokens(tmp_path, name):
    path = str(make_t5(tmp_path / name, **T5_CONFIGS[name]))
    cfg = ModelConfig.from_path(path)
    sources = _sources(cfg.vocab_size, 1)
    got, seen = _run_padded(path, sources, [0])
    real = sum(map(len, sources))
    assert seen and seen[0][0] == bucket_tokens(real) > real  # (the pass was padded)
    assert seen[0][1][:len(sources)] == [len(s) for s in sources]
    assert all(n <= PAD_SEGMENT for n in seen[0][1][len(sources):])
    for i, ids in enumerate(sources):
        assert got[f"r{i}"] == hf_greedy(path, ids, MAX_NEW), i
    assert got["again"] == got["r0"] and len(seen) == 1  # (no second pass)


@pytest.mark.parametrize("family", ["marian", "nllb"])
def test_padded_bart_family_passes_give_hfs_tokens(tmp_path, family):
    path = str(write_bart_checkpoint(family, Path(tmp_path) / family, seed=3))
    cfg = ModelConfig.from_path(path)
    start = cfg.arch.decoder_start_token_id
    eos = cfg.eos_token_ids[0]
    sources = _sources(cfg.vocab_size - 20, eos)
    got, seen = _run_padded(path, sources, [start])
    assert seen[0][0] == bucket_tokens(sum(map(len, sources)))
    for i, ids in enumerate(sources):
        out, drop = hf_generate(path, ids, None, MAX_NEW, num_beams=1)
        assert got[f"r{i}"] == out[0, drop:].tolist(), i


def test_padding_inputs_stay_within_a_short_position_table(tmp_path):
    """A Marian whose position table holds 24 positions and a pass of 29 tokens padded to 64:
    the 35 padding tokens go in inputs no longer than the pass's longest (17), not one of 35
    (past the table)."""
    path = str(write_bart_checkpoint("marian", Path(tmp_path) / "short", seed=4,
                                     max_position_embeddings=24))
    cfg = ModelConfig.from_path(path)
    sources = [s[-n:] for s, n in zip(_sources(cfg.vocab_size - 20, cfg.eos_token_ids[0]),
                                      [3, 17, 9])]
    got, seen = _run_padded(path, sources, [cfg.arch.decoder_start_token_id])
    assert seen[0][0] == 64 and max(seen[0][1]) == 17
    for i, ids in enumerate(sources):
        out, drop = hf_generate(path, ids, None, MAX_NEW, num_beams=1)
        assert got[f"r{i}"] == out[0, drop:].tolist(), i
