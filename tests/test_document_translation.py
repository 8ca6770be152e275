"""Documents through `/v1/translations` and `Seq2SeqEngine.translate` (issue 42), on the demo
model (CPU). The oracle for a document: the parts it was built from (tests/document_samples.py)
and, for each text part, the model's own answer to it alone (`/v1/completions` on the
translation template, greedy): the translated document must be its structure, byte for byte
and in order, around those answers."""

from __future__ import annotations

import html
import json
import time

import httpx
import pytest

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.frontend.documents.document_pieces import document_pieces
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.beam_oracle import greedy_log_prob, scored_generate
from seq2serve.tests.document_samples import (
    html_sample,
    join_sentences,
    markdown_sample,
    repeated_documents,
)
from seq2serve.tests.helpers import hf_model
from seq2serve.tests.server_helpers import ServerProcess
from seq2serve.tests.timing import within

DEMO = str(default_demo_path())
LANGS = {"source_lang": "digits", "target_lang": "English"}
MAX_TOKENS = 12
PROMPT = "translate digits to English: {}"  # the demo model's template (seq2serve.json)


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(DEMO)
    yield srv
    assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
    assert srv.terminate() == 0, srv.output()


@pytest.fixture(scope="module")
def tight():
    """A server whose prompts are at most 24 tokens and documents 2,000 characters."""
    srv = ServerProcess(DEMO, "--max-prompt-tokens", "24", "--max-document-chars", "2000")
    yield srv
    assert srv.terminate() == 0, srv.output()


def _translate(srv, body: dict, timeout: float = 300) -> httpx.Response:
    return httpx.post(srv.url + "/v1/translations", timeout=timeout,
                      json={**LANGS, "max_tokens": MAX_TOKENS, **body})


def _oracle(srv, texts: list[str]) -> dict[str, str]:
    """Each text's translation on its own: the template's prompt as a plain completion."""
    distinct = list(dict.fromkeys(texts))
    out = {}
    for i in range(0, len(distinct), 1000):
        chunk = distinct[i:i + 1000]
        r = httpx.post(srv.url + "/v1/completions", timeout=300, json={
            "prompt": [PROMPT.format(t) for t in chunk], "max_tokens": MAX_TOKENS,
            "temperature": 0})
        assert r.status_code == 200, r.text
        out.update(zip(chunk, (c["text"] for c in r.json()["choices"])))
    return out


def _stats(srv) -> dict:
    return httpx.get(srv.url + "/debug/stats").json()


# --- every text node translated, the structure byte for byte -----------------------------------
def test_a_5000_word_markdown_document(server):
    d = markdown_sample(5000)
    assert d.words() >= 5000
    r = _translate(server, {"input": d.document, "format": "markdown"})
    assert r.status_code == 200, r.text
    [data] = r.json()["data"]
    oracle = _oracle(server, d.texts)
    assert data["translation"] == d.translated(lambda text: oracle[text])
    assert data["finish_reason"] in ("stop", "length")
    for kind, value in d.parts:  # the structure is there, in order, by construction above;
        if kind == "text":       # and no text part came back untranslated
            assert oracle[value] != value


def test_an_html_page_with_nested_tags(server):
    d = html_sample()
    r = _translate(server, {"input": d.document, "format": "html"})
    assert r.status_code == 200, r.text
    oracle = _oracle(server, [html.unescape(t) for t in d.texts])
    expected = d.translated(lambda raw: html.escape(oracle[html.unescape(raw)], quote=False))
    assert r.json()["data"][0]["translation"] == expected
    for untouched in ("<script>", "/* Not text. */", "<pre><code>code 1. Not text &amp; more",
                      'data-title="Section 1. Not text"', "Brand 1. Not text.", "<!-- comment",
                      "<code>inline_1()</code>", 'href="/page?x=1&amp;y=2"'):
        assert untouched in expected


