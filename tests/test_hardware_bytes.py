"""The bytes a decode step must read (the benchmarks' floor), counted against the HF model's
own decoder weights: every linear of the decoder stack except the cross-attention K/V
projections (they run once per input), plus the LM head."""

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
