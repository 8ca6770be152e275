"""A llama.cpp GGUF file -> a Hugging Face Llama checkpoint directory that seq2serve serves.

Written: `config.json` (every architecture field from the GGUF metadata), `model.safetensors`
(the weights dequantized, Q/K rows put back in HF's rotary layout), `tokenizer.json` and
`tokenizer_config.json` (the byte-level BPE vocabulary, merges, special tokens and chat
template from the metadata) and `generation_config.json` (the end-of-turn ids).

The GGUF is read with the `gguf` package's `GGUFReader` and `gguf.quants.dequantize`, nothing
else: no model is instantiated, tensors are converted one at a time, and the result does not
depend on transformers' GGUF integration, which has changed shape across releases and needs
accelerate to load weights.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16")

# llama.cpp's names -> HF Llama's (one decoder layer's tensors under blk.N.)
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight$")
_ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+: per-frequency divisors instead of rope_scaling

# Byte-level BPE pre-tokenizers by llama.cpp's `tokenizer.ggml.pre`, as the original
# tokenizer.json files define them: (split regex or None, split digits one by one,
# ignore_merges).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_TOKENIZERS = {
    "smollm": (None, True, False),      # Digits(individual) + GPT-2's ByteLevel regex
    "gpt-2": (None, False, False),
    "llama-bpe": (_LLAMA3_SPLIT, False, True),
    "llama3": (_LLAMA3_SPLIT, False, True),
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, *, dtype: str = "float32") -> Path:
    """Convert a Llama-architecture GGUF file into an HF checkpoint directory `out_dir`.

    `dtype` is the weights' dtype in model.safetensors: float32 (the default) holds every
    dequantized value exactly; bfloat16 / float16 halve the size at one more rounding.
    A ValueError names the problem: a missing file, not a GGUF, an architecture, tensor,
    quantization, rope scaling or tokenizer this converter does not handle.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    reader = _open(gguf_path)
    meta = {name: _field_value(field) for name, field in reader.fields.items()}
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf_path}: architecture {arch!r} is not supported (only 'llama')")
    tensors = {t.name: t for t in reader.tensors}
    config = hf_config(meta, tensors)
    config["dtype"] = dtype
    # everything is built before anything is written: a refused file leaves no directory
    state = _state_dict(tensors, config, dtype)
    tokenizer, tokenizer_config = build_tokenizer(meta, config["max_position_embeddings"])

    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", _generation_config(meta, config))
    logger.info("converted %s (%d tensors) to %s", gguf_path, len(tensors), out)
    return out


def describe_gguf(gguf_path: str | Path) -> str:
    """One line about a GGUF file: its model name and how its tensors are stored."""
    from collections import Counter

    reader = _open(gguf_path)
    name = reader.fields.get("general.name")
    kinds = Counter(t.tensor_type.name for t in reader.tensors)
    stored = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
    return f"{_field_value(name) if name else 'unnamed'}: {len(reader.tensors)} tensors, {stored}"


def _open(gguf_path: str | Path):
    try:
        import gguf
    except ImportError as e:
        raise ValueError("converting GGUF files needs the gguf package: "
                         "pip install 'seq2serve[gguf]'") from e
    path = Path(gguf_path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError, OSError) as e:  # a truncated or unreadable file
        raise ValueError(f"{path}: cannot read the GGUF file: {e}") from e


def _field_value(field) -> Any:
    value = field.contents()
    return value.tolist() if hasattr(value, "tolist") else value


