"""Test helpers: checkpoint configs, the HF oracle, and an in-process scheduler driver."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler
from seq2serve.runtime.tools.demo_checkpoint import write_t5_checkpoint

# Several shapes of the family: gated and plain feed-forward, tied and untied heads, head
# sizes whose product is not d_model, unequal layer counts, and a max_distance short enough
# that the test sources are longer than it.
T5_CONFIGS: dict[str, dict] = {
    "mt5_gated_untied": dict(mt5=True, d_model=48, d_kv=12, num_heads=3, d_ff=96,
                             num_layers=2, num_decoder_layers=3, feed_forward_proj="gated-gelu",
                             tie_word_embeddings=False, relative_attention_num_buckets=8,
                             relative_attention_max_distance=16, seed=3),
    "t5_relu_untied": dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
                           num_decoder_layers=2, feed_forward_proj="relu",
                           tie_word_embeddings=False, relative_attention_num_buckets=16,
                           relative_attention_max_distance=24, seed=1),
    "t5_gated_tied": dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
                          num_decoder_layers=2, feed_forward_proj="gated-gelu",
                          tie_word_embeddings=True, relative_attention_num_buckets=16,
                          relative_attention_max_distance=24, seed=1,
                          init_scale=2.0, embed_scale=0.3),
    "t5_silu_oddheads": dict(d_model=40, d_kv=7, num_heads=5, d_ff=72, num_layers=3,
                             num_decoder_layers=1, feed_forward_proj="gated-silu",
                             tie_word_embeddings=False, relative_attention_num_buckets=12,
                             relative_attention_max_distance=20, seed=3),
}

SOURCES = [
    "translate English to German: The house is wonderful.",
    "summarize: studies have shown that owning a dog is good for you",
    "Hi",
    "translate English to French: Where is the train station? I would like to buy a ticket "
    "to Paris, and then find a small hotel near the river for two nights.",
    "question: what is the capital of France? context: Paris is the capital and most "
    "populous city of France, with an estimated population of two million residents.",
    "cola sentence: The course is jumping well.",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "stsb sentence1: The rhino grazed on the grass. sentence2: A rhino is grazing in a field.",
]


def make_t5(path: Path, **cfg) -> Path:
    cfg = dict(cfg)
    return write_t5_checkpoint(path, seed=cfg.pop("seed", 0), mt5=cfg.pop("mt5", False),
                               init_scale=cfg.pop("init_scale", 1.0), **cfg)


@lru_cache(maxsize=8)
def hf_model(path: str):
    from transformers import AutoModelForSeq2SeqLM

    kwargs = {}
    with open(f"{path}/config.json") as f:
        if json.load(f).get("model_type") == "t5gemma":
            # T5Gemma soft-caps its attention scores, which SDPA cannot: transformers before
            # 5.23 (the GPU machine's 5.17) still chose SDPA for it, dropping the cap
            kwargs["attn_implementation"] = "eager"
    return AutoModelForSeq2SeqLM.from_pretrained(path, dtype=torch.float32, **kwargs).eval()


def hf_greedy(path: str, encoder_ids: list[int], max_new_tokens: int,
              decoder_input_ids: list[int] | None = None) -> list[int]:
    """Hugging Face's greedy tokens for one source (batch 1: no padding), start token dropped.
    Without HF's KV cache: transformers 5 sizes it by the encoder's layer count, which breaks
    checkpoints with num_decoder_layers != num_layers; recomputing is the same math."""
    model = hf_model(path)
    kwargs = {}
    if decoder_input_ids is not None:
        kwargs["decoder_input_ids"] = torch.tensor([decoder_input_ids])
    with torch.no_grad():
        out = model.generate(torch.tensor([encoder_ids]), max_new_tokens=max_new_tokens,
                             do_sample=False, num_beams=1, min_new_tokens=0, use_cache=False,
                             **kwargs)
    prefix = 1 if decoder_input_ids is None else len(decoder_input_ids)
    return out[0, prefix:].tolist()


def hf_logits(path: str, encoder_ids: list[int], decoder_ids: list[int]) -> torch.Tensor:
    """HF's next-token logits after each decoder position: [len(decoder_ids), vocab]."""
    with torch.no_grad():
        return hf_model(path)(input_ids=torch.tensor([encoder_ids]),
                              decoder_input_ids=torch.tensor([decoder_ids])).logits[0]


def make_scheduler(path: str, **kwargs) -> Scheduler:
    args = ServerArgs(model_path=path, **{"device": "cpu", "dtype": "float32",
                                          "max_total_tokens": 4096, "max_cross_tokens": 4096,
                                          **kwargs})
    return Scheduler(args, ModelConfig.from_path(path), load_tokenizer(path))


def request(rid: str, encoder_ids: list[int], decoder_ids: list[int] | None = None,
            **sampling) -> TokenizedRequest:
    sp = SamplingParams.from_dict({"temperature": 0, **sampling})
    return TokenizedRequest(rid=rid, encoder_input_ids=list(encoder_ids),
                            decoder_input_ids=decoder_ids or [0], sampling_params=sp)


def record_results(scheduler: Scheduler) -> list:
    """(request ids, StepOutput) of every step the scheduler processes, in order; the
    results carry the sampled rows' logits."""
    steps = []
    process = scheduler._process

    def recording(batch, result):
        steps.append(([r.rid for r in batch.reqs], result))
        return process(batch, result)

    scheduler._process = recording
    return steps


def run_to_completion(scheduler: Scheduler, on_step=None) -> dict[str, list[int]]:
    """Step until idle; returns rid -> generated ids. `on_step(i)` runs before step i."""
    out: dict[str, list[int]] = {}
    i = 0
    while True:
        more = on_step(i) if on_step is not None else False
        if not (scheduler.has_work or more):
            break
        for o in scheduler.step():
            out.setdefault(o.rid, []).extend(o.new_token_ids)
        i += 1
        scheduler.check_integrity()
    return out
