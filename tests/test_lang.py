"""The frontend language (seq2serve.lang): programs with gen, select, roles and fork give the
same results in-process and over HTTP; select's scores are HF's summed float32 log-probs
(within 1e-4) and it picks HF's best choice; gen is HF's greedy text; run_batch of 64
programs is continuously batched; streaming, errors."""

from __future__ import annotations

import httpx
import pytest
import torch

from seq2serve import Seq2SeqEngine
from seq2serve import lang as sl
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint
from seq2serve.tests.helpers import hf_greedy, hf_model
from seq2serve.tests.server_helpers import ServerProcess

TOL = 1e-4
LABELS = ["positive", "negative", "neutral", "it is hard to say"]


@pytest.fixture(scope="module")
def t5_engine(t5_dir):
    with Seq2SeqEngine(model_path=t5_dir, device="cpu", page_size=4) as engine:
        yield engine


@pytest.fixture(scope="module")
def t5_server(t5_dir):
    srv = ServerProcess(t5_dir, "--page-size", "4")
    try:
        yield srv
        assert httpx.get(srv.url + "/debug/integrity").json()["ok"]
        assert srv.terminate() == 0, srv.output()
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def t5_backends(t5_engine, t5_server):
    http = sl.RuntimeEndpoint(t5_server.url)
    yield {"engine": sl.EngineBackend(t5_engine), "http": http}
    http.close()


@sl.function
def classify(s, text):
    s += "sst2 sentence: " + text
    s += sl.select("label", choices=LABELS)
    s += sl.select("label_mean", choices=LABELS, choices_method="mean")


@sl.function
def multi_step(s, text):
    s += "summarize: " + text
    s += sl.gen("summary", max_tokens=6, temperature=0, ignore_eos=True)
    s += " Is it good? "
    s += sl.select("verdict", choices=["yes", "no"])
    forks = s.fork(3)
    for f, lang in zip(forks, ["German", "French", "Romanian"]):
        f += f" translate English to {lang}: " + text
        f += sl.gen("translation", max_tokens=5, temperature=0, ignore_eos=True)
    forks.join()


def hf_choice_logprobs(path: str, source: str, choice: str) -> list[float]:
    """HF's log-probs of a choice's tokens (with </s>) as T5's whole decoder output."""
    tok = load_tokenizer(path)
    enc, dec = tok(source).input_ids, [0] + tok(choice).input_ids
    with torch.no_grad():
        logits = hf_model(path)(input_ids=torch.tensor([enc]),
                                decoder_input_ids=torch.tensor([dec])).logits[0]
    lp = torch.log_softmax(logits.float(), dim=-1)
    return [lp[p - 1, dec[p]].item() for p in range(1, len(dec))]


def test_t5_select_is_hf_scoring(t5_dir, t5_engine, t5_backends):
    text = "the film was a delight from start to finish"
    source = "sst2 sentence: " + text
    sums = torch.tensor([sum(hf_choice_logprobs(t5_dir, source, c)) for c in LABELS])
    means = torch.tensor([sum(v) / len(v) for v in
                          (hf_choice_logprobs(t5_dir, source, c) for c in LABELS)])
    assert len(set(sums.tolist())) == len(LABELS)
    for name, backend in t5_backends.items():
        before = t5_engine.stats() if name == "engine" else None
        s = classify.run(text=text, backend=backend)
        if before is not None:  # each select (4 choices): one extend, one encoded input
            after = t5_engine.stats()
            assert (after["forwards_by_mode"]["extend"]
                    - before["forwards_by_mode"].get("extend", 0)) == 2
            assert after["encoder_forwards"] - before["encoder_forwards"] == 2
            assert after["encoder_cache_entries"] - before["encoder_cache_entries"] == 2
        meta = s.get_meta_info("label")
        torch.testing.assert_close(torch.tensor(meta["scores"]), sums, atol=TOL, rtol=0)
        torch.testing.assert_close(torch.tensor(meta["normalized_scores"]), means, atol=TOL,
                                   rtol=0)
        assert s["label"] == LABELS[int(sums.argmax())], name
        assert s["label_mean"] == LABELS[int(means.argmax())], name
        assert s.text() == source + s["label"] + s["label_mean"]


