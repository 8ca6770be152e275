"""The BART-family translation models (Marian / OPUS-MT, M2M100, NLLB-200, mBART-50) against
Hugging Face in float32 on tiny random checkpoints with real SentencePiece tokenizers: greedy
and beam search token for token (beam scores too), with the target language as HF's forced
first token; target-language routing through the engine and /v1/translations; and a
translation's alternatives, target prefix and scores through the engine (the same over HTTP
on the demo T5: tests/test_document_translation.py)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import openai
import pytest
import torch

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.frontend.engine import Seq2SeqEngine
from seq2serve.runtime.frontend.languages import TranslationLanguages
from seq2serve.tests.bart_checkpoints import CORPUS, write_bart_checkpoint
from seq2serve.tests.bart_oracle import (
    FAMILIES,
    LANGS,
    MAX_NEW,
    SOURCES,
    hf_generate,
    hf_source_and_forced,
)
from seq2serve.tests.beam_oracle import greedy_log_prob, scored_generate, strip_after_stop
from seq2serve.tests.helpers import hf_model, make_scheduler, request, run_to_completion
from seq2serve.tests.server_helpers import ServerProcess


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = Path(tmp_path_factory.mktemp("bart"))
    return {f: str(write_bart_checkpoint(f, root / f, seed=i)) for i, f in enumerate(FAMILIES)}


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_hf_with_the_routed_languages(ckpt, family):
    path = ckpt[family]
    langs = TranslationLanguages.of(load_tokenizer(path))
    source, target = LANGS[family]
    start = ModelConfig.from_path(path).arch.decoder_start_token_id
    sched = make_scheduler(path, page_size=4)
    expected = {}
    for i, text in enumerate(SOURCES):
        ids, forced = hf_source_and_forced(path, family, text, source, target)
        # the router gives the tokenizer's own source ids and HF's forced token for "de"/"fr"
        code = langs.resolve(target)
        assert langs.source_ids(text, langs.resolve(source, "source_lang"), code) == ids
        assert langs.forced_tokens(code) == ([] if forced is None else [forced])
        sched.add_request(request(f"r{i}", ids, [start] + langs.forced_tokens(code),
                                  max_new_tokens=MAX_NEW))
        out, drop = hf_generate(path, ids, forced, MAX_NEW, num_beams=1)
        expected[f"r{i}"] = out[0, drop:].tolist()
    got = run_to_completion(sched)
    assert got == expected
    assert len({tuple(v) for v in got.values()}) >= 3, "outputs should differ by source"
    if family == "marian":
        pad = ModelConfig.from_path(path).arch.pad_token_id
        assert all(pad not in v for v in got.values())


@pytest.mark.parametrize("family", ["marian", "mbart"])
def test_a_regex_holds_on_the_bart_family(ckpt, family):
    """Grammar-constrained decoding (issue 41) on encoder-decoder models with SentencePiece
    vocabularies (a piece's word boundary is a space in the text): every output, greedy and
    with 3 beams, is the regex's (`re.fullmatch` of the detokenized text)."""
    import re

    path = ckpt[family]
    tok = load_tokenizer(path)
    langs = TranslationLanguages.of(tok)
    source, target = LANGS[family]
    code = langs.resolve(target)
    start = ModelConfig.from_path(path).arch.decoder_start_token_id
    pattern = "[a-z]{2,6}( [a-z]{2,6}){0,3}"
    sched = make_scheduler(path, page_size=4)
    for i, text in enumerate(SOURCES[:3]):
        ids, _ = hf_source_and_forced(path, family, text, source, target)
        for beams in (1, 3):
            sched.add_request(request(f"r{i}b{beams}", ids, [start] + langs.forced_tokens(code),
                                      max_new_tokens=40, num_beams=beams, regex=pattern))
    got = run_to_completion(sched)
    assert len(got) == 6
    for rid, out in got.items():
        text = tok.decode(out, skip_special_tokens=True)
        assert re.fullmatch(pattern, text), (rid, text)


def _strip(tokens: list[int], stops) -> list[int]:
    end = next((i for i, t in enumerate(tokens) if t in stops), len(tokens) - 1)
    return tokens[:end + 1]


@pytest.mark.parametrize("family", FAMILIES)
def test_beams_match_hf_counting_the_forced_token_as_hf_does(ckpt, family):
    """HF counts the forced target token as generated in the length penalty: with
    length_penalty 0.7 a score off by one token in the length differs at once."""
    path = ckpt[family]
    source, target = LANGS[family]
    eos = set(ModelConfig.from_path(path).eos_token_ids)
    start = ModelConfig.from_path(path).arch.decoder_start_token_id
    sched = make_scheduler(path, page_size=4)
    expected = {}
    for i, text in enumerate(SOURCES[:3]):
        ids, forced = hf_source_and_forced(path, family, text, source, target)
        greedy, drop = hf_generate(path, ids, forced, MAX_NEW, num_beams=1)
        stop = greedy[0, drop + 2].item()  # a token these weights produce: hypotheses end early
        out, drop = hf_generate(path, ids, forced, MAX_NEW, num_beams=3, num_return_sequences=2,
                                length_penalty=0.7, eos_token_id=sorted(eos | {stop}),
                                output_scores=True, return_dict_in_generate=True)
        hyps = [(_strip(s, eos | {stop}), score) for s, score in
                zip(out.sequences[:, drop:].tolist(), out.sequences_scores.tolist())]
        tr = request(f"b{i}", ids, [start] + ([] if forced is None else [forced]),
                     num_beams=3, num_return_sequences=2, length_penalty=0.7,
                     max_new_tokens=MAX_NEW, stop_token_ids=[stop])
        tr.beam_rids, tr.decoder_forced = [f"b{i}", f"b{i}-1"], 0 if forced is None else 1
        sched.add_request(tr)
        expected[f"b{i}"], expected[f"b{i}-1"] = hyps
    got = {}
    while sched.has_work:
        for o in sched.step():
            got[o.rid] = (o.new_token_ids, o.extra["beam_score"])
        sched.check_integrity()
    for rid, (tokens, score) in expected.items():
        assert got[rid][0] == tokens, rid
        assert got[rid][1] == pytest.approx(score, abs=1e-4), rid


@pytest.fixture(scope="module")
def m2m100_engine(ckpt):
    with Seq2SeqEngine(model_path=ckpt["m2m100"], device="cpu", dtype="float32") as engine:
        yield engine
        engine.check_integrity()


def test_engine_routes_mixed_targets_and_encodes_a_repeated_source_once(ckpt, m2m100_engine):
    path, engine = ckpt["m2m100"], m2m100_engine
    a, b = CORPUS[0], CORPUS[1]
    targets = ["de", "__fr__", "zho", "German"]  # ISO 639-1, M2M100's, ISO 639-3, a name
    codes = ["de", "fr", "zh", "de"]
    assert engine.flush_cache()
    before = engine.stats()["encoder_inputs"]
    out = engine.translate([a, a, a, b], source_lang="en", target_lang=targets,
                           sampling_params={"max_new_tokens": 6, "temperature": 0},
                           beam_size=1)
    for r, text, code in zip(out, [a, a, a, b], codes):
        ids, forced = hf_source_and_forced(path, "m2m100", text, "en", code)
        hf, drop = hf_generate(path, ids, forced, 6, num_beams=1)
        assert r["output_ids"] == hf[0, drop:].tolist()
    assert len({tuple(r["output_ids"]) for r in out[:3]}) == 3  # three languages
    # a's encoder ran once for 3 targets
    assert engine.stats()["encoder_inputs"] - before == 2
    with pytest.raises(ValueError, match=r"target_lang 'xx'.* ast, az, "):
        engine.translate(a, source_lang="en", target_lang="xx")
    with pytest.raises(ValueError, match="source_lang 'Klingon'"):
        engine.translate(a, source_lang="Klingon", target_lang="de")
    assert {d["code"] for d in engine.languages} >= set(codes)
    engine.check_integrity()


def test_alternatives_with_and_without_a_target_prefix_in_one_call(ckpt, m2m100_engine):
    """`translate(alternatives=3, target_prefix=[prefix, ""])` against HF's generate: the
    first source with the prefix (HF: decoder_input_ids [start, __fr__, *prefix], where no
    token of the prompt counts in the length penalty), the second without (HF: its
    forced_bos_token_id, which counts). length_penalty 0.7 and a stop token the weights
    produce make hypotheses of unequal lengths, so a length counted wrong shows in the
    scores."""
    path, engine = ckpt["m2m100"], m2m100_engine
    tok = load_tokenizer(path)
    model = hf_model(path)
    eos = set(ModelConfig.from_path(path).eos_token_ids)
    start = ModelConfig.from_path(path).arch.decoder_start_token_id
    texts = [CORPUS[0], CORPUS[2]]
    sources = [hf_source_and_forced(path, "m2m100", t, "en", "fr") for t in texts]
    greedy = scored_generate(model, sources[0][0], None, forced_bos_token_id=sources[0][1],
                             max_new_tokens=MAX_NEW + 1, num_beams=1)
    stop = int(greedy.sequences[0, 4])  # a token these weights produce: hypotheses end early
    prefix = tok("La maison", add_special_tokens=False).input_ids
    got = engine.translate(texts, source_lang="en", target_lang="fr", beam_size=1,
                           alternatives=3, target_prefix=["La maison", ""],
                           sampling_params={"max_new_tokens": MAX_NEW, "length_penalty": 0.7,
                                            "stop_token_ids": [stop]})
    hf = {"num_beams": 3, "num_return_sequences": 3, "length_penalty": 0.7,
          "eos_token_id": sorted(eos | {stop})}
    with_prefix = scored_generate(model, sources[0][0], [start, sources[0][1]] + prefix,
                                  max_new_tokens=MAX_NEW, **hf)
    without = scored_generate(model, sources[1][0], None, forced_bos_token_id=sources[1][1],
                              max_new_tokens=MAX_NEW + 1, **hf)
    for result, out, lead in zip(got, [with_prefix, without], [2 + len(prefix), 2]):
        # ours: the prefix's tokens and the generated ones (HF's: after start and language)
        expected = [s[2:lead].tolist() + strip_after_stop(s[lead:].tolist(), eos | {stop})
                    for s in out.sequences]
        alts = result["alternatives"]
        assert [a["output_ids"] for a in alts] == expected
        assert [a["score"] for a in alts] == pytest.approx(out.sequences_scores.tolist(),
                                                           abs=1e-4)
        assert [a["text"] for a in alts] == [tok.decode(e, skip_special_tokens=True)
                                             for e in expected]
        assert result["output_ids"] == alts[0]["output_ids"]
        assert result["score"] == alts[0]["score"] == alts[0]["meta_info"]["beam_score"]
    assert all(a["text"].startswith("La maison") for a in got[0]["alternatives"])


def test_a_greedy_target_prefix_and_its_score(ckpt, m2m100_engine):
    path = ckpt["m2m100"]
    tok = load_tokenizer(path)
    start = ModelConfig.from_path(path).arch.decoder_start_token_id
    ids, forced = hf_source_and_forced(path, "m2m100", CORPUS[1], "en", "fr")
    prefix = tok("Où est", add_special_tokens=False).input_ids
    got = m2m100_engine.translate(CORPUS[1], source_lang="en", target_lang="fr", beam_size=1,
                                  target_prefix="Où est", return_scores=True,
                                  sampling_params={"max_new_tokens": MAX_NEW,
                                                   "temperature": 0})
    out = scored_generate(hf_model(path), ids, [start, forced] + prefix,
                          max_new_tokens=MAX_NEW, num_beams=1)
    assert got["output_ids"] == out.sequences[0, 2:].tolist()  # batch 1: no padding
    assert got["text"] == tok.decode(got["output_ids"], skip_special_tokens=True)
    assert got["text"].startswith("Où est")
    assert got["score"] == pytest.approx(greedy_log_prob(out, 2 + len(prefix)), abs=1e-4)
    assert "output_token_logprobs" not in got["meta_info"]  # asked for the score only


def test_translations_endpoint_routes_languages_and_names_the_choices(ckpt):
    path = ckpt["marian"]  # an OPUS-MT pair: en -> de only
    tok = load_tokenizer(path)
    server = ServerProcess(path, "--dtype", "float32")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        models = client.models.list().model_dump()["data"]
        assert [d["code"] for d in models[0]["languages"]] == ["de"]
        body = {"input": SOURCES[:2], "source_lang": "English", "target_lang": "de",
                "max_tokens": 6, "beam_size": 1}
        r = httpx.post(server.url + "/v1/translations", json=body, timeout=60)
        assert r.status_code == 200, r.text
        for d, text in zip(r.json()["data"], SOURCES[:2]):
            hf, drop = hf_generate(path, tok(text).input_ids, None, 6, num_beams=1)
            assert d["translation"] == tok.decode(hf[0, drop:], skip_special_tokens=True)
        bad = httpx.post(server.url + "/v1/translations",
                         json={**body, "target_lang": ["de", "fr"]}, timeout=60)
        assert bad.status_code == 400
        err = bad.json()["error"]
        assert err["param"] == "target_lang" and "'fr'" in err["message"]
        assert "supports: de" in err["message"]
        wrong_source = httpx.post(server.url + "/v1/translations",
                                  json={**body, "source_lang": "fr"}, timeout=60)
        assert wrong_source.status_code == 400
        assert wrong_source.json()["error"]["param"] == "source_lang"
        assert httpx.get(server.url + "/debug/integrity", timeout=30).status_code == 200
    finally:
        server.kill()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="CPU engine test; on a GPU see test_triton_kernels.py")
