"""Glossaries on `/v1/translations` (issue 42), on the demo model (CPU, a real server and
httpx). The oracle: each output whose source holds a term holds its target term, exactly, as
a whole word; every other output equals the same request's without a glossary, byte for
byte. The demo model writes "1984" as "one thousand nine hundred eighty-four", so the year
readings below are terms it would never write by itself."""

from __future__ import annotations

import json

import httpx
import pytest

from seq2serve.runtime.frontend.glossary import Glossary, holds, load_named, request_glossary
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.server_helpers import ServerProcess

DEMO = str(default_demo_path())
LANGS = {"source_lang": "digits", "target_lang": "English", "max_tokens": 24}
TERMS = {"1984": "nineteen eighty-four", "2026": "twenty twenty-six", "100": "a hundred"}
INPUTS = ["1984", "2026", "100", "12", "77"]  # the last two hold no term


# --- matching, no model --------------------------------------------------------------------
def test_source_terms_match_case_insensitively_as_whole_words_longest_first():
    g = Glossary.of({"New York": "Nueva York", "york": "Yorkshire", "API": "API", "東京": "Tokio"})
    assert g.found("I love new YORK and York.") == ["Nueva York", "Yorkshire"]
    assert g.found("Yorkshire pudding, an APIary") == []  # inside longer words
    assert g.found("the api; 東京に行く") == ["API", "Tokio"]  # no spaces around CJK
    assert holds("in New York.", "New York") and not holds("in new york", "New York")
    assert not holds("forty fivety", "forty five")


@pytest.mark.parametrize("value, needle", [
    (["a"], "must be an object"), ({"a": 1}, "target term of 'a' must be a string"),
    ({"a": " "}, "empty target term"), ({"": "b"}, "empty source term"),
    ({"Car": "Auto", "car": "Wagen"}, "given twice"),
])
def test_bad_glossaries_are_named(value, needle):
    with pytest.raises(ValueError, match=needle) as e:
        request_glossary(value, {})
    assert str(e.value).startswith("glossary")


def test_named_glossaries_load_from_json(tmp_path):
    (tmp_path / "y.json").write_text(json.dumps(TERMS))
    named = load_named(f"years={tmp_path / 'y.json'}")
    assert request_glossary("years", named).terms == TERMS
    with pytest.raises(ValueError, match="not one of this server's glossaries: years"):
        request_glossary("nope", named)
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"--glossary b \(.*bad.json\) must be an object"):
        load_named(f"b={tmp_path / 'bad.json'}")
    with pytest.raises(ValueError, match="NAME=path.json"):
        load_named("no-equals-sign")


# --- through the server --------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("glossary") / "years.json"
    path.write_text(json.dumps(TERMS))
    srv = ServerProcess(DEMO, "--glossary", f"years={path}")
    yield srv
    assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
    assert srv.terminate() == 0, srv.output()


def _translate(srv, body: dict) -> httpx.Response:
    return httpx.post(srv.url + "/v1/translations", json={**LANGS, **body}, timeout=300)


def _check_terms(data: list[dict], plain: list[dict], sources: list[str]) -> None:
    for entry, before, source in zip(data, plain, sources):
        term = TERMS.get(source)
        if term is None:
            assert entry == before  # no term: the output without a glossary, byte for byte
        else:
            assert holds(entry["translation"], term), (source, entry)
            assert not holds(before["translation"], term)  # the model would not write it


@pytest.mark.parametrize("beams", [1, 4])
def test_every_output_holds_its_terms_greedy_and_with_beams(server, beams):
    plain = _translate(server, {"input": INPUTS, "beam_size": beams})
    r = _translate(server, {"input": INPUTS, "beam_size": beams, "glossary": TERMS})
    assert r.status_code == 200, r.text
    _check_terms(r.json()["data"], plain.json()["data"], INPUTS)
    assert r.json()["data"][0]["translation"] == "nineteen eighty-four"


def test_a_named_server_glossary(server):
    plain = _translate(server, {"input": INPUTS})
    r = _translate(server, {"input": INPUTS, "glossary": "years"})
    assert r.status_code == 200, r.text
    _check_terms(r.json()["data"], plain.json()["data"], INPUTS)


def test_each_sentence_of_a_markdown_document_gets_its_own_terms(server):
    doc = "# 1984\n\n- 100\n- 12\n\n2026\n"
    plain = _translate(server, {"input": doc, "format": "markdown"}).json()["data"][0]
    r = _translate(server, {"input": doc, "format": "markdown", "glossary": TERMS})
    assert r.status_code == 200, r.text
    out = r.json()["data"][0]["translation"]
    lines = out.split("\n")
    assert lines[0] == "# nineteen eighty-four"
    assert lines[2].startswith("- ") and holds(lines[2], "a hundred")
    assert lines[3] == plain["translation"].split("\n")[3]  # "12": unchanged
    assert holds(lines[5], "twenty twenty-six") and out.endswith("\n")


@pytest.mark.parametrize("glossary, needle", [
    ([["1984", "x"]], "must be an object"),
    ({"1984": 5}, "target term of '1984' must be a string"),
    ({"1984": ""}, "empty target term"),
    ("nope", "'nope' is not one of this server's glossaries: years"),
    ({"1984": "{nineteen}"}, "'{nineteen}' cannot be written with this model's vocabulary"),
])
def test_bad_glossaries_are_a_400_naming_the_problem(server, glossary, needle):
    r = _translate(server, {"input": INPUTS, "glossary": glossary})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "glossary" and needle in err["message"], err


@pytest.mark.parametrize("extra", [{"stream": True}, {"alternatives": 2},
                                   {"target_prefix": "one"}, {"return_scores": True}])
def test_what_a_glossary_cannot_be_combined_with_is_named(server, extra):
    r = _translate(server, {"input": ["1984"], "glossary": TERMS, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "glossary" and next(iter(extra)) in err["message"], err
