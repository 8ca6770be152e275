"""Source-language detection (issue 42): `source_lang: "auto"` through `Seq2SeqEngine.translate`
and /v1/translations, and /v1/detect, on a tiny random NLLB checkpoint that lists the 20
languages of tests/language_samples.py. The oracle for "the detected source reached the
model" is the same request with the source named: equal output tokens (the engine) or text
(HTTP), while a wrong source or another target changes them."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from seq2serve.runtime.frontend.engine import Seq2SeqEngine
from seq2serve.runtime.frontend.language_detection import DETECTOR, detected_source
from seq2serve.runtime.frontend.languages import TranslationLanguages
from seq2serve.tests.bart_checkpoints import tokenizer_for, write_bart_checkpoint
from seq2serve.tests.language_samples import PARAGRAPHS, cases
from seq2serve.tests.server_helpers import ServerProcess
from seq2serve.tests.timing import within

# each test language's NLLB code (ar: NLLB's Modern Standard Arabic), and one it has no
# language for: Korean
CODES = {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn", "es": "spa_Latn",
         "it": "ita_Latn", "pt": "por_Latn", "nl": "nld_Latn", "sv": "swe_Latn",
         "da": "dan_Latn", "pl": "pol_Latn", "cs": "ces_Latn", "ru": "rus_Cyrl",
         "uk": "ukr_Cyrl", "tr": "tur_Latn", "fi": "fin_Latn", "hu": "hun_Latn",
         "el": "ell_Grek", "ar": "arb_Arab", "zh": "zho_Hans", "ja": "jpn_Jpan"}
KOREAN = "저는 매일 아침 시장에 가서 신선한 채소와 과일을 삽니다. 오늘은 날씨가 정말 좋네요."
KEY = "detect-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SP = {"max_new_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def nllb(tmp_path_factory) -> str:
    root = Path(tmp_path_factory.mktemp("detect"))
    # seed 1: weights whose greedy outputs depend on the source and target tokens
    return str(write_bart_checkpoint("nllb", root / "nllb20", seed=1,
                                     nllb_codes=[*CODES.values(), "zho_Hant"]))


@pytest.fixture(scope="module")
def starting_server(nllb):
    """The server, started on a thread while the engine's test runs: each start is mostly
    single-threaded imports and loading (13 s here), so the two overlap on 2 cores."""
    with ThreadPoolExecutor(1) as pool:
        start = pool.submit(ServerProcess, nllb, "--dtype", "float32", "--api-key", KEY,
                            "--max-document-chars", "4000")
        yield start
        srv = start.result()
        assert srv.proc.poll() is None, "the server died"
        srv.kill()


@pytest.fixture(scope="module")
def server(starting_server) -> ServerProcess:
    return starting_server.result()


def _post(srv, path: str, body, headers=AUTH, timeout: float = 120) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=headers, timeout=timeout)


def _refused(r: httpx.Response, param: str, *words: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and all(w in err["message"] for w in words), err


# --- the engine: the 20-language set, token for token ---------------------------------------
def test_auto_picks_the_source_of_the_20_language_set_as_the_named_source_would(
        nllb, starting_server):
    texts = [text for _, text in cases("paragraph")]
    with Seq2SeqEngine(model_path=nllb, device="cpu", dtype="float32") as engine:
        auto = engine.translate(texts, source_lang="auto", target_lang="fr", sampling_params=SP)
        found = [r["detected_language"] for r in auto]
        right = [d["source_lang"] == CODES[lang] for (lang, _), d in zip(cases(), found)]
        print(f"source_lang auto: {sum(right)}/{len(right)} paragraphs of 20 languages right")
        assert sum(right) >= 95, [(lang, d) for (lang, _), d, ok in zip(cases(), found, right)
                                  if not ok]
        assert all(d["language"] == lang for (lang, _), d, ok in zip(cases(), found, right) if ok)
        assert all(0 < d["confidence"] <= 100 for d in found)
        for lang in ("de", "ja"):  # the same request with the source named
            k = 5 * list(PARAGRAPHS).index(lang)
            named = engine.translate(PARAGRAPHS[lang], source_lang=CODES[lang],
                                     target_lang="fr", sampling_params=SP)
            assert [r["output_ids"] for r in named] == [r["output_ids"]
                                                        for r in auto[k:k + 5]], lang
        german = PARAGRAPHS["de"]
        wrong = engine.translate(german, source_lang="jpn_Jpan", target_lang="fr",
                                 sampling_params=SP)
        spanish = engine.translate(german, source_lang="auto", target_lang="es",
                                   sampling_params=SP)
        de_auto = [r["output_ids"] for r in auto[5:10]]
        assert [r["output_ids"] for r in wrong] != de_auto  # the source token is read
        assert [r["output_ids"] for r in spanish] != de_auto  # and the forced target

        pages = ["<p>Das ist ein <b>kleines</b> Haus am See.</p>",  # the text, not the tags
                 f"<p class='x'>{PARAGRAPHS['ru'][0]}</p>"]
        chunks = list(engine.translate(pages, format="html", source_lang="auto",
                                       target_lang="fr", sampling_params=SP, stream=True))
        firsts = {}
        for c in chunks:
            firsts.setdefault(c["index"], c)
        assert [firsts[i]["detected_language"]["source_lang"] for i in range(2)] == [
            "deu_Latn", "rus_Cyrl"]
        assert sum("detected_language" in c for c in chunks) == 2  # once per document
        with pytest.raises(ValueError, match=r"source_lang 'auto': input\[1\] is in Korean"):
            engine.translate([PARAGRAPHS["de"][1], KOREAN], source_lang="auto",
                             target_lang="fr")
        engine.check_integrity()


def test_detected_languages_become_each_familys_codes(tmp_path):
    """M2M100's "de", mBART-50's "de_DE", an OPUS-MT pair's own source (en -> de: German text
    is a 400 naming it), NLLB's choice for "zh"; a model without languages refuses "auto"."""
    german, english = PARAGRAPHS["de"][0], PARAGRAPHS["en"][0]
    langs = {}
    for family in ("m2m100", "mbart", "marian", "nllb"):
        (tmp_path / family).mkdir()
        langs[family] = TranslationLanguages.of(tokenizer_for(family, tmp_path / family))
    assert detected_source(langs["m2m100"], german, "input[0]")[0] == "de"
    assert detected_source(langs["mbart"], german, "input[0]")[0] == "de_DE"
    code, found = detected_source(langs["marian"], english, "input[0]")
    assert code == "en" and found["language"] == "en" and found["source_lang"] == "en"
    with pytest.raises(ValueError, match=r"input\[0\] is in German \(de, .* from: en$"):
        detected_source(langs["marian"], german, "input[0]")
    assert detected_source(langs["nllb"], PARAGRAPHS["zh"][1], "input[0]")[0] == "zho_Hans"
    with pytest.raises(ValueError, match="lists no languages"):
        detected_source(None, german, "input[0]")
    with pytest.raises(ValueError, match="no words in a language"):
        detected_source(langs["nllb"], "12 345 -- 67", "input[0]")
    assert DETECTOR.rank("https://example.com/12345") == []