def hf_config(meta: dict[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    """config.json for LlamaForCausalLM from the GGUF metadata (`llama.*`, `tokenizer.ggml.*`)
    and the tensor list (a missing `output.weight` means tied embeddings)."""
    def get(key: str, default: Any = ...) -> Any:
        value = meta.get(f"llama.{key}", default)
        if value is ...:
            raise ValueError(f"the GGUF metadata has no 'llama.{key}'")
        if isinstance(value, list):
            raise ValueError(f"'llama.{key}' varies by layer ({value[:4]}...): not supported")
        return value

    if get("expert_count", 0):
        raise ValueError("mixture-of-experts Llama GGUFs are not supported")
    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = get("attention.key_length", hidden // heads)
    if get("attention.value_length", head_dim) != head_dim:
        raise ValueError("the GGUF has different key and value head sizes: not supported")
    if get("rope.dimension_count", head_dim) != head_dim:
        raise ValueError(f"rope over {get('rope.dimension_count')} of {head_dim} head "
                         "dimensions (partial rotary) is not supported")
    vocab = get("vocab_size", None) or len(meta.get("tokenizer.ggml.tokens") or []) or int(
        tensors["token_embd.weight"].shape[-1])
    theta = _float32(get("rope.freq_base", 10000.0))
    context = get("context_length")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _float32(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(meta, tensors, head_dim, theta),
        "max_position_embeddings": context,
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    return config


def _float32(value: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99e-06)."""
    import numpy as np

    return float(str(np.float32(value)))


def _rope_scaling(meta: dict[str, Any], tensors: dict[str, Any], head_dim: int,
                  theta: float) -> dict[str, Any] | None:
    kind = meta.get("llama.rope.scaling.type", "none")
    if kind == "linear" and meta.get("llama.rope.scaling.factor", 1.0) == 1.0:
        kind = "none"
    if kind != "none":
        raise ValueError(f"rope scaling {kind!r} is not supported (seq2serve serves plain and "
                         "Llama 3 rope)")
    if _ROPE_FREQS not in tensors:
        return None
    return _llama3_scaling(_dequantize(tensors[_ROPE_FREQS]).ravel(), head_dim, theta)


def _llama3_scaling(divisors, head_dim: int, theta: float) -> dict[str, Any]:
    """Recover rope_scaling from llama.cpp's rope_freqs tensor (inv_freq / divisor per pair).

    llama.cpp stores only the divisors; every Llama 3.1+ release uses low 1, high 4 and an
    original context of 8192, with `factor` the largest divisor. Anything else is refused
    rather than guessed."""
    import numpy as np
    import torch

    from seq2serve.models.rotary import rope_inv_freq

    divisors = torch.from_numpy(np.array(divisors, dtype=np.float32))
    scaling = {"rope_type": "llama3", "factor": float(divisors.max()), "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    plain = rope_inv_freq(head_dim, theta, None)
    expected = plain / rope_inv_freq(head_dim, theta, scaling)
    if divisors.shape != expected.shape or not torch.allclose(divisors, expected, rtol=1e-4):
        raise ValueError(f"{_ROPE_FREQS} does not match Llama 3 rope scaling with factor "
                         f"{scaling['factor']:g}, low 1, high 4, original context 8192")
    return scaling


def _hf_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_TENSOR.match(name)
    if m and m[2] in _LAYER_NAMES:
        return f"model.layers.{m[1]}.{_LAYER_NAMES[m[2]]}.weight"
    raise ValueError(f"GGUF tensor {name!r} has no Llama counterpart (biases, experts and other "
                     "extras are not supported)")


def _dequantize(t):
    """A tensor's values as float32 numpy, shaped as PyTorch would (GGUF lists dims
    innermost first)."""
    from importlib.metadata import version

    import gguf

    try:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError as e:
        raise ValueError(f"tensor {t.name!r}: quantization {t.tensor_type.name} is not "
                         f"supported by gguf {version('gguf')}") from e
    return values.reshape(tuple(int(n) for n in reversed(t.shape)))


def _unpermute_rotary(w, n_heads: int):
    """Undo llama.cpp's Q/K row order: it interleaves each head's two rotary halves (GPT-J
    style) where HF keeps them as the first and second half of the head."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _state_dict(tensors: dict[str, Any], config: dict[str, Any], dtype: str) -> dict[str, Any]:
    """HF-named, dequantized tensors, checked against the shapes the metadata implies."""
    import torch
    from tqdm import tqdm

    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    state = {}
    for name, t in tqdm(tensors.items(), desc="dequantizing", unit="tensor", disable=None):
        if name == _ROPE_FREQS:
            continue  # folded into config.json's rope_scaling
        hf_name = _hf_name(name)
        values = _dequantize(t)
        m = _LAYER_TENSOR.match(name)
        if m and m[2] in heads:
            values = _unpermute_rotary(values, heads[m[2]])
        state[hf_name] = torch.from_numpy(values.copy()).to(getattr(torch, dtype))
    expected = _expected_shapes(config)
    for hf_name, shape in expected.items():
        if hf_name not in state:
            raise ValueError(f"the GGUF has no tensor for {hf_name}")
        if tuple(state[hf_name].shape) != shape:
            raise ValueError(f"{hf_name}: shape {tuple(state[hf_name].shape)} in the GGUF, "
                             f"{shape} expected from its metadata")
    return state


def _expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    h, f, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], h), "model.norm.weight": (h,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], h)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes.update({f"{p}.input_layernorm.weight": (h,),
                       f"{p}.post_attention_layernorm.weight": (h,),
                       f"{p}.self_attn.q_proj.weight": (q, h),
                       f"{p}.self_attn.k_proj.weight": (kv, h),
                       f"{p}.self_attn.v_proj.weight": (kv, h),
                       f"{p}.self_attn.o_proj.weight": (h, q),
                       f"{p}.mlp.gate_proj.weight": (f, h), f"{p}.mlp.up_proj.weight": (f, h),
                       f"{p}.mlp.down_proj.weight": (h, f)})
    return shapes


