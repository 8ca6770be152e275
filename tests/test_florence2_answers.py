"""Florence-2's task answers (runtime/frontend/florence_answers.py) against HF transformers, on
a tiny random checkpoint whose tokenizer has the answers' `<loc_*>` tokens (random weights
generate them often): the text keeps them as HF's `batch_decode(..., skip_special_tokens=False)`
does, less BOS/EOS/pad, and `parsed` is HF's `post_process_generation` of it for the image's
size; an explicit skip_special_tokens is obeyed; a checkpoint without a processor gets no
parse."""

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


def test_generate_over_http(florence):
    """POST /generate: `parsed` beside `text`, and on a stream's last event."""
    import base64
    import io
    import json

    import httpx

    from seq2serve.tests.server_helpers import ServerProcess

    engine, _, _, path = florence
    want = json.loads(json.dumps(engine.generate(prompt="<OD>", image_data=[IMAGE],
                                                 sampling_params=SAMPLING)))
    png = io.BytesIO()
    IMAGE.save(png, format="PNG")
    image = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    srv = ServerProcess(path)
    try:
        body = {"text": "<OD>", "image_data": image, "sampling_params": SAMPLING}
        got = httpx.post(srv.url + "/generate", json=body, timeout=60).json()
        assert (got["text"], got["parsed"]) == (want["text"], want["parsed"])
        with httpx.stream("POST", srv.url + "/generate", json={**body, "stream": True},
                          timeout=60) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
        assert events[-1]["text"] == want["text"]
        assert events[-1]["parsed"] == want["parsed"]
        assert all("parsed" not in e for e in events[:-1])
        assert srv.terminate() == 0, srv.output()
    finally:
        srv.kill()
