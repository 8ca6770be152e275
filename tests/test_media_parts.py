"""A call with images on many prompts is tokenized and sent in parts
(`tokenizer_manager.media_parts`): the first part reaches the scheduler before the last
image is preprocessed, every answer is still HF's (tiny Florence-2, float32, CPU), and a bad
image in a later part fails the call by name with nothing left behind."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.frontend import tokenizer_manager
from seq2serve.runtime.frontend.tokenizer_manager import media_parts
from seq2serve.tests.florence2_checkpoints import write_florence2_checkpoint

MAX_NEW = 10
EOS = 2
SP = {"max_new_tokens": MAX_NEW, "temperature": 0, "no_repeat_ngram_size": 3,
      "min_new_tokens": 2}
TASKS = ["<CAPTION>", "<OD>", "<OCR>", "<CAPTION>", "<OCR>"]


def _image(seed: int, h: int, w: int) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(h, w, 3) * 255).astype("uint8"))


IMAGES = [_image(10 + i, 30 + 7 * i, 50 - 5 * i) for i in range(len(TASKS))]


@pytest.fixture(scope="module")
def florence(tmp_path_factory):
    from transformers import AutoProcessor, Florence2ForConditionalGeneration

    path = str(write_florence2_checkpoint("tied", tmp_path_factory.mktemp("parts"),
                                          eos_boost=2.5))
    processor = AutoProcessor.from_pretrained(path)
    model = Florence2ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32") as engine:
        yield engine, processor, model


@torch.no_grad()
def _hf(processor, model, task: str, image: Image.Image) -> list[int]:
    inputs = processor(text=task, images=image, return_tensors="pt")
    seq = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False,
                         no_repeat_ngram_size=3, min_new_tokens=2)[0, 1:].tolist()
    return seq[: seq.index(EOS) + 1] if EOS in seq else seq


@pytest.fixture
def watched(florence, monkeypatch):
    """The engine with parts of two prompts, and the order of its images' preprocessing and
    its messages to the scheduler. An image after the first part's two waits (at most 30 s)
    until a part has been sent: the first part must go without waiting for the others."""
    engine = florence[0]
    tm = engine.tokenizer_manager
    monkeypatch.setattr(tokenizer_manager, "MEDIA_PART", 2)
    events: list[tuple[str, int]] = []
    send, process = tm.link.send, tm.image_processor.__class__.__call__
    first_part = {im.tobytes() for im in IMAGES[:2]}
    one_sent = threading.Event()

    def sending(reqs):
        events.append(("send", len(reqs)))
        one_sent.set()
        return send(reqs)

    def processing(self, ident, decode):
        if not any(ident.endswith(raw) for raw in first_part):
            one_sent.wait(30)
        events.append(("image", 1))
        return process(self, ident, decode)

    monkeypatch.setattr(tm.link, "send", sending)
    # (threads for all five images: the waiting ones never hold up the first part's)
    monkeypatch.setattr(tm, "media_pool", ThreadPoolExecutor(max_workers=len(IMAGES)))
    monkeypatch.setattr(tm.image_processor.__class__, "__call__", processing)
    return events


def test_parts_of_a_call():
    with_images = [{"image_data": [object()]}] * 5
    assert media_parts(with_images[:tokenizer_manager.MEDIA_PART]) == [slice(None)]
    many = [{"image_data": []}] * 40 + [{"image_data": [object()]}]
    assert len(media_parts(many)) == -(-41 // tokenizer_manager.MEDIA_PART)
    assert media_parts(many, may_split=False) == [slice(None)]
    text_only = [{"image_data": [], "text": "x"}] * 40
    assert media_parts(text_only) == [slice(None)]
    audio = [{"image_data": [], "audio_data": b"x"}] * 40
    assert len(media_parts(audio)) > 1


def test_a_call_in_parts_answers_as_hf(florence, watched):
    engine, processor, model = florence
    engine.flush_cache()  # (no image of an earlier test cached: all five are preprocessed)
    outs = engine.generate(prompt=TASKS, image_data=[[im] for im in IMAGES], sampling_params=SP)
    sends = [n for kind, n in watched if kind == "send"]
    assert sends == [2, 2, 1]
    # the first part went before the last image was preprocessed
    first_send = watched.index(("send", 2))
    last_image = max(i for i, (kind, _) in enumerate(watched) if kind == "image")
    assert first_send < last_image
    for out, task, image in zip(outs, TASKS, IMAGES):
        assert out["output_ids"] == _hf(processor, model, task, image), task
    assert len({tuple(o["output_ids"]) for o in outs}) > 1


def test_a_bad_image_in_a_later_part_fails_the_call_cleanly(florence, watched):
    engine, processor, model = florence
    tm = engine.tokenizer_manager
    images = [[im] for im in IMAGES[:4]] + [[b"not an image"]]
    with pytest.raises(ValueError, match="image 0"):
        engine.generate(prompt=TASKS, image_data=images, sampling_params=SP)
    assert ("send", 2) in watched  # the earlier parts had gone to the scheduler
    assert tm.states == {}
    assert tm.pixel_store.pins == {}
    engine.check_integrity()  # (every slot of the aborted parts given back)
    out = engine.generate(prompt=TASKS[0], image_data=[IMAGES[0]], sampling_params=SP)
    assert out["output_ids"] == _hf(processor, model, TASKS[0], IMAGES[0])


def test_split_rows_keeps_a_batch_within_the_images_per_call():
    from seq2serve.runtime.frontend.generate_request import GenerateReqInput, split_rows

    a, b = object(), object()
    obj = GenerateReqInput(text=["p"] * 5, image_data=[[a], [a, b], None, [b], a])
    chunks = split_rows(obj, 100, max_images=2)
    assert [c.text for c in chunks] == [["p"], ["p", "p"], ["p", "p"]]
    assert [c.image_data for c in chunks] == [[[a]], [[a, b], None], [[b], a]]
    assert len({c.group for c in chunks}) == 1
    assert split_rows(obj, 100) == [obj] == split_rows(obj, 100, max_images=5)
    # a prompt over the limit alone stays alone (refused by name when tokenized)
    assert [c.image_data for c in split_rows(obj, 100, max_images=1)] == [
        [[a]], [[a, b]], [None, [b]], [a]]


def test_the_engine_takes_more_images_than_one_call_may_hold(florence, tmp_path):
    """A Python list of prompts with more images than `max_images_per_call` (an HTTP body's
    limit) is cut into calls within it, each answering as HF does."""
    _, processor, model = florence
    path = str(write_florence2_checkpoint("tied", tmp_path / "few", eos_boost=2.5))
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32",
                       max_images_per_call=2) as engine:
        outs = engine.generate(prompt=TASKS, image_data=[[im] for im in IMAGES],
                               sampling_params=SP)
        # (one prompt's images are never split: over the limit alone, refused by name)
        with pytest.raises(ValueError, match=r"limit of 2 \(max_images_per_call\)"):
            engine.generate(prompt=TASKS[0], image_data=IMAGES[:3], sampling_params=SP)
    for out, task, image in zip(outs, TASKS, IMAGES):
        assert out["output_ids"] == _hf(processor, model, task, image), task
