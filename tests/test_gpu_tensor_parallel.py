"""Tensor parallelism on GPUs (run by hand on a machine with 2 GPUs: `pytest -m gpu`): NCCL,
the Triton backend and CUDA graphs captured on each rank; tp_size=2 gives Hugging Face's
greedy tokens in float32, as on the CPU (tests/test_tensor_parallel.py)."""

from __future__ import annotations

import pytest
import torch

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint
from seq2serve.tests.helpers import SOURCES, hf_greedy, make_t5

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
GPU = {"device": "cuda", "dtype": "float32", "max_total_tokens": 8192,
       "max_cross_tokens": 8192}


def test_t5_tp2_with_cuda_graphs_matches_hf(tmp_path):
    path = str(make_t5(tmp_path / "t5", vocab_size=32101, d_model=48, d_kv=8, num_heads=6,
                       d_ff=96, num_layers=2, num_decoder_layers=2,
                       feed_forward_proj="gated-gelu", tie_word_embeddings=False, seed=4))
    tok = load_tokenizer(path)
    refs = [hf_greedy(path, tok(s).input_ids, 12) for s in SOURCES]
    with Seq2SeqEngine(model_path=path, tp_size=2, **GPU) as engine:
        assert engine.stats()["tp_devices"] == ["cuda:0", "cuda:1"]
        batch = engine.generate(prompt=SOURCES, sampling_params=GREEDY)  # decode graphs
        one = [engine.generate(prompt=s, sampling_params=GREEDY) for s in SOURCES[:3]]
        engine.check_integrity()
    assert [o["output_ids"] for o in batch] == refs
    assert [o["output_ids"] for o in one] == refs[:3]


def test_llama_gqa_tp2_with_cuda_graphs_matches_hf(tmp_path):
    from transformers import AutoModelForCausalLM

    path = str(write_llama_checkpoint(tmp_path / "llama", init_scale=10.0, seed=1,
                                      hidden_size=48, intermediate_size=96,
                                      num_attention_heads=6, num_key_value_heads=2))
    tok = load_tokenizer(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [tok(p).input_ids for p in ["Hello world", "The capital of France is"]]
    with Seq2SeqEngine(model_path=path, tp_size=2, **GPU) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12,
                              do_sample=False, attention_mask=torch.ones(1, len(ids)))
        assert out["output_ids"] == ref[0, len(ids):].tolist()