def test_triton_backend_matches_torch_native(ckpt):
    """The Triton kernels (interpreted) on mBART's head sizes (8 in the encoder, 16 in the
    decoder), no position bias, with a decoder prompt of two tokens (start and the target
    language) running the extend kernel over several positions."""
    family = "mbart"
    path = ckpt[family]
    tok = load_tokenizer(path)
    start = ModelConfig.from_path(path).arch.decoder_start_token_id
    prompt = [start, tok.convert_tokens_to_ids("de_DE")]

    def run(backend: str) -> dict[str, list[int]]:
        sched = make_scheduler(path, attention_backend=backend, page_size=4)
        for i, text in enumerate(SOURCES[:2]):
            sched.add_request(request(f"r{i}", tok(text).input_ids, prompt, max_new_tokens=4))
        return run_to_completion(sched)

    assert run("triton") == run("torch_native")


def test_languages_of_a_multi_target_opus_mt_and_of_nllb(tmp_path, ckpt):
    """OPUS-MT multi-target models read the target as a ">>code<<" token at the start of the
    source (the tokenizer's own handling of it is the oracle); NLLB picks its own code for a
    macrolanguage and keeps the others reachable by their codes."""
    from seq2serve.tests.bart_checkpoints import _marian_tokenizer

    tok = _marian_tokenizer(tmp_path, targets=("deu", "fra", "spa"))
    langs = TranslationLanguages.of(tok)
    assert langs.codes == [">>deu<<", ">>fra<<", ">>spa<<"]
    for asked in ("fr", "fra", "French", ">>fra<<"):
        assert langs.resolve(asked) == ">>fra<<"
    text = CORPUS[0]
    assert langs.source_ids(text, "en", ">>fra<<") == tok(f">>fra<< {text}").input_ids
    assert langs.source_ids(text, "en", ">>fra<<")[0] == tok.convert_tokens_to_ids(">>fra<<")
    assert langs.forced_tokens(">>fra<<") == []
    with pytest.raises(ValueError, match=r"'it'.*>>deu<< \(de\), >>fra<< \(fr\), >>spa<<"):
        langs.resolve("it")

    nllb = TranslationLanguages.of(load_tokenizer(ckpt["nllb"]))
    assert nllb.resolve("zh") == "zho_Hans" and nllb.resolve("zho_Hant") == "zho_Hant"
    assert nllb.resolve("Spanish") == "spa_Latn" and nllb.resolve(" deu ") == "deu_Latn"
    names = {d["code"]: d["name"] for d in nllb.describe()}
    assert names["deu_Latn"] == "German" and names["zho_Hant"] == "Chinese"


