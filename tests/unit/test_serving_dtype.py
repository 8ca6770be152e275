"""`--dtype auto`: bfloat16 for a float32 checkpoint on a GPU that has it, never float16 for
T5/mT5, float32 on a CPU, an explicit dtype as given; the GPU's answer is mocked."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from seq2serve.runtime.config.serving_dtype import serving_dtype
from seq2serve.runtime.executor.model_runner import resolve_dtype

T5, MT5, LLAMA, MARIAN = ("T5ForConditionalGeneration", "MT5ForConditionalGeneration",
                          "LlamaForCausalLM", "MarianMTModel")


@pytest.mark.parametrize("checkpoint, arch, bf16, expected", [
    ("float32", LLAMA, True, "bfloat16"),
    ("float32", T5, True, "bfloat16"),
    ("float32", LLAMA, False, "float16"),  # a GPU without bfloat16 (V100, T4)
    ("float32", MT5, False, "float32"),  # T5 never in float16
    ("bfloat16", MARIAN, True, "bfloat16"),
    ("bfloat16", MARIAN, False, "float16"),
    ("float16", LLAMA, True, "float16"),
    ("float16", MT5, True, "bfloat16"),
    ("float16", T5, False, "float32"),
])
def test_auto_on_a_gpu(checkpoint, arch, bf16, expected):
    chosen = serving_dtype("auto", checkpoint, arch, "cuda:0", bf16)
    assert chosen.name == expected
    assert (chosen.note is None) == (expected == checkpoint)


def test_the_note_names_the_way_back():
    note = serving_dtype("auto", "float32", LLAMA, "cuda", True).note
    assert note == "serving float32 checkpoint in bfloat16; pass --dtype float32 to keep it"


@pytest.mark.parametrize("requested", ["float32", "float16", "bfloat16"])
def test_explicit_dtype_is_kept_on_any_device(requested):
    for device in ("cuda", "cpu"):
        chosen = serving_dtype(requested, "float32", T5, device, True)
        assert (chosen.name, chosen.note) == (requested, None)


def test_cpu_serves_float32():
    for checkpoint in ("float32", "bfloat16", "float16"):
        assert serving_dtype("auto", checkpoint, LLAMA, "cpu", True).name == "float32"


def test_model_runner_asks_the_gpu_and_logs_the_choice(monkeypatch, caplog):
    asked = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: asked.append(1) or True)
    mc = SimpleNamespace(checkpoint_dtype="float32", architecture=LLAMA)
    with caplog.at_level(logging.WARNING):
        assert resolve_dtype(SimpleNamespace(dtype="auto"), mc, "cuda:0") is torch.bfloat16
    assert "pass --dtype float32 to keep it" in caplog.text and asked
    assert resolve_dtype(SimpleNamespace(dtype="float32"), mc, "cuda:0") is torch.float32
    assert resolve_dtype(SimpleNamespace(dtype="auto"), mc, "cpu") is torch.float32
    assert len(asked) == 1  # only auto on a GPU asks