def test_the_engine_translates_documents_as_the_server_does(server):
    doc = markdown_sample(120).document
    page = html_sample(1).document
    body = {"input": [doc, page, "1984"], "format": "markdown"}
    over_http = [x["translation"] for x in _translate(server, body).json()["data"]]
    with Seq2SeqEngine(model_path=DEMO, device="cpu") as engine:
        out = engine.translate([doc, page, "1984"], **LANGS, format="markdown",
                               sampling_params={"max_new_tokens": MAX_TOKENS, "temperature": 0})
        assert [o["text"] for o in out] == over_http
        assert out[0]["meta_info"]["pieces"] > 10
        assert out[2]["text"] == "one thousand nine hundred eighty-four"  # as before documents
        assert "pieces" not in out[2]["meta_info"]  # a short input's own result
        chunks = list(engine.translate(doc, **LANGS, format="markdown", stream=True,
                                       sampling_params={"max_new_tokens": MAX_TOKENS,
                                                        "temperature": 0}))
        assert "".join(c["text"] for c in chunks) == over_http[0]
        assert [c["meta_info"]["finish_reason"] is not None for c in chunks].count(True) == 1


# --- one batch, one encoder pass per distinct sentence -----------------------------------------
def test_200_documents_with_repeats_in_one_call(server):
    docs, sentences = repeated_documents(200, repeat_share=0.3)
    every = [s for ss in sentences for s in ss]
    distinct = set(every)
    assert 1 - len(distinct) / len(every) >= 0.25  # about 30 % of the sentences repeat
    assert httpx.post(server.url + "/flush_cache").json() == {"flushed": True}
    before = _stats(server)
    r = _translate(server, {"input": docs})
    assert r.status_code == 200, r.text
    after = _stats(server)
    # each distinct sentence was encoded once: the repeats were not sent again
    assert after["encoder_inputs"] - before["encoder_inputs"] == len(distinct)
    metrics = httpx.get(server.url + "/metrics").text
    assert f"seq2serve_encoder_inputs {float(after['encoder_inputs'])}" in metrics
    # the first 40 documents against each sentence translated alone (all 200 would double
    # the test's time for no more coverage: every document goes the same way)
    oracle = _oracle(server, [s for ss in sentences[:40] for s in ss])
    for mine, data in zip(sentences[:40], r.json()["data"]):
        assert data["translation"] == join_sentences([oracle[s] for s in mine])


# --- streams -----------------------------------------------------------------------------------
def test_documents_stream_in_order_and_concatenate_to_the_whole(server):
    docs = [markdown_sample(400).document, "# Only a heading 7", "1984"]
    whole = [x["translation"] for x in
             _translate(server, {"input": docs, "format": "markdown"}).json()["data"]]
    texts = {i: "" for i in range(len(docs))}
    finishes = {i: 0 for i in range(len(docs))}
    with httpx.stream("POST", server.url + "/v1/translations", timeout=300, json={
            **LANGS, "max_tokens": MAX_TOKENS, "input": docs, "format": "markdown",
            "stream": True}) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        event = json.loads(line[6:])
        assert event["object"] == "translation.chunk"
        [d] = event["data"]
        assert finishes[d["index"]] == 0, "a delta after the document's finish"
        texts[d["index"]] += d["delta"]
        finishes[d["index"]] += d["finish_reason"] is not None
    assert [texts[i] for i in range(len(docs))] == whole
    assert all(n == 1 for n in finishes.values())


def test_a_client_that_leaves_a_document_stream_aborts_its_sentences(server):
    """Left alone, the document's ~500 sampled sentences run for about 5 s more."""
    doc = markdown_sample(5000).document
    with httpx.Client(timeout=httpx.Timeout(5.0)) as c:
        with c.stream("POST", server.url + "/v1/translations", json={
                **LANGS, "max_tokens": 128, "input": doc, "format": "markdown",
                "stream": True, "temperature": 2.0, "seed": 3}) as r:
            assert r.status_code == 200
            next(r.iter_bytes())  # the first event; then hang up
    start, limit = time.monotonic(), within(1.5)
    while (s := _stats(server))["running_requests"] or s["waiting_requests"]:
        assert time.monotonic() - start < limit, s
        time.sleep(0.05)