# --- HTTP ------------------------------------------------------------------------------------
def test_translations_auto_reports_the_language_and_reaches_the_model(server):
    docs = [PARAGRAPHS["de"][0], PARAGRAPHS["ja"][0], PARAGRAPHS["ru"][2]]
    body = {"input": docs, "target_lang": "fr", "max_tokens": 4}
    r = _post(server, "/v1/translations", {**body, "source_lang": "auto"})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    found = [d["detected_language"] for d in data]
    assert [(f["language"], f["source_lang"]) for f in found] == [
        ("de", "deu_Latn"), ("ja", "jpn_Jpan"), ("ru", "rus_Cyrl")]
    assert all(90 < f["confidence"] <= 100 for f in found)
    named = _post(server, "/v1/translations", {**body, "input": docs[1],
                                               "source_lang": "jpn_Jpan"}).json()["data"][0]
    assert named["translation"] == data[1]["translation"]  # the engine's test checks tokens
    assert "detected_language" not in named

    r = _post(server, "/v1/translations", {**body, "source_lang": "auto", "stream": True})
    events = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]
    firsts = {}
    for e in events:
        firsts.setdefault(e["data"][0]["index"], e["data"][0])
    assert [firsts[i]["detected_language"]["source_lang"] for i in range(3)] == [
        "deu_Latn", "jpn_Jpan", "rus_Cyrl"]
    assert "".join(e["data"][0]["delta"] for e in events
                   if e["data"][0]["index"] == 0) == data[0]["translation"]