def test_programs_agree_over_engine_and_http_and_with_hf(t5_dir, t5_backends):
    tok = load_tokenizer(t5_dir)
    text = "studies have shown that owning a dog is good for you"
    results = {}
    for name, backend in t5_backends.items():
        s = multi_step.run(text=text, backend=backend)
        results[name] = (s.text(), s.variables())
        # gen decodes from the state as the encoder input: HF's greedy text
        ids = hf_greedy(t5_dir, tok("summarize: " + text).input_ids, 6)
        assert s["summary"] == tok.decode(ids, skip_special_tokens=True)
        assert s["verdict"] in ("yes", "no")
        assert len(s["translation"]) == 3  # gathered from the three branches
        for lang, got in zip(["German", "French", "Romanian"], s["translation"]):
            source = ("summarize: " + text + s["summary"] + " Is it good? " + s["verdict"]
                      + f" translate English to {lang}: " + text)
            ids = hf_greedy(t5_dir, tok(source).input_ids, 5)
            assert got == tok.decode(ids, skip_special_tokens=True), lang
    assert results["engine"] == results["http"]


def test_streamed_text_is_the_text(t5_backends):
    @sl.function
    def story(s):
        s += "translate English to German: The house is wonderful and the garden is big."
        s += sl.gen("out", max_tokens=10, temperature=0, ignore_eos=True)

    texts = {}
    for name, backend in t5_backends.items():
        state = story.run(backend=backend, stream=True)
        pieces = list(state.text_iter("out"))
        assert len(pieces) > 1, name  # token by token
        assert "".join(pieces) == state["out"]
        assert state.text().endswith(state["out"])
        texts[name] = state.text()
        assert story.run(backend=backend).text() == texts[name]
        # read at once from this thread: waits for the program, not just what it appended yet
        assert story.run(backend=backend, stream=True)["out"] == state["out"]
    assert texts["engine"] == texts["http"]


def test_run_batch_of_64_programs_is_continuously_batched(t5_engine):
    @sl.function
    def tag(s, i):
        s += f"translate English to German: item number {i} is here"
        s += sl.gen("out", max_tokens=4 + i % 5, temperature=0, ignore_eos=True)
        s += sl.select("label", choices=["yes", "no"])

    before = t5_engine.stats()
    states = tag.run_batch([{"i": i} for i in range(64)], backend=t5_engine)
    after = t5_engine.stats()
    assert all(s.error is None for s in states)
    alone = [tag.run(i=i, backend=t5_engine) for i in (0, 17, 63)]
    assert [s.variables() for s in alone] == [states[i].variables() for i in (0, 17, 63)]
    extends = after["forwards_by_mode"]["extend"] - before["forwards_by_mode"].get("extend", 0)
    assert extends < 64, "each program's requests were not batched with the others"
    assert after["max_batch_by_mode"]["extend"] > 8
    assert after["max_batch_by_mode"]["decode"] > 8
    t5_engine.check_integrity()


ANSWER = "(yes|no)( (yes|no)){0,2}"
LIST = {"type": "array", "items": {"enum": ["yes", "no"]}, "minItems": 1, "maxItems": 3}


def test_gen_follows_a_regex_or_a_json_schema(t5_engine, t5_backends):
    """gen(regex=...) and gen(json_schema=...) through the runtime's grammars (issue 41), on
    an encoder-decoder model, over the engine and HTTP; a schema the T5 vocabulary cannot
    write (an object: no braces) is a ValueError naming it."""
    import json
    import re

    import jsonschema

    @sl.function
    def constrained(s):
        s += "question: is it raining in Paris today?"
        s += sl.gen("answer", max_tokens=20, temperature=0, regex=ANSWER)
        s += sl.gen("list", max_tokens=30, temperature=0, json_schema=json.dumps(LIST))

    @sl.function
    def an_object(s):
        s += "hello"
        s += sl.gen("x", max_tokens=10, json_schema='{"type": "object"}')

    for backend in t5_backends.values():
        state = constrained.run(backend=backend)
        assert state.error is None and re.fullmatch(ANSWER, state["answer"]), state["answer"]
        jsonschema.validate(json.loads(state["list"]), LIST)
        with pytest.raises(ValueError, match="json_schema cannot be written"):
            an_object.run(backend=backend)
    t5_engine.check_integrity()