# --- sentences over the input limit, documents over the size limit -----------------------------
def test_a_sentence_over_the_input_limit_is_cut_at_clauses(tight):
    sentence = ("In 1984 we had 12 boxes, 34 letters and 56 maps; in 1999 we had 78 ships, "
                "90 roads, 11 towers, 35 clocks and 17 stones; in 2024 we had 13 lamps, "
                "57 songs and 91 cards")
    tok = load_tokenizer(DEMO)
    prompt_tokens = len(tok(PROMPT.format(sentence)).input_ids)
    assert prompt_tokens > 24
    whole = httpx.post(tight.url + "/v1/completions", json={
        "prompt": PROMPT.format(sentence), "max_tokens": 4}, timeout=60)
    assert whole.status_code == 400 and "max_prompt_tokens" in whole.text  # too long as one
    r = _translate(tight, {"input": f"First 5. {sentence}. Last 6."})
    assert r.status_code == 200, r.text

    def fits(text: str) -> bool:
        return len(tok(PROMPT.format(text)).input_ids) <= 24

    doc = f"First 5. {sentence}. Last 6."
    pieces = document_pieces(doc, "text", "en", fits)
    middle = [p for p in pieces if p.start >= doc.index(sentence)][:-1]
    assert len(middle) >= 3 and all(fits(p.text) for p in pieces)
    assert middle[0].start == doc.index(sentence) and middle[-1].end == doc.index(". Last") + 1
    for a, b in zip(middle, middle[1:]):  # cut after a clause's comma or semicolon
        assert doc[a.end - 1] in ",;" and not doc[a.end:b.start].strip()
    assert {doc[p.end - 1] for p in middle[:-1]} == {",", ";"}  # semicolons first, then commas
    oracle = _oracle(tight, [p.text for p in pieces])
    expected, pos = [], 0
    for p in pieces:
        expected += [doc[pos:p.start], oracle[p.text]]
        pos = p.end
    assert r.json()["data"][0]["translation"] == "".join(expected) + doc[pos:]


