"""Tiny random-weight checkpoints in Hugging Face format, for smoke runs and tests, and the
bundled (trained) demo model.

The weights are random: the text they produce is meaningless. They are scaled so that greedy
decoding does not collapse into one repeated token, which keeps parity tests meaningful.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parents[2] / "models" / "assets"
T5_TOKENIZER = ASSETS / "t5-tokenizer"
LLAMA3_TOKENIZER = ASSETS / "llama3-tokenizer"

DEMO_T5 = dict(vocab_size=32128, d_model=64, d_kv=16, d_ff=128, num_layers=2,
               num_decoder_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
               tie_word_embeddings=False)


def write_t5_checkpoint(out: str | Path, *, seed: int = 0, dtype: str = "float32",
                        mt5: bool = False, umt5: bool = False, init_scale: float = 4.0,
                        embed_scale: float = 1.0, with_tokenizer: bool = True,
                        **config) -> Path:
    """Write a random T5 v1.1-style checkpoint (config.json, model.safetensors, tokenizer):
    T5's, `mt5`'s or `umt5`'s classes (UMT5: a position bias in every self-attention layer).

    `config` overrides DEMO_T5's fields (any T5Config field). `init_scale` multiplies HF's
    initializer and `embed_scale` the embedding, so tiny random models produce varied tokens
    (a tied head over large embeddings tends to repeat the previous token).
    """
    import torch
    from safetensors.torch import save_file
    from transformers import (
        MT5Config,
        MT5ForConditionalGeneration,
        T5Config,
        T5ForConditionalGeneration,
        UMT5Config,
        UMT5ForConditionalGeneration,
    )

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg_kwargs = {**DEMO_T5, **config}
    tied = cfg_kwargs.pop("tie_word_embeddings")
    cfg_cls, model_cls = ((UMT5Config, UMT5ForConditionalGeneration) if umt5 else
                          (MT5Config, MT5ForConditionalGeneration) if mt5 else
                          (T5Config, T5ForConditionalGeneration))
    hf_config = cfg_cls(decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                        initializer_factor=init_scale, tie_word_embeddings=tied, **cfg_kwargs)
    torch.manual_seed(seed)
    model = model_cls(hf_config).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        state.pop(k, None)
    state["shared.weight"] = state["shared.weight"] * embed_scale
    if tied:
        state.pop("lm_head.weight", None)
    else:
        # an untied head of its own (transformers 5 ties it at init whatever the config says)
        g = torch.Generator().manual_seed(seed + 1)
        std = init_scale * hf_config.d_model**-0.5
        state["lm_head.weight"] = torch.randn(state["shared.weight"].shape, generator=g) * std
    torch_dtype = getattr(torch, dtype)
    state = {k: v.to(torch_dtype) for k, v in state.items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = hf_config.to_dict()
    cfg.update(architectures=[model_cls.__name__], tie_word_embeddings=tied,
               scale_decoder_outputs=tied, dtype=dtype)
    cfg.pop("torch_dtype", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    if with_tokenizer:
        for f in T5_TOKENIZER.iterdir():
            shutil.copy(f, out / f.name)
    (out / "README.md").write_text(
        "A tiny T5 v1.1-architecture checkpoint with RANDOM weights, written by "
        "`seq2serve demo-checkpoint`. Its output is meaningless text; it exists for smoke "
        "runs and tests. The tokenizer is the real T5 vocabulary (Apache-2.0).\n")
    return out


DEMO_PEGASUS = dict(vocab_size=32128, d_model=64, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                    decoder_ffn_dim=128, activation_function="relu", scale_embedding=True,
                    max_position_embeddings=512, tie_word_embeddings=True)


def vary_weights(model, seed: int):
    """Random weights at a scale where a tiny BART-family model's outputs vary with its input:
    LayerNorms near 1 (biases near 0), other vectors small, matrices of unit output scale
    (HF's init_std of 0.02 makes every source give the same tokens); sinusoids untouched."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:  # a computed table (Pegasus's sinusoids)
                continue
            if "layernorm" in name or "layer_norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0)
                        + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / p.shape[-1] ** 0.5)
    return g  # for the caller's further draws