@pytest.mark.parametrize("body, param, words", [
    ({"input": [PARAGRAPHS["de"][1], KOREAN]}, "source_lang", ("input[1] is in Korean (ko",
                                                          "does not translate from")),
    ({"input": "12 345"}, "source_lang", ("no words in a language",)),
    ({"input": ""}, "input", ("empty",)),
    ({"input": ["Hallo Welt."] * 1025}, "input", ("max_batch_inputs",)),
])
def test_bad_auto_translations_get_a_400_naming_the_problem(server, body, param, words):
    r = _post(server, "/v1/translations", {"source_lang": "auto", "target_lang": "fr",
                                           "max_tokens": 2, **body})
    _refused(r, param, *words)


def test_detect_answers_as_libretranslate_does(server):
    r = _post(server, "/v1/detect", {"q": PARAGRAPHS["fr"][1]})
    assert r.status_code == 200, r.text
    best = r.json()
    assert best[0]["language"] == "fr" and 90 < best[0]["confidence"] <= 100
    assert [c["confidence"] for c in best] == sorted((c["confidence"] for c in best),
                                                     reverse=True)
    r = _post(server, "/v1/detect", {"q": [PARAGRAPHS["sv"][0], "42 !", PARAGRAPHS["uk"][1]],
                                     "api_key": ""})
    assert [[c["language"] for c in ranked][:1] for ranked in r.json()] == [["sv"], [], ["uk"]]
    assert _post(server, "/v1/detect", {"q": "Hallo"}, headers={}).status_code == 401
    _refused(_post(server, "/v1/detect", {"q": "Hallo", "api_key": KEY}), "api_key",
             "Authorization")
    _refused(_post(server, "/v1/detect", {"q": ["Hallo", " "]}), "q", "q[1] is empty")
    _refused(_post(server, "/v1/detect", {"q": []}), "q", "empty list")
    _refused(_post(server, "/v1/detect", {"q": ["Hallo"] * 1025}), "q", "max_batch_inputs")
    _refused(_post(server, "/v1/detect", {"q": "Hallo " * 700}), "q", "4200 characters",
             "max_document_chars")


def test_detect_keeps_the_event_loop_free(server):
    """1,000 texts of 2,400-3,100 characters (a 3 MB body, parsed by a worker process;
    detected on a thread) while /health is polled."""
    raw = json.dumps({"q": [(PARAGRAPHS["it"][i % 5] + " ") * 30 for i in range(1000)]})
    done = []

    def send():
        done.append(httpx.post(server.url + "/v1/detect", content=raw, timeout=120,
                               headers={**AUTH, "Content-Type": "application/json"}))

    thread = threading.Thread(target=send)
    thread.start()
    health = []
    while thread.is_alive():
        t0 = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        health.append(time.monotonic() - t0)
        time.sleep(0.01)
    thread.join()
    assert done[0].status_code == 200, done[0].text[:300]
    assert all(ranked[0]["language"] == "it" for ranked in done[0].json())
    assert max(health) < within(1.0), sorted(health)[-5:]
