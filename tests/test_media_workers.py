"""Images decoded and preprocessed in worker processes (`media_processes`,
runtime/frontend/media_workers.py): the workers' features are the in-process processor's
(pixels to the bit); a bad image is refused by name and the workers go on; a worker that dies
fails only the tasks it held, and another takes its place; closing leaves no process. Through
the engine, Florence-2's answers with `media_processes=2` are HF `generate`'s tokens and HF's
parse of them (the image's size comes back from the worker)."""

from __future__ import annotations

import base64
import io
import os
import signal
import time

import numpy as np
import pytest
import torch
from PIL import Image

from seq2serve import Seq2SeqEngine
from seq2serve.encoders.image_loader import MediaPolicy, read_image
from seq2serve.encoders.image_processor import ImageProcessor
from seq2serve.runtime.frontend.media_workers import MediaWorkerError, MediaWorkers
from seq2serve.tests.florence2_checkpoints import write_florence2_checkpoint

MAX_NEW = 12


def _image(seed: int, h: int, w: int) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(h, w, 3) * 255).astype("uint8"))


def _png_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_florence2_checkpoint("tied", tmp_path_factory.mktemp("media"),
                                          eos_boost=2.5, answer_tokens=True))


@pytest.fixture(scope="module")
def processor_args(checkpoint):
    return dict(model_path=checkpoint, model_id=checkpoint, tokens_per_tile=None,
                pixel_dtype=torch.float32, stages=[(7, 4, 3), (3, 2, 1)], extra_tokens=0)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # (a zombie until reaped counts as gone: it runs nothing)
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] == "Z"


def test_workers_give_the_processors_features_refuse_bad_images_and_survive_a_death(
        processor_args, tmp_path):
    local = ImageProcessor(**processor_args)
    images = [_image(i, 30 + 7 * i, 50 - 5 * i) for i in range(5)]
    sources = [images[0], _png_url(images[1]), images[2], _png_url(images[3]), images[4]]
    workers = MediaWorkers(2, processor_args, MediaPolicy(), with_size=True,
                           folder=str(tmp_path / "from-workers"))
    try:
        assert len(set(workers.pids)) == 2
        got = [f.result(timeout=60) for f in list(map(workers.submit, sources))]
        for src, image, (features, size) in zip(sources, images, got):
            want = local(*read_image(src, MediaPolicy()))
            assert features.key == want.key and features.num_tokens == want.num_tokens
            assert features.pixel_values.dtype == want.pixel_values.dtype
            assert torch.equal(features.pixel_values, want.pixel_values)
            assert size == image.size

        bad = workers.submit("data:image/png;base64," + base64.b64encode(b"not a png").decode())
        with pytest.raises(ValueError, match="image"):
            bad.result(timeout=60)
        assert torch.equal(workers.submit(images[0]).result(timeout=60)[0].pixel_values,
                           got[0][0].pixel_values)

        # a worker killed: whatever it held fails by name, the next tasks are answered
        victim = workers.pids[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 90
        while victim in workers.pids and time.monotonic() < deadline:
            time.sleep(0.1)
        assert victim not in workers.pids
        for f in [workers.submit(im) for im in images]:
            try:
                f.result(timeout=90)
            except MediaWorkerError as e:  # (sent to the victim before it was seen dead)
                assert "media worker" in str(e)
        deadline = time.monotonic() + 90
        while len(workers.pids) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(workers.pids) == 2 and victim not in workers.pids
        answers = [f.result(timeout=60) for f in list(map(workers.submit, sources))]
        assert all(torch.equal(a[0].pixel_values, g[0].pixel_values)
                   for a, g in zip(answers, got))
        assert not os.listdir(tmp_path / "from-workers")  # every file read back and removed
    finally:
        pids = workers.pids
        workers.close()
    assert all(_gone(pid) for pid in pids)
    with pytest.raises(MediaWorkerError, match="closed"):
        workers.submit(images[0])


def test_closing_with_images_in_flight_fails_them_and_leaves_nothing(processor_args, tmp_path):
    folder = tmp_path / "from-workers"
    workers = MediaWorkers(1, processor_args, MediaPolicy(), with_size=False,
                           folder=str(folder))
    pids = workers.pids
    futures = [workers.submit(_png_url(_image(i, 300, 300))) for i in range(12)]
    workers.close()
    for f in futures:  # (each answered or failed by name: none left waiting)
        try:
            f.result(timeout=30)
        except MediaWorkerError as e:
            assert "closed" in str(e) or "exited" in str(e)
    assert all(_gone(pid) for pid in pids)
    deadline = time.monotonic() + 10
    while os.listdir(folder) and time.monotonic() < deadline:  # (replies read meanwhile)
        time.sleep(0.1)
    assert len(os.listdir(folder)) <= 1  # (at most the one a killed worker was writing)


def test_a_worker_that_cannot_start_fails_the_start_by_name(tmp_path):
    args = dict(model_path=str(tmp_path / "missing"), model_id="m", tokens_per_tile=None)
    with pytest.raises(MediaWorkerError, match="exited at start"):
        MediaWorkers(1, args, MediaPolicy(), with_size=False, folder=str(tmp_path))


def test_engine_with_media_processes_answers_as_hf(checkpoint):
    from transformers import AutoProcessor, Florence2ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(checkpoint)
    model = Florence2ForConditionalGeneration.from_pretrained(checkpoint,
                                                              dtype=torch.float32).eval()
    images = [_image(7, 30, 50), _image(8, 44, 36)]
    with Seq2SeqEngine(model_path=checkpoint, device="cpu", dtype="float32",
                       media_processes=2) as engine:
        tm = engine.tokenizer_manager
        assert tm.media_workers is not None and len(tm.media_workers.pids) == 2
        pids = tm.media_workers.pids
        got = engine.generate(prompt=["<OD>", "<CAPTION>"],
                              image_data=[[images[0]], [_png_url(images[1])]],
                              sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0})
        for prompt, image, res in zip(["<OD>", "<CAPTION>"], images, got):
            inputs = processor(text=prompt, images=image, return_tensors="pt")
            with torch.no_grad():
                hf = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
            pad = processor.tokenizer.pad_token_id
            assert res["output_ids"] == [t for t in hf[0, 1:].tolist() if t != pad], prompt
            text = processor.batch_decode(hf, skip_special_tokens=False)[0]
            assert res["parsed"] == processor.post_process_generation(
                text, task=prompt, image_size=image.size), prompt
        with pytest.raises(ValueError, match="image 0"):
            engine.generate(prompt="<OD>", image_data=[b"not an image"],
                            sampling_params={"max_new_tokens": 2})
        with pytest.raises(ValueError, match="unsupported image input of type"):
            engine.generate(prompt="<OD>", image_data=[3.5],
                            sampling_params={"max_new_tokens": 2})
        again = engine.generate(prompt="<OD>", image_data=[images[0]],
                                sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0})
        assert again["output_ids"] == got[0]["output_ids"]
    assert all(_gone(pid) for pid in pids)


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_media_processes_must_be_a_count(value):
    from seq2serve.runtime.config.server_args import ServerArgs

    with pytest.raises(ValueError, match="media_processes"):
        ServerArgs(model_path="m", media_processes=value)
