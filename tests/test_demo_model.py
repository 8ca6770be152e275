"""The bundled demo model (models/assets/demo-t5-numbers, trained by scripts/train_demo.py)
gives correct answers through the real server and through Seq2SeqEngine: numbers it was
never trained on, checked against the independent reference in tests/number_words.py."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

import seq2serve.models
from seq2serve import Seq2SeqEngine
from seq2serve.tests.number_words import held_out_numbers, is_held_out, number_to_words
from seq2serve.tests.server_helpers import ServerProcess

MODEL = Path(seq2serve.models.__file__).resolve().parent / "assets" / "demo-t5-numbers"
LANGS = {"source_lang": "digits", "target_lang": "English"}
# the script's held-out split; negative numbers too, which the model was trained on as well
NUMBERS = held_out_numbers(240, seed=3, negative_fraction=0.1)


def test_reference_words():
    cases = {0: "zero", 7: "seven", 13: "thirteen", 20: "twenty", 42: "forty-two",
             100: "one hundred", 101: "one hundred one", 1984: "one thousand nine hundred "
             "eighty-four", 20005: "twenty thousand five", 100000: "one hundred thousand",
             999999: "nine hundred ninety-nine thousand nine hundred ninety-nine",
             -42: "negative forty-two", 1_000_000: "one million"}
    for n, words in cases.items():
        assert number_to_words(n) == words
    assert len(NUMBERS) == len(set(NUMBERS)) == 240
    assert all(is_held_out(n) for n in NUMBERS)
    assert any(n < 0 for n in NUMBERS) and any(0 <= n < 1000 for n in NUMBERS)


def test_bundled_files():
    names = {p.name for p in MODEL.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "seq2serve.json", "README.md"} <= names
    cfg = json.loads((MODEL / "config.json").read_text())
    assert cfg["architectures"] == ["T5ForConditionalGeneration"]
    assert (cfg["decoder_start_token_id"], cfg["pad_token_id"], cfg["eos_token_id"]) == (0, 0, 1)
    assert cfg["vocab_size"] == 32128 and cfg["feed_forward_proj"] == "gated-gelu"
    assert cfg["tie_word_embeddings"] is True and cfg["scale_decoder_outputs"] is True
    assert (MODEL / "model.safetensors").stat().st_size <= 8_000_000
    template = json.loads((MODEL / "seq2serve.json").read_text())["translation_template"]
    assert template.format(text="1984", **LANGS) == "translate digits to English: 1984"


def test_held_out_numbers_through_the_server():
    srv = ServerProcess(str(MODEL))
    try:
        data = []
        for i in range(0, len(NUMBERS), 120):  # two batched requests
            r = httpx.post(srv.url + "/v1/translations", timeout=120.0, json={
                "input": [str(n) for n in NUMBERS[i:i + 120]], **LANGS,
                "max_tokens": 40, "temperature": 0})
            assert r.status_code == 200, r.text
            data += r.json()["data"]
        assert srv.terminate() == 0, srv.output()
    finally:
        srv.kill()
    assert len(data) == len(NUMBERS)
    got = {n: d["translation"] for n, d in zip(NUMBERS, data)}
    wrong = {n: t for n, t in got.items() if t != number_to_words(n)}
    assert all(d["finish_reason"] == "stop" for d in data)  # EOS, not max_tokens
    assert len(wrong) <= 0.05 * len(NUMBERS), f"{len(wrong)} wrong: {wrong}"


def test_engine_translate():
    inputs = ["1984", "42", "0", "100000", "-7"]
    with Seq2SeqEngine(model_path=str(MODEL), device="cpu") as engine:
        out = engine.translate(inputs, **LANGS,
                               sampling_params={"max_new_tokens": 32, "temperature": 0})
    assert [o["text"] for o in out] == [number_to_words(int(s)) for s in inputs]
    assert all(o["meta_info"]["finish_reason"]["type"] == "stop" for o in out)