def test_target_prefix_tokens_are_hfs_target_text_tokens(ckpt, tmp_path):
    """A target prefix is tokenized as HF's `tokenizer(text_target=...)` tokenizes it (the
    oracle: a fresh tokenizer, switched), by a tokenizer that is never switched: for an
    OPUS-MT pair whose target SentencePiece model differs from its source one too."""
    import json

    import sentencepiece as spm
    from transformers import MarianTokenizer

    from seq2serve.tests.bart_checkpoints import train_spm

    texts = ["La maison", "Où est la gare ?", "Das Haus ist wunderbar."]
    for family in FAMILIES:
        oracle = load_tokenizer(ckpt[family])
        if family != "marian":
            oracle.tgt_lang = LANGS[family][1]
        expected = oracle(text_target=texts, add_special_tokens=False).input_ids
        langs = TranslationLanguages.of(load_tokenizer(ckpt[family]))
        assert langs.target_ids_many(texts) == expected, family
    models = {"source.spm": train_spm("unigram", 80, pad_id=-1, bos_id=-1, eos_id=-1, unk_id=0),
              "target.spm": train_spm("bpe", 60, pad_id=-1, bos_id=-1, eos_id=-1, unk_id=0)}
    vocab = {"</s>": 0, "<unk>": 1}
    for name, model in models.items():
        (tmp_path / name).write_bytes(model)
        sp = spm.SentencePieceProcessor(model_proto=model)
        for i in range(sp.get_piece_size()):
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))

    def marian() -> MarianTokenizer:
        return MarianTokenizer(*(str(tmp_path / f) for f in models), str(tmp_path / "vocab.json"),
                               source_lang="en", target_lang="de")

    tok = marian()
    got = TranslationLanguages.of(tok).target_ids_many(texts)
    assert got == marian()(text_target=texts, add_special_tokens=False).input_ids
    assert got != tok(texts, add_special_tokens=False).input_ids  # the source model's pieces