def write_pegasus_checkpoint(out: str | Path, *, seed: int = 0, dtype: str = "float32",
                             eos_bias: float = 0.0, embed_scale: float = 1.0,
                             **config) -> Path:
    """Write a random Pegasus checkpoint (HF's save_pretrained) with the T5 tokenizer, whose
    ids agree with Pegasus's (pad 0 starts the decoder, EOS 1). `config` overrides
    DEMO_PEGASUS's fields; `eos_bias` raises EOS's logit (final_logits_bias) so that outputs
    end at different lengths; `embed_scale` multiplies the embedding (large embeddings under a
    tied head repeat the previous token)."""
    import torch
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    out = Path(out)
    hf_config = PegasusConfig(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                              forced_eos_token_id=1, **{**DEMO_PEGASUS, **config})
    torch.manual_seed(seed)
    model = PegasusForConditionalGeneration(hf_config).eval()
    g = vary_weights(model, seed)
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5, generator=g)
        model.model.shared.weight.mul_(embed_scale)
        model.final_logits_bias[0, hf_config.eos_token_id] += eos_bias
    model.to(getattr(torch, dtype)).save_pretrained(str(out))
    for f in T5_TOKENIZER.iterdir():
        shutil.copy(f, out / f.name)
    return out


DEMO_T5GEMMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    query_pre_attn_scalar=16, sliding_window=8, attn_logit_softcapping=50.0,
                    final_logit_softcapping=30.0)


