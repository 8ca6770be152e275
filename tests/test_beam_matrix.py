"""Beam search against Hugging Face over a matrix of T5 / mT5 configs and settings, with and
without the overlap schedule: the same hypotheses token for token and the same scores, and
every returned hypothesis's `beam_score` equal to HF's teacher-forced, processed log-prob of
its tokens with the length penalty applied (an oracle independent of HF's beam search).

The matrix: relu and gated activations, tied (scaled) and untied heads, an mT5 config,
unequal encoder/decoder depths, sources of 1 to 150 tokens, 16-32 new tokens, 2-5 beams,
num_return_sequences > 1, stop tokens that compete with the running beams (hypotheses of
different lengths), length_penalty below, at and above 1, every early_stopping value,
repetition penalties and n-gram bans. (tests/test_beam_search.py and test_bart_models.py
cover batching, memory and the BART family; this file covers breadth.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.tests.beam_oracle import processors, strip_after_stop, teacher_forced_score
from seq2serve.tests.helpers import T5_CONFIGS, hf_model, make_scheduler, make_t5, request

EOS = 1

# (num_beams, num_return_sequences, length_penalty, early_stopping, no_repeat_ngram_size,
#  extra sampling params, max_new_tokens, stops compete)
CASES = [
    (2, 2, 1.0, False, 0, {}, 16, True),
    (4, 3, 0.6, True, 0, {}, 24, False),
    (5, 2, 1.8, "never", 0, {}, 32, True),
    (3, 3, -0.5, "never", 2, {"min_new_tokens": 4}, 20, True),
    (4, 2, 1.2, False, 3, {"repetition_penalty": 1.3}, 16, False),
    (3, 2, 0.0, True, 0, {"repetition_penalty": 0.8}, 24, True),
]

CONFIGS = ["t5_relu_untied", "t5_gated_tied", "t5_silu_oddheads", "mt5_gated_untied",
           "mt5_hf_saved"]


def write_hf_saved_mt5(path: Path) -> Path:
    """An mT5 checkpoint as transformers 5's `save_pretrained` writes it: config.json says
    tied and has no scale_decoder_outputs (the test writer's hand-made config.json hid that
    MT5ForConditionalGeneration never scales its head), weights scaled so that outputs vary."""
    import math

    from transformers import MT5Config, MT5ForConditionalGeneration

    from seq2serve.runtime.tools.demo_checkpoint import T5_TOKENIZER

    tok = load_tokenizer(str(T5_TOKENIZER))
    cfg = MT5Config(vocab_size=len(tok), d_model=48, d_kv=16, num_heads=3, d_ff=80,
                    num_layers=2, num_decoder_layers=2, feed_forward_proj="gated-gelu",
                    tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0,
                    eos_token_id=EOS)
    torch.manual_seed(11)
    model = MT5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and not any(n in name for n in ("relative", "shared", "lm_head")):
                p.mul_(2.0 / (p.std() * math.sqrt(p.shape[1])))
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def sources(tok) -> list[list[int]]:
    """Sources of 1, ~12, ~45 and 150 tokens."""
    long = tok(" ".join(["the quick brown fox jumps over the lazy dog"] * 30)).input_ids
    return [tok("Hi").input_ids[:1],
            tok("translate English to German: The house is wonderful.").input_ids,
            tok("translate English to French: Where is the train station? I would like to "
                "buy a ticket to Paris, and then find a small hotel near the river for two "
                "nights.").input_ids,
            long[:149] + [EOS]]


@pytest.fixture(scope="module", params=CONFIGS)
def model_path(request, tmp_path_factory) -> str:
    return write_config(request.param, Path(tmp_path_factory.mktemp("matrix")) / request.param)


def write_config(name: str, path: Path) -> str:
    """One of CONFIGS' checkpoints, written to `path`."""
    if name == "mt5_hf_saved":
        return str(write_hf_saved_mt5(path))
    return str(make_t5(path, **T5_CONFIGS[name]))


def approx(score: float, abs_tol: float, rel_tol: float = 1e-5):
    """`abs_tol` (1e-4 on the CPU), or 1e-5 of a large score (length_penalty < 0 multiplies
    the sum by the length's root): float32 noise, HF's own beam scores and teacher-forced
    sums differ by up to 3e-6 of such a score (1.4e-4 at -47)."""
    return pytest.approx(score, abs=abs_tol, rel=rel_tol)


