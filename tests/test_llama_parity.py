"""Decoder-only Llama: greedy tokens and logits match Hugging Face; chat goes through the template."""

from __future__ import annotations

import pytest
import torch

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint
from seq2serve.tests.helpers import make_scheduler, record_results, request

LLAMA_CONFIGS = {
    "gqa_untied_llama3_rope": dict(num_attention_heads=4, num_key_value_heads=2, seed=1),
    "mha_tied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                     rope_scaling=None, rope_theta=10000.0, seed=2),
    "mqa_head_dim_24": dict(hidden_size=48, num_attention_heads=2, num_key_value_heads=1,
                            head_dim=24, num_hidden_layers=3, seed=3),
}
PROMPTS = ["Hello world", "The capital of France is", "1 2 3 4 5 6 7 8 9 10 11 12",
           "Grüße aus Köln — 日本語", "A long prompt " * 20, "x"]
MAX_NEW = 12


@pytest.fixture(scope="module")
def llama_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    return {name: str(write_llama_checkpoint(root / name, init_scale=10.0, **cfg))
            for name, cfg in LLAMA_CONFIGS.items()}


@pytest.mark.parametrize("name", list(LLAMA_CONFIGS))
def test_llama_greedy_and_logits_match_hf(llama_dirs, name):
    from transformers import AutoModelForCausalLM

    path = llama_dirs[name]
    tok = load_tokenizer(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [tok(p).input_ids for p in PROMPTS]
    sched = make_scheduler(path)
    for i, ids in enumerate(prompts):
        sched.add_request(request(str(i), [], ids, max_new_tokens=MAX_NEW, ignore_eos=True))
    out: dict[str, list[int]] = {}
    steps = record_results(sched)
    while sched.has_work:
        for o in sched.step():
            out.setdefault(o.rid, []).extend(o.new_token_ids)
        sched.check_integrity()
    rids, prefill = steps[0]
    first_logits = dict(zip(rids, prefill.logits))
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                              num_beams=1)[0, len(ids):].tolist()
            ref_logits = hf(torch.tensor([ids])).logits[0, -1]
        assert out[str(i)] == ref, f"prompt {i}"
        assert len(set(ref)) >= MAX_NEW // 4, f"prompt {i} degenerate: {ref}"
        torch.testing.assert_close(first_logits[str(i)], ref_logits, atol=1e-4, rtol=0)


def test_llama_chat_uses_the_template_once(llama_dirs):
    from transformers import AutoModelForCausalLM

    from seq2serve import Seq2SeqEngine

    path = llama_dirs["gqa_untied_llama3_rope"]
    tok = load_tokenizer(path)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    ids = list(ids["input_ids"])
    assert ids.count(tok.bos_token_id) == 1
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0, len(ids):]
    with Seq2SeqEngine(model_path=path, device="cpu") as engine:
        out = engine.chat(messages, sampling_params={"max_new_tokens": 8, "temperature": 0,
                                                     "ignore_eos": True})
        assert out["output_ids"] == ref.tolist()
        assert out["meta_info"]["prompt_tokens"] == len(ids)
        with pytest.raises(ValueError, match="decoder_input_ids"):
            engine.generate(prompt="hi", decoder_input_ids=[1, 2])
        engine.check_integrity()
