"""Rows whose sampling reads every generated token (repetition penalties, n-gram bans,
frequency penalties) stay in the overlap schedule: their step is launched before the host has
read their last token, and their sampling batch is made once it has (StepLauncher.complete).
Against HF's greedy generate with the same processors (an independent oracle), and against
the same requests with every step waiting (tokens identical, seeded samples included)."""

from __future__ import annotations

import torch

from seq2serve.tests.helpers import SOURCES, hf_model, make_scheduler, request

MAX_NEW = 24


def _hf(path: str, ids: list[int], **processors) -> list[int]:
    with torch.no_grad():
        out = hf_model(path).generate(torch.tensor([ids]), max_new_tokens=MAX_NEW,
                                      do_sample=False, num_beams=1, use_cache=False,
                                      **processors)
    return out[0, 1:].tolist()


def test_penalized_rows_run_ahead_and_match_hf(t5_checkpoints):
    path = t5_checkpoints["t5_relu_untied"]
    from seq2serve.runtime.config.tokenizer import load_tokenizer

    tok = load_tokenizer(path)
    srcs = [tok.encode(s) for s in SOURCES[:4]]
    plans = {
        "rep": (srcs[0], {"repetition_penalty": 1.4}),
        "ngram": (srcs[1], {"no_repeat_ngram_size": 2}),
        "both": (srcs[3], {"repetition_penalty": 0.7, "no_repeat_ngram_size": 3}),
        "plain": (srcs[2], {}),
        "freq": (srcs[0], {"frequency_penalty": 0.8, "presence_penalty": 0.3}),
        "seeded": (srcs[1], {"temperature": 0.9, "seed": 7, "repetition_penalty": 1.2}),
    }
    runs = []
    for overlap in (True, False):
        s = make_scheduler(path, disable_overlap_schedule=not overlap)
        for rid, (ids, params) in plans.items():
            s.add_request(request(rid, ids, max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW,
                                  **params))
        out: dict[str, list[int]] = {}
        while s.has_work:
            for o in s.step():
                out.setdefault(o.rid, []).extend(o.new_token_ids)
            s.check_integrity()
        late = s.stats()["late_sampling_steps"]
        # with the overlap, nearly every decode step was launched ahead and completed late
        assert late > MAX_NEW // 2 if overlap else late == 0
        runs.append(out)
    assert runs[0] == runs[1], "the overlap schedule changed a result"
    for rid in ("rep", "ngram", "both", "plain"):
        ids, params = plans[rid]
        assert runs[0][rid] == _hf(path, ids, min_new_tokens=MAX_NEW, **params), rid
