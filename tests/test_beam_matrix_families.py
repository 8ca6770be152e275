"""The beam matrix's settings on the other families where beams apply (Marian, M2M100, mBART
with the target language forced, decoder-only Llama): HF's hypotheses and scores, and each
beam score equal to HF's teacher-forced, processed log-probs of its tokens. (Mllama's beams
over an image: tests/test_beam_search.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.tests.bart_checkpoints import write_bart_checkpoint
from seq2serve.tests.bart_oracle import LANGS, SOURCES, hf_source_and_forced
from seq2serve.tests.beam_oracle import processors, strip_after_stop, teacher_forced_score
from seq2serve.tests.helpers import hf_model, make_scheduler, request
from seq2serve.tests.test_beam_matrix import CASES, approx

# lp at and above 1, every early_stopping value, penalties and n-gram bans; no
# min_new_tokens (HF counts a forced language token among the new tokens; the scheduler these
# tests drive does not: the TokenizerManager converts, tests/test_bart_cnn.py checks it)
FAMILY_CASES = [CASES[0], CASES[2], CASES[4], CASES[5]]


def _prompts(family: str, path: str):
    """(encoder ids or None, decoder prompt, tokens HF counts as generated, HF's forced bos)."""
    if family == "llama":
        tok = load_tokenizer(path)
        return [(None, tok(p).input_ids, 0, None) for p in
                ("Hello world", "The capital of France is a city that", "1 2 3 4 5 6 7 8")]
    start = ModelConfig.from_path(path).arch.decoder_start_token_id
    source, target = LANGS[family]
    out = []
    for text in SOURCES[:3]:
        ids, forced = hf_source_and_forced(path, family, text, source, target)
        out.append((ids, [start] + ([] if forced is None else [forced]),
                    0 if forced is None else 1, forced))
    return out


def _hf(model, enc, prompt, counted, forced, stops, eos, k, ret, lp, es, ngram, extra,
        max_new):
    gen = dict(num_beams=k, num_return_sequences=ret, length_penalty=lp, early_stopping=es,
               no_repeat_ngram_size=ngram, max_new_tokens=max_new + counted, do_sample=False,
               eos_token_id=eos + stops, output_scores=True, return_dict_in_generate=True,
               **extra)
    with torch.no_grad():
        if enc is None:
            out = model.generate(torch.tensor([prompt]), **gen)
        else:
            out = model.generate(torch.tensor([enc]), forced_bos_token_id=forced,
                                 forced_eos_token_id=None, **gen)
    drop = len(prompt) if enc is None else 1 + counted
    scores = out.sequences_scores.tolist() if k > 1 else [None]
    return [(strip_after_stop(s, eos + stops), sc) for s, sc in
            zip(out.sequences[:, drop:].tolist(), scores)]


@pytest.mark.parametrize("family", ["marian", "m2m100", "mbart", "llama"])
def test_family_beams_match_hf_and_score_their_hypotheses(tmp_path, family):
    if family == "llama":
        from transformers import AutoModelForCausalLM

        from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

        path = str(write_llama_checkpoint(tmp_path / "llama", init_scale=10.0, seed=1,
                                          num_attention_heads=4, num_key_value_heads=2))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    else:
        path = str(write_bart_checkpoint(family, Path(tmp_path) / family, seed=1))
        model = hf_model(path)
    eos = list(ModelConfig.from_path(path).eos_token_ids)
    prompts = _prompts(family, path)
    sched = make_scheduler(path, page_size=4)
    expected, plans = {}, []
    for c, (k, ret, lp, es, ngram, extra, max_new, compete) in enumerate(FAMILY_CASES):
        max_new = max_new // 2  # these models' outputs loop sooner than T5's
        for p, (enc, prompt, counted, forced) in enumerate(prompts):
            stops = []
            if compete:  # a token the model produces: hypotheses end at different lengths
                greedy = _hf(model, enc, prompt, counted, forced, [], eos, 1, 1, 1.0, False,
                             0, {}, 6)[0][0]
                stops = sorted({greedy[min(3, len(greedy) - 1)]} - set(eos))
            rid = f"c{c}p{p}"
            expected[rid] = _hf(model, enc, prompt, counted, forced, stops, eos, k, ret, lp,
                                es, ngram, extra, max_new)
            tr = request(rid, enc or [], prompt, num_beams=k, num_return_sequences=ret,
                         length_penalty=lp, early_stopping=es, no_repeat_ngram_size=ngram,
                         max_new_tokens=max_new, stop_token_ids=stops, **extra)
            tr.decoder_forced = counted
            tr.beam_rids = [rid] + [f"{rid}-{i}" for i in range(1, ret)] if ret > 1 else None
            sched.add_request(tr)
            plans.append((rid, enc, prompt, counted, stops, lp, ngram, extra, max_new))
    got = {}
    while sched.has_work:
        for o in sched.step():
            got[o.rid] = (o.new_token_ids, o.extra["beam_score"])
        sched.check_integrity()
    lengths = set()
    for rid, enc, prompt, counted, stops, lp, ngram, extra, max_new in plans:
        hf_prompt_len = len(prompt) - counted
        procs = processors(hf_prompt_len, eos + stops, max_new + counted, ngram=ngram,
                           repetition_penalty=extra.get("repetition_penalty", 1.0))
        rids = [rid] + [f"{rid}-{i}" for i in range(1, len(expected[rid]))]
        for r, (tokens, score) in zip(rids, expected[rid]):
            assert got[r][0] == tokens, r
            assert got[r][1] == approx(score, 1e-4), r
            forced_score = teacher_forced_score(model, enc, prompt, tokens, procs, lp, counted)
            assert got[r][1] == approx(forced_score, 1e-4), f"{r}: score of its tokens"
            lengths.add(len(tokens))
    assert len(lengths) >= 2, lengths