def _hf(path: str, ids: list[int], k, ret, lp, es, ngram, extra, max_new, stops):
    model = hf_model(path)
    # transformers 5 sizes its cache by the encoder's depth: recompute where they differ
    same_depth = model.config.num_layers == model.config.num_decoder_layers
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), num_beams=k, num_return_sequences=ret,
                             length_penalty=lp, early_stopping=es, no_repeat_ngram_size=ngram,
                             max_new_tokens=max_new, do_sample=False, eos_token_id=[EOS, *stops],
                             output_scores=True, return_dict_in_generate=True,
                             use_cache=same_depth, **extra)
    return [(strip_after_stop(seq, [EOS, *stops]), score) for seq, score in
            zip(out.sequences[:, 1:].tolist(), out.sequences_scores.tolist())]


def _competing_stops(path: str, ids: list[int]) -> list[int]:
    """Two tokens this model produces for this source, made to end hypotheses."""
    with torch.no_grad():
        greedy = hf_model(path).generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                         use_cache=False)[0, 1:].tolist()
    return sorted({greedy[3], greedy[7]} - {EOS})


def test_beam_matrix_matches_hf_and_scores_its_hypotheses(model_path):
    check_matrix(model_path, abs_tol=1e-4)


def check_matrix(model_path: str, abs_tol: float, rel_tol: float = 1e-5,
                 **sched_kwargs) -> None:
    """The matrix on one checkpoint (`sched_kwargs`: the device, backend, dtype); the GPU
    check runs it on CUDA in float32."""
    tok = load_tokenizer(model_path)
    srcs = sources(tok)
    model = hf_model(model_path)
    plans, expected = [], {}
    shift = CONFIGS.index(Path(model_path).name)
    for c, (k, ret, lp, es, ngram, extra, max_new, compete) in enumerate(CASES):
        if (c + shift) % 3 == 0:  # each config runs 4 of the cases: each case runs on 3
            continue
        for s in ((c + shift) % 4, (c + shift + 2) % 4):
            ids = srcs[s]
            stops = _competing_stops(model_path, ids) if compete else []
            rid = f"c{c}s{s}"
            plans.append((rid, ids, stops, CASES[c]))
            expected[rid] = _hf(model_path, ids, k, ret, lp, es, ngram, extra, max_new, stops)

    results = []
    for overlap, page_size in ((True, 3), (False, 16)):
        sched = make_scheduler(model_path, page_size=page_size,
                               disable_overlap_schedule=not overlap, **sched_kwargs)
        for rid, ids, stops, (k, ret, lp, es, ngram, extra, max_new, _) in plans:
            tr = request(rid, ids, num_beams=k, num_return_sequences=ret, length_penalty=lp,
                         early_stopping=es, no_repeat_ngram_size=ngram, max_new_tokens=max_new,
                         stop_token_ids=stops, **extra)
            tr.beam_rids = [rid] + [f"{rid}-{i}" for i in range(1, ret)] if ret > 1 else None
            sched.add_request(tr)
        got = {}
        while sched.has_work:
            for o in sched.step():
                got[o.rid] = (o.new_token_ids, o.extra["beam_score"])
            sched.check_integrity()
        results.append(got)
        if overlap and any(c[4] or c[5] for *_, c in plans):  # n-gram bans, penalties
            # their beam rows stayed in the overlap: sampling fields made after the launch
            assert sched.stats()["late_sampling_steps"] > 0
    assert results[0] == results[1], "the overlap schedule changed a result"

    lengths = set()
    for rid, ids, stops, (k, ret, lp, es, ngram, extra, max_new, _) in plans:
        procs = processors(1, [EOS, *stops], max_new, ngram=ngram,
                           repetition_penalty=extra.get("repetition_penalty", 1.0),
                           min_new_tokens=extra.get("min_new_tokens", 0))
        rids = [rid] + [f"{rid}-{i}" for i in range(1, ret)]
        for i, (r, (tokens, score)) in enumerate(zip(rids, expected[rid])):
            got_tokens, got_score = results[0][r]
            assert got_tokens == tokens, f"{r} (hypothesis {i})"
            forced = teacher_forced_score(model, ids, [0], got_tokens, procs, lp)
            assert got_score == approx(score, abs_tol, rel_tol), r
            assert got_score == approx(forced, abs_tol, rel_tol), f"{r}: score of its tokens"
            lengths.add(len(tokens))
    assert len(lengths) >= 3, f"hypotheses should end at different lengths: {lengths}"
