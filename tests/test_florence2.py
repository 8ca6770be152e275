"""Florence-2 against HF transformers (float32, CPU), through the engine: greedy and 4-beam
tokens and beam scores on two tiny random checkpoints (tests/florence2_checkpoints.py), the
task prompts as HF's processor makes them, and bad input refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from seq2serve import Seq2SeqEngine
from seq2serve.tests.florence2_checkpoints import write_florence2_checkpoint

MAX_NEW = 14
EOS = 2
# no_repeat_ngram_size 3: tiny random models otherwise repeat one token; min_new_tokens
# keeps EOS (also the decoder start, which they tend to repeat) from coming first
CASES = [{}, {"no_repeat_ngram_size": 3, "min_new_tokens": 2},
         {"num_beams": 4, "no_repeat_ngram_size": 3, "min_new_tokens": 2}]
TASKS = ["<CAPTION>", "<OD>", "<OCR>"]


def _image(seed: int, h: int, w: int) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(h, w, 3) * 255).astype("uint8"))


IMAGES = [_image(0, 30, 50), _image(1, 37, 50), _image(2, 60, 20)]


class Oracle:
    def __init__(self, path: str) -> None:
        from transformers import AutoProcessor, Florence2ForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(path)
        self.model = Florence2ForConditionalGeneration.from_pretrained(
            path, dtype=torch.float32).eval()

    def inputs(self, task: str, image: Image.Image) -> dict:
        return self.processor(text=task, images=image, return_tensors="pt")

    @torch.no_grad()
    def generate(self, inputs: dict, **case) -> tuple[list[int], float | None]:
        """HF's tokens after the decoder start, cut after the first EOS; the beam score."""
        out = self.model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False,
                                  output_scores=True, return_dict_in_generate=True, **case)
        seq = out.sequences[0, 1:].tolist()
        seq = seq[: seq.index(EOS) + 1] if EOS in seq else seq
        return seq, (out.sequences_scores[0].item() if case.get("num_beams", 1) > 1 else None)


@pytest.fixture(scope="module", params=["untied", "tied"])
def florence(request, tmp_path_factory):
    path = str(write_florence2_checkpoint(request.param, tmp_path_factory.mktemp(request.param),
                                          eos_boost=2.5))
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32") as engine:
        yield engine, Oracle(path)


def test_generate_matches_hf(florence):
    """HF's processor's input_ids (the image's placeholders first) and pixels, against the
    engine given the same ids and the image: every case, every task, token for token."""
    engine, oracle = florence
    inputs = [oracle.inputs(t, im) for t, im in zip(TASKS, IMAGES)]
    lengths = set()
    for case in CASES:
        got = engine.generate(input_ids=[i["input_ids"][0].tolist() for i in inputs],
                              image_data=[[im] for im in IMAGES],
                              sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0,
                                               **case})
        for inp, res in zip(inputs, got):
            tokens, score = oracle.generate(inp, **case)
            assert res["output_ids"] == tokens, case
            if score is not None:
                assert res["meta_info"]["beam_score"] == pytest.approx(score, abs=1e-4)
            lengths.add(len(tokens))
    assert len(lengths) > 1  # some outputs ended on their own, others at the length limit


def test_the_image_matters(florence):
    engine, _ = florence
    outs = engine.generate(prompt=["<CAPTION>"] * 3, image_data=[[im] for im in IMAGES],
                           sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0})
    assert len({tuple(o["output_ids"]) for o in outs}) > 1


def test_task_prompts_as_hf_processor(florence):
    """A task token (or a task with its input) becomes the prompt HF's processor makes; and
    generate(prompt=task, image_data=...) answers as HF does for the same."""
    engine, oracle = florence
    image_token = oracle.processor.tokenizer.image_token_id
    tasks = ["<CAPTION>", "<OCR>", "<OD>", "<MORE_DETAILED_CAPTION>",
             "<CAPTION_TO_PHRASE_GROUNDING> a cat on a mat", "a plain question?"]
    for task in tasks:
        want = [t for t in oracle.inputs(task, IMAGES[0])["input_ids"][0].tolist()
                if t != image_token]
        assert engine.tokenize(task) == want, task
    beam = CASES[2]
    for task, image in zip(TASKS, IMAGES):
        got = engine.generate(prompt=task, image_data=[image],
                              sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0,
                                               **beam})
        assert got["output_ids"] == oracle.generate(oracle.inputs(task, image), **beam)[0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt="<CAPTION>"), "one image per prompt"),
    (dict(prompt="<CAPTION>", image_data=[IMAGES[0], IMAGES[1]]), "one image per prompt"),
    (dict(prompt="<DESCRIBE>", image_data=[IMAGES[0]]), "unknown task token <DESCRIBE>"),
    (dict(prompt="<OD> the dogs", image_data=[IMAGES[0]]), "must be the whole prompt"),
    (dict(input_ids=[269, 0, 30, 2], image_data=[IMAGES[0]]), "image placeholder tokens"),
])
def test_bad_input_is_refused_by_name(florence, kwargs, message):
    engine, oracle = florence
    assert oracle.processor.tokenizer.image_token_id == 269  # (the ids above)
    with pytest.raises(ValueError, match=message):
        engine.generate(sampling_params={"max_new_tokens": 2}, **kwargs)


def test_an_image_past_the_position_table_is_refused(florence):
    """A processor size whose feature grid outgrows vision_config.max_position_embeddings
    would index past HF's table: refused by name, before the encoder."""
    from seq2serve.encoders.image_processor import ImageProcessor

    engine, _ = florence
    info, path = engine.tokenizer_manager.info, engine.tokenizer_manager.model_id
    small = ImageProcessor(path, path, None, stages=info["image_stages"],
                           extra_tokens=1, max_grid=2)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        small(b"x", lambda: IMAGES[0])
    fits = ImageProcessor(path, path, None, stages=info["image_stages"], extra_tokens=1,
                          max_grid=info["image_max_grid"])
    assert fits(b"x", lambda: IMAGES[0]).num_tokens == (
        engine.tokenizer_manager.image_processor(b"x", lambda: IMAGES[0]).num_tokens)