def test_a_document_over_the_size_limit_is_refused_naming_it(tight):
    ok = _translate(tight, {"input": "7. " * 666 + "12"})  # 2,000 characters
    assert ok.status_code == 200, ok.text
    r = _translate(tight, {"input": ["5", "7. " * 667], "format": "markdown"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "input" and "max_document_chars" in err["message"]
    assert "input[1] is 2001 characters" in err["message"]


@pytest.mark.parametrize("body, needle", [
    ({"input": "x", "format": "rst"}, "format"),
    ({"input": "x", "format": "html", "beam_size": 2, "stream": True}, "stream cannot"),
    ({"input": ["x"] * 1025, "format": "markdown"}, "max_batch_inputs"),
    ({"input": " ".join(f"Line {i}." for i in range(1100))}, "1100 sentences to translate"),
    ({"input": "5 6", "source_lang": "auto"}, "lists no languages"),  # T5: a prompt template
])
def test_bad_document_requests_get_a_400(server, body, needle):
    r = _translate(server, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] or needle == err.get("param"), err


# --- alternatives, target prefixes, scores (M2M100 through the engine: test_bart_models.py) -
def test_alternatives_and_a_prefix_are_hfs_beams_with_decoder_input_ids(server):
    tok = load_tokenizer(DEMO)
    r = _translate(server, {"input": ["1984", "77"], "alternatives": 3, "return_scores": True,
                            "target_prefix": ["one thousand", ""]})
    assert r.status_code == 200, r.text
    body = r.json()
    prefix = tok("one thousand", add_special_tokens=False).input_ids
    for data, text, decoder in zip(body["data"], ["1984", "77"], [[0] + prefix, None]):
        out = scored_generate(hf_model(DEMO), tok(PROMPT.format(text)).input_ids, decoder,
                              num_beams=3, num_return_sequences=3, max_new_tokens=MAX_TOKENS)
        expected = [tok.decode(s[1:], skip_special_tokens=True) for s in out.sequences]
        alts = data["alternatives"]
        assert [a["translation"] for a in alts] == expected
        assert [a["score"] for a in alts] == pytest.approx(out.sequences_scores.tolist(),
                                                           abs=1e-4)
        assert (data["translation"], data["score"]) == (alts[0]["translation"], alts[0]["score"])
    assert all(a["translation"].startswith("one thousand ")
               for a in body["data"][0]["alternatives"])
    assert len({a["translation"] for a in body["data"][1]["alternatives"]}) == 3
    # each input's prompt counted once, not once per alternative
    assert body["usage"]["prompt_tokens"] == sum(
        len(tok(PROMPT.format(t)).input_ids) for t in ("1984", "77"))


def test_a_greedy_prefix_and_its_score_streamed_and_whole(server):
    tok = load_tokenizer(DEMO)
    body = {"input": " 1984 ", "target_prefix": "one thousand nine", "return_scores": True}
    whole = _translate(server, body)
    assert whole.status_code == 200, whole.text
    [data] = whole.json()["data"]
    prefix = tok("one thousand nine", add_special_tokens=False).input_ids
    out = scored_generate(hf_model(DEMO), tok(PROMPT.format("1984")).input_ids, [0] + prefix,
                          num_beams=1, max_new_tokens=MAX_TOKENS)
    # the whitespace around the sentence kept, the prefix detokenized with the rest
    assert data["translation"] == f" {tok.decode(out.sequences[0, 1:], skip_special_tokens=True)} "
    assert data["score"] == pytest.approx(greedy_log_prob(out, 1 + len(prefix)), abs=1e-4)
    assert "alternatives" not in data
    with httpx.stream("POST", server.url + "/v1/translations", timeout=120,
                      json={**LANGS, "max_tokens": MAX_TOKENS, **body, "stream": True}) as s:
        events = [json.loads(line[6:])["data"][0] for line in s.iter_lines()
                  if line.startswith("data: {")]
    assert "".join(e["delta"] for e in events) == data["translation"]
    first = next(e["delta"] for e in events if e["delta"].strip())
    assert first.strip().startswith("one thousand nine")  # the prefix comes first, whole
    assert [e.get("score") for e in events][-1] == pytest.approx(data["score"], abs=1e-6)
    assert all("score" not in e for e in events[:-1])


@pytest.mark.parametrize("body, param, needle", [
    ({"alternatives": 0}, "alternatives", "[1, 32]"),
    ({"alternatives": 33}, "alternatives", "[1, 32]"),
    ({"alternatives": True}, "alternatives", ""),
    ({"alternatives": "2"}, "alternatives", ""),
    ({"alternatives": 2, "stream": True}, "alternatives", "stream"),
    ({"alternatives": 2, "format": "markdown"}, "alternatives", "markdown"),
    ({"alternatives": 2, "temperature": 0.7}, "alternatives", "temperature"),
    ({"alternatives": 2, "input": "1984. 77."}, "alternatives", "input[0] is 2 pieces"),
    ({"alternatives": 32, "input": ["5"] * 33}, "alternatives", "1056 rows"),
    ({"target_prefix": ["one", "two"]}, "target_prefix", "2 entries for 1 inputs"),
    ({"target_prefix": [1]}, "target_prefix", ""),
    ({"target_prefix": "one", "format": "html"}, "target_prefix", "html"),
    ({"target_prefix": "one", "input": "5. 6."}, "target_prefix", "2 pieces"),
    ({"target_prefix": "x" * 20_000}, "target_prefix", "context length"),
    ({"return_scores": "yes"}, "return_scores", ""),
    ({"num_return_sequences": 2}, "num_return_sequences", "alternatives"),
])
def test_bad_values_are_a_400_naming_the_field(server, body, param, needle):
    r = _translate(server, {"input": "1984", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and needle in err["message"], err