def test_a_models_forced_bos_starts_generate_without_a_decoder_prompt(ckpt):
    """generation_config.json's forced_bos_token_id (a one-to-many mBART: German) follows the
    start token when a caller gives no decoder prompt, as in HF's generate."""
    path = ckpt["mbart"]
    tok = load_tokenizer(path)
    ids = tok(CORPUS[0]).input_ids
    with torch.no_grad():
        hf = hf_model(path).generate(torch.tensor([ids]), max_new_tokens=7, do_sample=False,
                                     num_beams=1, forced_eos_token_id=None)
    assert hf[0, 1].item() == tok.convert_tokens_to_ids("de_DE")
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32") as engine:
        out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 6,
                                                              "temperature": 0})
        assert out["output_ids"] == hf[0, 2:].tolist()
        engine.check_integrity()


def test_checkpoint_problems_are_named(ckpt, tmp_path):
    """A missing tensor is named as HF names it; an unknown one too; a config the model
    cannot serve says why."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from seq2serve.models.bart.config import BartConfig
    from seq2serve.models.loader import load_model

    path = tmp_path / "mbart"
    shutil.copytree(ckpt["mbart"], path)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.decoder.layers.1.encoder_attn.k_proj.bias"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing.*model\.decoder\.layers\.1\.encoder_attn"
                                         r"\.k_proj\.bias"):
        load_model(ModelConfig.from_path(str(path)), "cpu", torch.float32)
    tensors["model.decoder.layers.1.encoder_attn.k_proj.bias"] = torch.zeros(32)
    tensors["model.decoder.layers.1.adapter.weight"] = torch.zeros(2)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.decoder\.layers\.1\.adapter"):
        load_model(ModelConfig.from_path(str(path)), "cpu", torch.float32)
    hf = json.loads((path / "config.json").read_text())
    with pytest.raises(ValueError, match="separate source and target vocabularies"):
        BartConfig.from_hf({**hf, "decoder_vocab_size": hf["vocab_size"] + 1})
    with pytest.raises(ValueError, match="d_model 32 is not a multiple of decoder_attention"):
        BartConfig.from_hf({**hf, "decoder_attention_heads": 3})