def build_tokenizer(meta: dict[str, Any], max_length: int):
    """(tokenizers.Tokenizer, tokenizer_config dict) from the `tokenizer.*` metadata of a
    byte-level BPE GGUF (GPT-2 style: SmolLM, Llama 3)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if kind != "gpt2":
        raise ValueError(f"tokenizer {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(f"pre-tokenizer {pre!r} is not supported "
                         f"(supported: {', '.join(sorted(_PRE_TOKENIZERS))})")
    split, digits, ignore_merges = _PRE_TOKENIZERS[pre]
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges,
                               ignore_merges=ignore_merges))
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if split:
        steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    else:
        steps += [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, k in zip(tokens, types) if k == _USER_DEFINED])

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")  # key: bos, eos, unknown, padding
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos, eos = token("bos"), token("eos")
    template = [] if not meta.get("tokenizer.ggml.add_bos_token") or bos is None else [bos]
    steps = [processors.ByteLevel(trim_offsets=False)]
    if template or meta.get("tokenizer.ggml.add_eos_token"):
        tail = [eos] if meta.get("tokenizer.ggml.add_eos_token") and eos else []
        specials = [(t, tokens.index(t)) for t in dict.fromkeys(template + tail)]
        steps.append(processors.TemplateProcessing(
            single=template + ["$A"] + tail, pair=template + ["$A"] + tail + template + ["$B:1"]
            + tail, special_tokens=specials))
    tok.post_processor = steps[0] if len(steps) == 1 else processors.Sequence(steps)

    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
              "clean_up_tokenization_spaces": False}
    for key, name in (("bos", "bos"), ("eos", "eos"), ("unknown", "unk"), ("padding", "pad")):
        if token(key) is not None:
            config[f"{name}_token"] = token(key)
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    return tok, config


def _generation_config(meta: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Every id that ends a turn: eos plus Llama 3's end-of-turn / end-of-message ids."""
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    eos = [int(i) for i in dict.fromkeys(eos) if i is not None]
    gen: dict[str, Any] = {"bos_token_id": config["bos_token_id"],
                           "eos_token_id": eos[0] if len(eos) == 1 else eos,
                           "pad_token_id": config["pad_token_id"]}
    return {k: v for k, v in gen.items() if v is not None and v != []}


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
