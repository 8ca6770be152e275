"""Florence-2's task answers (runtime/frontend/florence_answers.py) against HF transformers, on
a tiny random checkpoint whose tokenizer has the answers' `<loc_*>` tokens (random weights
generate them often): the text keeps them as HF's `batch_decode(..., skip_special_tokens=False)`
does, less BOS/EOS/pad, and `parsed` is HF's `post_process_generation` of it for the image's
size; an explicit skip_special_tokens is obeyed; a checkpoint without a processor gets no
parse. Over HTTP: /generate, and /v1/chat/completions with the openai client (the answer as
HF's, the parse as `message.task_answer`, what Florence-2 cannot answer a 400 naming it)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from seq2serve import Seq2SeqEngine
from seq2serve.tests.florence2_checkpoints import write_florence2_checkpoint

MAX_NEW = 16
SAMPLING = {"max_new_tokens": MAX_NEW, "temperature": 0, "no_repeat_ngram_size": 3}
# (prompt, decoding): HF's Florence-2 examples decode with num_beams=3
CASES = [("<OD>", {}), ("<OCR_WITH_REGION>", {}), ("<CAPTION_TO_PHRASE_GROUNDING> a cat", {}),
         ("<REGION_PROPOSAL>", {"num_beams": 3})]
IMAGE = Image.fromarray((np.random.RandomState(0).rand(30, 50, 3) * 255).astype("uint8"))


@pytest.fixture(scope="module")
def florence(tmp_path_factory):
    from transformers import AutoProcessor, Florence2ForConditionalGeneration

    path = str(write_florence2_checkpoint("tied", tmp_path_factory.mktemp("answers"),
                                          eos_boost=2.5, answer_tokens=True))
    processor = AutoProcessor.from_pretrained(path)
    model = Florence2ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32") as engine:
        yield engine, processor, model, path


def _task(prompt: str) -> str:
    return prompt.split(">")[0] + ">"


@torch.no_grad()
def _hf(processor, model, prompt: str, **case) -> torch.Tensor:
    inputs = processor(text=prompt, images=IMAGE, return_tensors="pt")
    return model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False,
                          no_repeat_ngram_size=3, **case)


def test_answers_keep_loc_tokens_and_parse_as_hf(florence):
    engine, processor, model, _ = florence
    tok = processor.tokenizer
    drop = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    boxes = 0
    for prompt, case in CASES:
        got = engine.generate(prompt=prompt, image_data=[IMAGE],
                              sampling_params={**SAMPLING, **case})
        generated_ids = _hf(processor, model, prompt, **case)
        assert got["output_ids"] == [t for t in generated_ids[0, 1:].tolist()
                                     if t != tok.pad_token_id], prompt
        # HF's example: decode keeping special tokens; here less BOS, EOS and pad
        kept = [[t for t in generated_ids[0].tolist() if t not in drop]]
        want = processor.batch_decode(kept, skip_special_tokens=False)[0]
        assert got["text"] == want and "<loc_" in want, prompt
        task = _task(prompt)
        parsed = processor.post_process_generation(want, task=task, image_size=IMAGE.size)
        assert got["parsed"] == parsed, prompt
        # the same as HF's parse of its own text (BOS/EOS and all)
        raw = processor.batch_decode(generated_ids, skip_special_tokens=False)[0]
        assert parsed == processor.post_process_generation(raw, task=task,
                                                           image_size=IMAGE.size)
        answer = parsed[task]
        boxes += len(answer.get("bboxes", answer.get("quad_boxes", [])))
    assert boxes  # some answer located something


def test_streamed_answer_is_the_same(florence):
    engine, *_ = florence
    whole = engine.generate(prompt="<OD>", image_data=[IMAGE], sampling_params=SAMPLING)
    chunks = list(engine.generate(prompt="<OD>", image_data=[IMAGE], sampling_params=SAMPLING,
                                  stream=True))
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert chunks[-1]["parsed"] == whole["parsed"]
    assert all("parsed" not in c for c in chunks[:-1])


def test_engine_chat_is_generate(florence):
    """Seq2SeqEngine.chat: one user message with an image and a task token is that task."""
    engine, *_ = florence
    whole = engine.generate(prompt="<OD>", image_data=[IMAGE], sampling_params=SAMPLING)
    chat = engine.chat([{"role": "user", "content": [{"type": "image", "image": IMAGE},
                                                     {"type": "text", "text": "<OD>"}]}],
                       sampling_params=SAMPLING)
    assert (chat["text"], chat["parsed"]) == (whole["text"], whole["parsed"])


def test_an_explicit_skip_special_tokens_is_obeyed(florence):
    engine, processor, *_ = florence
    skip = engine.generate(prompt="<OD>", image_data=[IMAGE],
                           sampling_params={**SAMPLING, "skip_special_tokens": True})
    assert "<loc_" not in skip["text"] and "parsed" not in skip
    keep = engine.generate(prompt="<OD>", image_data=[IMAGE],
                           sampling_params={**SAMPLING, "skip_special_tokens": False})
    assert keep["text"] == processor.tokenizer.decode(keep["output_ids"],
                                                      skip_special_tokens=False)
    assert "parsed" not in keep
    # a prompt of token ids names no task: decoded as any other
    ids = processor(text="<OD>", images=IMAGE)["input_ids"][0]
    plain = engine.generate(input_ids=list(ids), image_data=[IMAGE], sampling_params=SAMPLING)
    assert plain["text"] == skip["text"] and "parsed" not in plain


def test_no_processor_no_parse(florence, tmp_path):
    """Without the processor's files the answer's text keeps its tokens, unparsed."""
    from seq2serve.runtime.frontend.florence_answers import FlorenceAnswers

    engine, _, _, path = florence
    bare = tmp_path / "bare"
    shutil.copytree(path, bare)
    (bare / "processor_config.json").unlink()
    tm = engine.tokenizer_manager
    answers = FlorenceAnswers.load(str(bare), tm.tokenizer, tm.info)
    assert answers.processor is None
    assert answers.parse("car<loc_1><loc_2><loc_3><loc_4>", "<OD>", (10, 10)) is None
    assert tm.answers.parse("car<loc_1><loc_2><loc_3><loc_4>", "<OD>", (10, 10))["<OD>"][
        "labels"] == ["car"]


def _data_url(image: Image.Image) -> str:
    import base64
    import io

    png = io.BytesIO()
    image.save(png, format="PNG")
    return "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()


@pytest.fixture(scope="module")
def server(florence):
    """`seq2serve serve` of the same checkpoint (one process for the HTTP tests below)."""
    from seq2serve.tests.server_helpers import ServerProcess

    srv = ServerProcess(florence[3])
    srv.model = florence[3]  # the name the server answers to
    try:
        yield srv
        assert srv.terminate() == 0, srv.output()
    finally:
        srv.kill()


def test_generate_over_http(florence, server):
    """POST /generate: `parsed` beside `text`, and on a stream's last event."""
    import json

    import httpx

    engine = florence[0]
    want = json.loads(json.dumps(engine.generate(prompt="<OD>", image_data=[IMAGE],
                                                 sampling_params=SAMPLING)))
    body = {"text": "<OD>", "image_data": _data_url(IMAGE), "sampling_params": SAMPLING}
    got = httpx.post(server.url + "/generate", json=body, timeout=60).json()
    assert (got["text"], got["parsed"]) == (want["text"], want["parsed"])
    with httpx.stream("POST", server.url + "/generate", json={**body, "stream": True},
                      timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert events[-1]["text"] == want["text"]
    assert events[-1]["parsed"] == want["parsed"]
    assert all("parsed" not in e for e in events[:-1])


def _chat(server, text: str, **kw):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    content = [{"type": "image_url", "image_url": {"url": _data_url(IMAGE)}},
               {"type": "text", "text": text}]
    return client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": content}],
        max_tokens=MAX_NEW, temperature=0, extra_body={"no_repeat_ngram_size": 3}, **kw)


