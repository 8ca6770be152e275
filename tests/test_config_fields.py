"""Config fields the code must read, not assume, against Hugging Face in float32: M2M100's
position rows from its pad id (every released checkpoint has pad id 1, so `2 + count` looked
right), mBART's fixed offset whatever its pad id, and the forced EOS that OPUS-MT, mBART and
M2M100 checkpoints ship (HF's generate ends a length-limited output with it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.tests.bart_checkpoints import write_bart_checkpoint
from seq2serve.tests.bart_oracle import LANGS, SOURCES, hf_source_and_forced
from seq2serve.tests.beam_oracle import strip_after_stop
from seq2serve.tests.helpers import hf_model, make_scheduler, request

MAX_NEW = 8


def _expected(path: str, family: str, max_new: int, **gen) -> tuple[dict, list]:
    """HF's outputs for each source (its generation_config.json applied, forced EOS
    included), and the requests that ask the same of the scheduler."""
    cfg = ModelConfig.from_path(path)
    start, eos = cfg.arch.decoder_start_token_id, set(cfg.eos_token_ids)
    source, target = LANGS[family]
    expected, reqs = {}, []
    for i, text in enumerate(SOURCES):
        ids, forced = hf_source_and_forced(path, family, text, source, target)
        extra = 0 if forced is None else 1
        with torch.no_grad():
            out = hf_model(path).generate(torch.tensor([ids]), max_new_tokens=max_new + extra,
                                          forced_bos_token_id=forced, do_sample=False,
                                          output_scores=True, return_dict_in_generate=True,
                                          **gen)
        seqs = out.sequences[:, 1 + extra:].tolist()
        scores = (out.sequences_scores.tolist() if gen.get("num_beams", 1) > 1
                  else [None] * len(seqs))
        expected[f"r{i}"] = [(strip_after_stop(s, eos), sc) for s, sc in zip(seqs, scores)]
        reqs.append((f"r{i}", ids, [start] + ([] if forced is None else [forced]), extra))
    return expected, reqs


def _run(path: str, reqs, max_new: int, **sampling) -> dict:
    ret = sampling.get("num_return_sequences", 1)
    sched = make_scheduler(path, page_size=4)
    for rid, ids, prompt, forced in reqs:
        tr = request(rid, ids, prompt, max_new_tokens=max_new, **sampling)
        tr.decoder_forced = forced
        if ret > 1:
            tr.beam_rids = [rid] + [f"{rid}-{i}" for i in range(1, ret)]
        sched.add_request(tr)
    got = {}
    while sched.has_work:
        for o in sched.step():
            got.setdefault(o.rid, []).append((o.new_token_ids, o.extra.get("beam_score")))
        sched.check_integrity()
    return got


def _check(expected: dict, got: dict, beams: bool) -> None:
    for rid, hyps in expected.items():
        rids = [rid] + [f"{rid}-{i}" for i in range(1, len(hyps))]
        for r, (tokens, score) in zip(rids, hyps):
            if beams:
                (out, beam_score), = got[r]
                assert out == tokens, r
                assert beam_score == pytest.approx(score, abs=1e-4), r
            else:
                assert [t for toks, _ in got[r] for t in toks] == tokens, r


@pytest.mark.parametrize("family", ["m2m100", "mbart"])
def test_a_pad_id_other_than_1_gives_hfs_positions(tmp_path, family):
    """M2M100's rows are pad id + 1 + count (HF's padding_idx + 1 + cumsum); mBART's learned
    table is offset by 2 whatever the pad id."""
    path = str(write_bart_checkpoint(family, Path(tmp_path) / family, seed=0, pad_token_id=0))
    assert ModelConfig.from_path(path).arch.pad_token_id == 0
    expected, reqs = _expected(path, family, 12, num_beams=1)
    got = _run(path, reqs, 12)
    _check(expected, got, beams=False)
    assert len({tuple(v[0][0]) for v in expected.values()}) >= 3, "outputs should differ"
    expected, reqs = _expected(path, family, 12, num_beams=3, num_return_sequences=2,
                               length_penalty=0.7)
    got = _run(path, reqs, 12, num_beams=3, num_return_sequences=2, length_penalty=0.7)
    _check(expected, got, beams=True)


@pytest.mark.parametrize("family", ["marian", "mbart"])
def test_the_models_forced_eos_ends_a_length_limited_output(tmp_path, family):
    """HF forces forced_eos_token_id as the last token at max_new_tokens, scored 0 in a
    beam; greedy and beam outputs end with it as HF's do."""
    eos = 0 if family == "marian" else 2
    path = str(write_bart_checkpoint(family, Path(tmp_path) / family, seed=2,
                                     forced_eos_token_id=eos))
    assert ModelConfig.from_path(path).forced_eos_token_ids == (eos,)
    expected, reqs = _expected(path, family, MAX_NEW, num_beams=1)
    got = _run(path, reqs, MAX_NEW)
    _check(expected, got, beams=False)
    assert any(len(h[0][0]) == MAX_NEW and h[0][0][-1] == eos for h in expected.values()), \
        "some output should reach max_new_tokens and end with the forced EOS"
    expected, reqs = _expected(path, family, MAX_NEW, num_beams=3, num_return_sequences=2)
    got = _run(path, reqs, MAX_NEW, num_beams=3, num_return_sequences=2)
    _check(expected, got, beams=True)
