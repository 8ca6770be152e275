"""The bytes a decode step must read (the benchmarks' floor), counted against the HF model's
own decoder weights: every linear of the decoder stack except the cross-attention K/V
projections (they run once per input), plus the LM head; and the FLOPs of Whisper's encoder
stage (the GPU bench's share of the matmul peak), counted against HF's encoder modules."""

from __future__ import annotations

import pytest
import torch

from seq2serve.runtime.bench.hardware import decoder_step_bytes
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.tests.bart_checkpoints import write_bart_checkpoint
from seq2serve.tests.helpers import T5_CONFIGS, hf_model, make_t5

CROSS_KV = ("EncDecAttention.k", "EncDecAttention.v", "encoder_attn.k_proj",
            "encoder_attn.v_proj")


def _hf_step_weights(path: str) -> int:
    model = hf_model(path)
    decoder = model.get_decoder()
    n = sum(m.weight.numel() for name, m in decoder.named_modules()
            if isinstance(m, torch.nn.Linear) and not name.endswith(CROSS_KV))
    return n + model.get_output_embeddings().weight.numel()


@pytest.mark.parametrize("family", ["t5", "nllb", "marian"])
def test_decoder_step_bytes_count_the_decoder_weights(tmp_path, family):
    if family == "t5":
        path = str(make_t5(tmp_path / "t5", **T5_CONFIGS["mt5_gated_untied"]))
    else:
        path = str(write_bart_checkpoint(family, tmp_path / family))
    arch = ModelConfig.from_path(path).arch
    assert decoder_step_bytes(arch, 2) == 2 * _hf_step_weights(path)


def test_whisper_encoder_flops_count_the_hf_encoders_weights(tmp_path):
    """Whisper's encoder stage per 30 s window, counted against HF's modules: 2 FLOPs per
    weight per position for every encoder linear (1,500 positions) and convolution (3,000
    frames in, 1,500 out), the attention's two n x n products per layer, and the decoder's
    cross-attention K/V projections of the encoder output."""
    from transformers import WhisperForConditionalGeneration

    from seq2serve.runtime.bench.hardware import whisper_encoder_flops
    from seq2serve.tests.whisper_checkpoints import write_whisper_checkpoint

    path = str(write_whisper_checkpoint("multilingual", tmp_path / "whisper"))
    arch = ModelConfig.from_path(path).arch
    model = WhisperForConditionalGeneration.from_pretrained(path)
    encoder, decoder = model.model.encoder, model.model.decoder
    n = arch.max_source_positions
    linear = sum(m.weight.numel() for m in encoder.modules() if isinstance(m, torch.nn.Linear))
    cross = sum(m.weight.numel() for name, m in decoder.named_modules()
                if name.endswith(("encoder_attn.k_proj", "encoder_attn.v_proj")))
    flops = whisper_encoder_flops(arch)
    assert flops["encoder"] == (2 * n * linear + 2 * 2 * n * encoder.conv1.weight.numel()
                                + 2 * n * encoder.conv2.weight.numel()
                                + arch.encoder_layers * 2 * 2 * n * n * arch.d_model)
    assert flops["cross_kv"] == 2 * n * cross
    assert flops["stage"] == flops["encoder"] + flops["cross_kv"]