def test_chat_answers_as_hf(florence, server):
    """/v1/chat/completions with the openai client: an image part and a task token answer as
    HF's generate, decode and post_process_generation do (a caption, a region task), the
    parse as `message.task_answer`; a stream's deltas add up to the same, the parse on the
    last."""
    _, processor, model, _ = florence
    tok = processor.tokenizer
    drop = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    for task in ("<CAPTION>", "<OD>"):
        generated_ids = _hf(processor, model, task)
        want = processor.batch_decode([[t for t in generated_ids[0].tolist() if t not in drop]],
                                      skip_special_tokens=False)[0]
        parsed = processor.post_process_generation(want, task=task, image_size=IMAGE.size)
        got = _chat(server, task).choices[0].message
        assert (got.content, got.task_answer) == (want, parsed), task
    assert "<loc_" in want  # the region task's answer kept its location tokens
    chunks = [c.choices[0].delta for c in _chat(server, "<OD>", stream=True) if c.choices]
    assert "".join(d.content or "" for d in chunks) == want
    extras = [d.model_extra.get("task_answer") for d in chunks]
    assert extras[-1] == parsed and not any(extras[:-1])


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "IMAGE"}},
                                   {"type": "image_url", "image_url": {"url": "IMAGE"}},
                                   {"type": "text", "text": "<CAPTION>"}]}],
     "one image per request: messages.0.content has 2 image parts"),
    ([{"role": "user", "content": "<CAPTION>"}], "has 0 image parts"),
    ([{"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "IMAGE"}},
                                   {"type": "text", "text": "<CAPTION>"}]}],
     "not a conversation: got a system message"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "IMAGE"}},
                                   {"type": "text", "text": "<CAPTION>"}]},
      {"role": "user", "content": "<OD>"}], "not a conversation: got 2 user messages"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "IMAGE"}}]}],
     "has no text"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "IMAGE"}},
                                   {"type": "text", "text": "<DESCRIBE>"}]}],
     "unknown task token <DESCRIBE>"),
])
def test_chat_refuses_what_florence_cannot_answer(server, messages, message):
    import json

    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    messages = json.loads(json.dumps(messages).replace('"IMAGE"', json.dumps(_data_url(IMAGE))))
    with pytest.raises(openai.BadRequestError, match=message) as e:
        client.chat.completions.create(model=server.model, messages=messages, max_tokens=2)
    assert e.value.status_code == 400


