"""A call with images on many prompts is tokenized and sent in parts (`media_parts`); each part
queues its images on the media threads after the part before it (`MediaTurn`), so the first
part's images are preprocessed first and it is sent while later parts' images are still
being preprocessed. (All parts are tokenized at once on as many threads: before, each queued
its images as its thread got to it, and parts' images interleaved in the queue; the order
test fails so.)"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from PIL import Image

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.frontend.tokenizer_manager import MEDIA_PART, MediaTurn
from seq2serve.tests.florence2_checkpoints import write_florence2_checkpoint

PROMPTS = 4 * MEDIA_PART


class _Recorder:
    """The engine's image processor, recording which prompt's image each call starts on (the
    image's width says it) and taking a few ms an image, as a real image does."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.started: list[tuple[float, int]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, ident, decode):
        image = decode()
        with self.lock:
            self.started.append((time.perf_counter(), image.size[0] - 20))
        time.sleep(0.01)
        return self.inner(ident, lambda: image)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = str(write_florence2_checkpoint("tied", tmp_path_factory.mktemp("turns")))
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32") as engine:
        yield engine


def test_parts_queue_their_images_in_order_and_the_first_goes_early(engine):
    tm = engine.tokenizer_manager
    recorder = _Recorder(tm.image_processor)
    tm.image_processor = recorder
    sends: list[float] = []
    send = tm.link.send

    def timed_send(msg, *a, **k):
        sends.append(time.perf_counter())
        return send(msg, *a, **k)

    tm.link.send = timed_send
    rng = np.random.RandomState(0)
    images = [Image.fromarray((rng.rand(24, 20 + i, 3) * 255).astype("uint8"))
              for i in range(PROMPTS)]
    try:
        out = engine.generate(prompt=["<CAPTION>"] * PROMPTS, image_data=[[im] for im in images],
                              sampling_params={"max_new_tokens": 2, "temperature": 0})
    finally:
        tm.image_processor = recorder.inner
        tm.link.send = send
    assert len(out) == PROMPTS
    order = [i for _, i in sorted(recorder.started)]
    assert sorted(order) == list(range(PROMPTS))
    parts = [i // MEDIA_PART for i in order]
    assert parts == sorted(parts), parts  # every part's images started before the next's
    assert len(sends) == PROMPTS // MEDIA_PART
    last_started = max(t for t, _ in recorder.started)
    assert sends[0] < last_started  # the first part went while others were preprocessed


def test_a_part_that_fails_does_not_hold_the_next():
    first, second = MediaTurn.chain(2)
    waited = threading.Event()

    def later():
        second.wait()
        waited.set()

    t = threading.Thread(target=later)
    t.start()
    assert not waited.wait(0.2)  # (the second waits for the first)
    first.queued()  # (as _tokenize_items does whatever happened)
    t.join(5)
    assert waited.is_set()