def write_t5gemma_checkpoint(out: str | Path, *, seed: int = 0, dtype: str = "float32",
                             eos_factor: float = 1.0, tie_word_embeddings: bool = True,
                             embed_scale: float = 0.15, vocab_size: int = 32128,
                             encoder: dict | None = None, decoder: dict | None = None) -> Path:
    """Write a random T5Gemma checkpoint with the T5 tokenizer (EOS 1, pad 0; the decoder
    starts from BOS 2). `encoder` / `decoder` override DEMO_T5GEMMA's fields in that stack;
    `eos_factor` scales an untied head's EOS row so that outputs end at different lengths;
    `embed_scale` multiplies the embeddings (Gemma scales them up by the square root of the
    width, and large ones under a tied head repeat the previous token); `vocab_size` the
    embeddings' rows (an odd one pads the last tensor-parallel rank's)."""
    import torch
    from transformers import T5GemmaConfig, T5GemmaForConditionalGeneration

    out = Path(out)
    stacks = [dict(DEMO_T5GEMMA, vocab_size=vocab_size, **(over or {}))
              for over in (encoder, decoder)]
    hf_config = T5GemmaConfig(encoder=stacks[0], decoder=stacks[1], vocab_size=vocab_size,
                              bos_token_id=2, eos_token_id=1, pad_token_id=0,
                              tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(seed)
    model = T5GemmaForConditionalGeneration(hf_config).eval()
    vary_weights(model, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # the layernorms and each stack's last norm
                p.mul_(0.2)  # Gemma's norms multiply by 1 + weight: factors near 1
        for stack in (model.model.encoder, model.model.decoder):
            stack.embed_tokens.weight.mul_(embed_scale)
        if not tie_word_embeddings:
            model.lm_head.out_proj.weight[hf_config.eos_token_id] *= eos_factor
    model.to(getattr(torch, dtype)).save_pretrained(str(out))
    for f in T5_TOKENIZER.iterdir():
        shutil.copy(f, out / f.name)
    return out


DEMO_LLAMA = dict(vocab_size=128256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                  rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=128000,
                  eos_token_id=128009,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 256})


def write_llama_checkpoint(out: str | Path, *, seed: int = 0, dtype: str = "float32",
                           init_scale: float = 1.0, **config) -> Path:
    """Write a random Llama 3-style checkpoint with the real Llama 3 tokenizer (random weights).

    `config` overrides DEMO_LLAMA's fields; `init_scale` multiplies HF's initializer range.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg_kwargs = {**DEMO_LLAMA, **config}
    hf_config = LlamaConfig(initializer_range=0.02 * init_scale, **cfg_kwargs)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(hf_config).eval()
    state = {k: v.contiguous().to(getattr(torch, dtype)) for k, v in model.state_dict().items()}
    if cfg_kwargs["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = hf_config.to_dict()
    cfg.update(architectures=["LlamaForCausalLM"], dtype=dtype)
    cfg.pop("torch_dtype", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    for f in LLAMA3_TOKENIZER.iterdir():
        shutil.copy(f, out / f.name)
    return out


MLLAMA_CHAT_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}"
    "{%- for part in message['content'] %}{%- if part['type'] == 'image' %}{{- '<|image|>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}"
    "{%- endif %}{{- '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)

DEMO_MLLAMA_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_global_layers=1, attention_heads=2, image_size=28, patch_size=14,
                          max_num_tiles=4, intermediate_layers_indices=[0, 1],
                          vision_output_dim=96)
DEMO_MLLAMA_TEXT = dict(vocab_size=128256, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        cross_attention_layers=[1, 3], max_position_embeddings=2048,
                        eos_token_id=128009, bos_token_id=128000, pad_token_id=128004,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                         "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 256})


def write_mllama_checkpoint(out: str | Path, *, seed: int = 0, dtype: str = "float32",
                            init_scale: float = 10.0, vision: dict | None = None,
                            text: dict | None = None) -> Path:
    """Write a tiny random Mllama checkpoint: the real Llama 3 tokenizer plus <|image|> (id
    128256) and a chat template for image parts, a small-image MllamaImageProcessor, and every
    gate opened to a random value so that images change the output."""
    import torch
    from safetensors.torch import save_file
    from transformers import (
        MllamaConfig,
        MllamaForConditionalGeneration,
        MllamaImageProcessor,
        PreTrainedTokenizerFast,
    )

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vcfg = {**DEMO_MLLAMA_VISION, **(vision or {}), "initializer_range": 0.02 * init_scale}
    tcfg = {**DEMO_MLLAMA_TEXT, **(text or {}), "initializer_range": 0.02 * init_scale}
    hf_config = MllamaConfig(vision_config=vcfg, text_config=tcfg, image_token_index=128256)
    torch.manual_seed(seed)
    model = MllamaForConditionalGeneration(hf_config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    state = {}
    for k, v in model.state_dict().items():
        if "gate" in k and v.numel() == 1:  # opened: +-(0.5 .. 1.5)
            sign = 1.0 if torch.rand(1, generator=g).item() < 0.75 else -1.0
            v = sign * (0.5 + torch.rand(1, generator=g))
        state[k] = v.contiguous().to(getattr(torch, dtype))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = hf_config.to_dict()
    cfg.update(architectures=["MllamaForConditionalGeneration"], dtype=dtype)
    cfg.pop("torch_dtype", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    tok = PreTrainedTokenizerFast.from_pretrained(str(LLAMA3_TOKENIZER))
    tok.add_tokens(["<|image|>"], special_tokens=True)
    assert tok.convert_tokens_to_ids("<|image|>") == 128256
    tok.chat_template = MLLAMA_CHAT_TEMPLATE
    tok.save_pretrained(str(out))
    size = vcfg["image_size"]
    MllamaImageProcessor(size={"height": size, "width": size},
                            max_image_tiles=vcfg["max_num_tiles"]).save_pretrained(str(out))
    return out


DEMO_MARIAN = ASSETS / "demo-marian-en-de"
DEMO_MODEL = ASSETS / "demo-t5-numbers"


def default_demo_path() -> Path:
    """The bundled demo model: a tiny T5 trained (scripts/train_demo.py) to write numbers in
    English words ("translate digits to English: 1984")."""
    if not (DEMO_MODEL / "model.safetensors").is_file():
        raise ValueError(f"the bundled demo model is missing from {DEMO_MODEL}")
    return DEMO_MODEL


def demo_translation_path() -> Path:
    """The bundled demo translation model: a small Marian trained (scripts/train_marian_demo.py)
    to translate a controlled English into German (tests/toy_translation.py)."""
    if not (DEMO_MARIAN / "model.safetensors").is_file():
        raise ValueError(f"the bundled demo translation model is missing from {DEMO_MARIAN}")
    return DEMO_MARIAN