def test_bench_serving_sends_images_to_chat(server):
    """`bench serving --image-size`: chat messages of a distinct JPEG image and words to
    /v1/chat/completions, streamed (with beams answered whole), each answer --output-len
    tokens; the warm-up's images are not the load's; the offline engine answers the same
    messages as the chat endpoint hands them to generate (--compare-offline)."""
    from seq2serve.runtime.bench.serving import measure, warmup_workload, workload
    from seq2serve.runtime.bench.serving_offline import compare_offline

    res = measure(server.url, 4, 3, 5, 2, None, warmup=None, image_size=48)
    assert (res["completed"], res["failed"], res["output_tokens"]) == (4, 0, 20), res["errors"]
    assert (res["warmup"]["completed"], res["image_size"]) == (2, 48)
    assert 0 < res["ttft"]["p50_ms"] <= res["e2e"]["p50_ms"] and res["input_tokens"] > 0
    urls = lambda ms: {m["content"][0]["image_url"]["url"] for m in ms}  # noqa: E731
    load = workload(4, 3, image_size=48)
    assert len(urls(load)) == 4 and not urls(load) & urls(warmup_workload(2, 3, 0, None, 48))
    beams = measure(server.url, 2, 3, 5, 2, None, num_beams=2, image_size=48)
    assert (beams["completed"], beams["output_tokens"]) == (2, 10), beams["errors"]
    assert beams["ttft"] == beams["e2e"]
    offline = compare_offline(server.url, load, 5, 2, {"device": "cpu", "dtype": "float32"},
                              warmup_prompts=warmup_workload(2, 3, 0, None, 48))
    assert offline["output_tokens"] == 20
    assert offline["scheduler"]["encoder_inputs"] == 4  # (each image encoded once)
    with pytest.raises(ValueError, match="image-size must be"):
        workload(1, 1, image_size=0)
    with pytest.raises(ValueError, match="not both"):
        workload(1, 1, audio_seconds=2.0, image_size=8)
