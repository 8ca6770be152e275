"""The benchmark shapes (runtime/bench/shapes.py) as HF and seq2serve read them: every shape's
directory loads in both with the same vocabulary and end-of-sequence token, and Florence-2's
workload gives HF the input its processor would (as many image placeholders as seq2serve
counts image tokens, pixels of the processor's size)."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from seq2serve.encoders.image_processor import feature_grid
from seq2serve.runtime.bench.hardware import decoder_step_bytes
from seq2serve.runtime.bench.hf_baseline import hf_inputs
from seq2serve.runtime.bench.shapes import SHAPES, write_shape
from seq2serve.runtime.bench.workload import Workload, make_requests
from seq2serve.runtime.config.model_config import ModelConfig


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shape_reads_alike_in_hf_and_seq2serve(tmp_path, shape):
    path = write_shape(shape, tmp_path / shape)
    ours = ModelConfig.from_path(str(path))
    hf = AutoConfig.from_pretrained(str(path))
    text = hf.get_text_config(decoder=True)
    assert ours.vocab_size == text.vocab_size
    eos = text.eos_token_id if text.eos_token_id is not None else hf.eos_token_id
    assert eos in ours.eos_token_ids
    # a decode step reads at least the head's rows
    assert decoder_step_bytes(ours.arch) > 2 * text.vocab_size * text.get_text_config().hidden_size
    image_token = getattr(hf, "image_token_id", None) or getattr(hf, "image_token_index", None)
    if image_token is not None:  # HF embeds the placeholder: it must be in the vocabulary
        assert image_token == ours.arch.frontend_info()["image_token_id"]


def test_florence_workload_is_hf_processor_input(tmp_path):
    path = str(write_shape("florence-2-large", tmp_path / "florence"))
    mc = ModelConfig.from_path(path)
    info = mc.arch.frontend_info()
    rows, cols = feature_grid((768, 768), info["image_stages"])
    image_tokens = rows * cols + info["image_extra_tokens"]
    assert image_tokens == 577  # Florence-2-large's 24 x 24 grid and its pooled token
    reqs = make_requests(Workload(3, 12, 4, image_size=768), mc.vocab_size, True,
                         info["image_token_id"], eos=mc.eos_token_ids[0])
    assert all(r.image is not None and r.input_ids[0] == 0 and r.input_ids[-1] == 2
               and len(r.input_ids) == 12 for r in reqs)
    inputs = hf_inputs(path, reqs, "cpu")
    assert inputs["pixel_values"].shape == (3, 3, 768, 768)
    ids = inputs["input_ids"]
    assert ids.shape == (3, image_tokens + 12)
    assert (ids[:, :image_tokens] == info["image_token_id"]).all()
    assert ids[:, image_tokens:].tolist() == [r.input_ids for r in reqs]
    assert info["image_token_id"] < AutoConfig.from_pretrained(path).text_config.vocab_size
