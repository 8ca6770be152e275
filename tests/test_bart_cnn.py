"""BART summarization (`BartForConditionalGeneration`, bart-large-cnn's generation settings)
against HF's `generate` in float32, through the engine: greedy and 4 beams with
`no_repeat_ngram_size`, `length_penalty`, the forced BOS and EOS and `min_length` of the
checkpoint's generation_config.json, and `min_new_tokens` counted as HF counts it (the forced
BOS is one of its new tokens)."""

from __future__ import annotations

import pytest
import torch

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.tests.bart_cnn_checkpoints import GENERATION, SOURCES, write_bart_cnn_checkpoint
from seq2serve.tests.helpers import hf_model

MAX_NEW = 12  # ours: after the forced BOS; HF's count it (MAX_NEW + 1)
BEAMS = {k: GENERATION[k] for k in ("num_beams", "length_penalty", "no_repeat_ngram_size",
                                    "early_stopping")}


@pytest.fixture(scope="module", params=["cnn", "scaled_untied"])
def checkpoint(request, tmp_path_factory):
    return str(write_bart_cnn_checkpoint(request.param, tmp_path_factory.mktemp(request.param),
                                         seed=1))


def _hf(path: str, ids: list[int], **gen) -> tuple[list[int], float | None]:
    model = hf_model(path)
    with torch.no_grad():  # generation_config.json applies: forced BOS/EOS, min_length
        out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW + 1, do_sample=False,
                             output_scores=True, return_dict_in_generate=True, **gen)
    seq = out.sequences[0].tolist()
    assert seq[:2] == [GENERATION["decoder_start_token_id"], GENERATION["forced_bos_token_id"]]
    seq = seq[2:]
    if GENERATION["eos_token_id"] in seq:  # a beam's sequence is padded after its EOS
        seq = seq[: seq.index(GENERATION["eos_token_id"]) + 1]
    score = out.sequences_scores[0].item() if gen.get("num_beams", 1) > 1 else None
    return seq, score


def test_the_checkpoint_is_read_as_bart(checkpoint):
    mc = ModelConfig.from_path(checkpoint)
    assert mc.architecture == "BartForConditionalGeneration"
    assert mc.forced_bos_token_id == 0 and mc.forced_eos_token_ids == (2,)
    assert mc.generation_min_length == GENERATION["min_length"]


def test_greedy_beams_and_min_new_tokens_give_hfs_tokens(checkpoint):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    sources = [tok(s).input_ids for s in SOURCES]
    cases = [  # (ours, HF's)
        ({"no_repeat_ngram_size": 3}, {"num_beams": 1, "no_repeat_ngram_size": 3}),
        (BEAMS, BEAMS),
        # min_new_tokens replaces min_length (HF), above or below it
        ({"min_new_tokens": 11, "no_repeat_ngram_size": 3}, {"num_beams": 1, "min_new_tokens": 11}),
        ({"min_new_tokens": 3, "no_repeat_ngram_size": 3}, {"num_beams": 1, "min_new_tokens": 3}),
    ]
    lengths = set()
    with Seq2SeqEngine(model_path=checkpoint, device="cpu", dtype="float32") as engine:
        for ours, hf in cases:
            got = engine.generate(input_ids=sources,
                                  sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0,
                                                   **ours})
            for ids, res in zip(sources, got):
                tokens, score = _hf(checkpoint, ids, **hf)
                assert res["output_ids"] == tokens, (ours, ids)
                if score is not None:
                    assert res["meta_info"]["beam_score"] == pytest.approx(score, abs=1e-4)
                assert tokens[-1] == GENERATION["eos_token_id"]
                lengths.add(len(tokens))
    # both length rules decided some output: min_length's first allowed EOS (2 prompt tokens:
    # start and BOS) and the forced EOS at the length limit
    assert GENERATION["min_length"] - 1 in lengths and MAX_NEW in lengths
    assert min(lengths) < GENERATION["min_length"] - 1  # and min_new_tokens 3 replaced it