def test_bad_programs_say_what_is_wrong(t5_engine, t5_backends):
    with pytest.raises(ValueError, match="non-empty list of choices"):
        sl.select("x", choices=[])
    with pytest.raises(ValueError, match="choices_method"):
        sl.select("x", choices=["a"], choices_method="max")

    @sl.function
    def with_image(s):
        s += sl.user(sl.image(b"not an image") + "What is it?")

    @sl.function
    def too_long(s):
        s += "hello"
        s += sl.gen("x", max_tokens=10**6)
        s += sl.gen("never")

    for backend in t5_backends.values():
        with pytest.raises(ValueError, match="takes no images"):
            with_image.run(backend=backend)
        with pytest.raises(ValueError, match="max_new_tokens"):
            too_long.run(backend=backend)
    t5_engine.check_integrity()


# --- Llama: the state is the decoder prompt, with the chat template's role markers ----------
@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return str(write_llama_checkpoint(tmp_path_factory.mktemp("llama") / "m", seed=1,
                                      init_scale=10.0))


@sl.function
def chat(s, question):
    s += sl.system("You are brief.")
    s += sl.user(question)
    s += sl.assistant(sl.gen("answer", max_tokens=6, temperature=0, ignore_eos=True))
    s += sl.user("Is that right?")
    s += sl.assistant(sl.select("ok", choices=["Yes, it is.", "No", "Maybe so"]))


def test_llama_chat_program_is_hf(llama_dir):
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(llama_dir)
    hf = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    srv = ServerProcess(llama_dir)
    try:
        with Seq2SeqEngine(model_path=llama_dir, device="cpu") as engine:
            states = {name: chat.run(question="What is the capital of France?", backend=b)
                      for name, b in (("engine", engine), ("http", sl.RuntimeEndpoint(srv.url)))}
            s = states["engine"]
            # the roles are the chat template's: the first turn is engine.chat's prompt
            first = engine.chat([{"role": "system", "content": "You are brief."},
                                 {"role": "user", "content": "What is the capital of France?"}],
                                sampling_params={"max_new_tokens": 6, "temperature": 0,
                                                 "ignore_eos": True})
            assert s["answer"] == first["text"]
            assert [m["role"] for m in s.messages()] == ["system", "user", "assistant", "user",
                                                         "assistant"]
            engine.check_integrity()
        assert states["http"].text() == s.text()
        assert states["http"].get_meta_info("ok")["scores"] == pytest.approx(
            s.get_meta_info("ok")["scores"], abs=TOL)
    finally:
        srv.kill()
    # select: HF's summed log-probs of each choice after the prompt (the state before it)
    prompt = s.text()[: -len(s["ok"]) - len("<|eot_id|>")]
    head = tok(prompt).input_ids
    sums = []
    for choice in ["Yes, it is.", "No", "Maybe so"]:
        ids = head + tok(choice, add_special_tokens=False).input_ids
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
        sums.append(sum(lp[p - 1, ids[p]].item() for p in range(len(head), len(ids))))
    torch.testing.assert_close(torch.tensor(s.get_meta_info("ok")["scores"]),
                               torch.tensor(sums), atol=TOL, rtol=0)
    assert s["ok"] == ["Yes, it is.", "No", "Maybe so"][max(range(3), key=sums.__getitem__)]


@pytest.mark.parametrize("path, body, needle", [
    ("/generate", {"text": "x", "logprob_start_len": 1}, "needs return_logprob"),
    ("/generate", {"text": "x", "return_logprob": True, "logprob_start_len": 7,
                   "decoder_input_ids": [0, 5]}, "past the decoder input's 2 tokens"),
    ("/generate", {"text": "x", "return_logprob": True, "logprob_start_len": -3}, "-1"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 0, "num_beams": 2}},
     "num_beams > 1 needs max_new_tokens >= 1"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "x", "model": "nope"}, "not found"),
])
def test_bad_scoring_and_tokenize_requests_get_a_4xx(t5_server, path, body, needle):
    r = httpx.post(t5_server.url + path, json=body, timeout=60)
    assert 400 <= r.status_code < 500 and needle in r.json()["error"]["message"], r.text
