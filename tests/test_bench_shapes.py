"""The benchmark shapes (runtime/bench/shapes.py) as HF and seq2serve read them: every shape's
directory loads in both with the same vocabulary and end-of-sequence token, and Florence-2's
workload gives HF the input its processor would (as many image placeholders as seq2serve
counts image tokens, pixels of the processor's size)."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from seq2serve.encoders.image_processor import feature_grid
from seq2serve.runtime.bench.hardware import decoder_step_bytes
from seq2serve.runtime.bench.hf_baseline import hf_inputs
from seq2serve.runtime.bench.shapes import SHAPES, write_shape
from seq2serve.runtime.bench.workload import Workload, make_requests
from seq2serve.runtime.config.model_config import ModelConfig


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shape_reads_alike_in_hf_and_seq2serve(tmp_path, shape):
    path = write_shape(shape, tmp_path / shape)
    ours = ModelConfig.from_path(str(path))
    hf = AutoConfig.from_pretrained(str(path))
    text = hf.get_text_config(decoder=True)
    assert ours.vocab_size == text.vocab_size
    eos = text.eos_token_id if text.eos_token_id is not None else hf.eos_token_id
    assert eos in ours.eos_token_ids
    # a decode step reads at least the head's rows
    assert decoder_step_bytes(ours.arch) > 2 * text.vocab_size * text.get_text_config().hidden_size
    image_token = getattr(hf, "image_token_id", None) or getattr(hf, "image_token_index", None)
    if image_token is not None:  # HF embeds the placeholder: it must be in the vocabulary
        assert image_token == ours.arch.frontend_info()["image_token_id"]


def test_florence_workload_is_hf_processor_input(tmp_path):
    path = str(write_shape("florence-2-large", tmp_path / "florence"))
    mc = ModelConfig.from_path(path)
    info = mc.arch.frontend_info()
    rows, cols = feature_grid((768, 768), info["image_stages"])
    image_tokens = rows * cols + info["image_extra_tokens"]
    assert image_tokens == 577  # Florence-2-large's 24 x 24 grid and its pooled token
    reqs = make_requests(Workload(3, 12, 4, image_size=768), mc.vocab_size, True,
                         info["image_token_id"], eos=mc.eos_token_ids[0])
    assert all(r.image is not None and r.input_ids[0] == 0 and r.input_ids[-1] == 2
               and len(r.input_ids) == 12 for r in reqs)
    inputs = hf_inputs(path, reqs, "cpu")
    assert inputs["pixel_values"].shape == (3, 3, 768, 768)
    ids = inputs["input_ids"]
    assert ids.shape == (3, image_tokens + 12)
    assert (ids[:, :image_tokens] == info["image_token_id"]).all()
    assert ids[:, image_tokens:].tolist() == [r.input_ids for r in reqs]
    assert info["image_token_id"] < AutoConfig.from_pretrained(path).text_config.vocab_size


def _tiny_whisper_shape(tmp_path, monkeypatch) -> str:
    """whisper-large-v3's directory as write_shape makes it (its 51,866-id tokenizer, prompt,
    suppressed tokens and feature extractor), with the layers shrunk and random weights saved
    at a scale whose outputs vary with the audio: the same weights for the engine and HF."""
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

    from seq2serve.runtime.tools.demo_checkpoint import vary_weights

    tiny = {**SHAPES["whisper-large-v3"], "d_model": 64, "encoder_layers": 2,
            "decoder_layers": 2, "encoder_attention_heads": 4,
            "decoder_attention_heads": 4, "encoder_ffn_dim": 96, "decoder_ffn_dim": 128,
            "max_target_positions": 48}
    monkeypatch.setitem(SHAPES, "whisper-tiny-bench", tiny)
    path = write_shape("whisper-tiny-bench", tmp_path / "whisper")
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(WhisperConfig.from_pretrained(str(path))).eval()
    vary_weights(model, seed=3)
    model.generation_config = GenerationConfig.from_pretrained(str(path))
    model.save_pretrained(str(path))
    return str(path)


@pytest.mark.long  # (~40-100 s: `bench offline` in a subprocess, then an engine and HF)
def test_whisper_bench_offline_runs_against_hf_and_decodes_as_hf(tmp_path, monkeypatch):
    """`bench offline` on a Whisper shape (shrunk; dummy weights, as --shape loads them), with
    HF's baseline at two batch sizes: every clip decoded for exactly output_len tokens, HF
    timed, the ratios and the encoder stage's FLOPs reported. Then the bench's own requests
    (30 s clips, Whisper's prompt) and sampling through the engine give HF `generate`'s
    greedy tokens on the same weights (the oracle of what the benchmark times)."""
    import json
    import subprocess
    import sys

    import torch
    from transformers import WhisperForConditionalGeneration

    from seq2serve import Seq2SeqEngine
    from seq2serve.runtime.bench.engine_bench import time_engine
    from seq2serve.runtime.bench.hardware import whisper_encoder_flops
    from seq2serve.runtime.bench.workload import audio_requests

    path = _tiny_whisper_shape(tmp_path, monkeypatch)
    n, out_len = 4, 6
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "-m", "seq2serve.runtime.cli", "bench", "offline",
                        "--model-path", path, "--engine-args", '{"load_format": "dummy"}',
                        "--device", "cpu", "--dtype", "float32", "--num-requests", str(n),
                        "--output-len", str(out_len), "--batch-sizes", str(n), "--baseline",
                        "hf", "--hf-modes", "default", "--hf-batch-size", "2,4",
                        "--json", str(out)], check=False, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(out.read_text())
    (ours,) = results["seq2serve"]
    assert ours["tokens"] == n * out_len and ours["tokens_per_s"] > 0
    assert results["workload"]["input_len"] == 4  # Whisper's prompt: start, en, transcribe, ...
    assert ours["encoder_inputs"] == n and ours["encoder_seconds"] > 0
    flops = whisper_encoder_flops(ModelConfig.from_path(path).arch)
    assert results["encoder_flops_per_clip"] == flops and flops["stage"] > flops["encoder"]
    assert ours["encoder_tflops_per_s"] == pytest.approx(
        n * flops["stage"] / ours["encoder_seconds"] / 1e12)
    assert set(results["feature_extraction"]) == {"seq2serve", "hf"}
    assert [h["batch_size"] for h in results["hf"]] == [2, 4]
    for h in results["hf"]:
        assert "error" not in h and h["tokens_per_s"] > 0
        assert h["seq2serve_ratio"] == pytest.approx(ours["tokens_per_s"] / h["tokens_per_s"])
    best = max(h["tokens_per_s"] for h in results["hf"])
    assert results["best_ratios"]["HF default"] == pytest.approx(ours["tokens_per_s"] / best)

    reqs = audio_requests(path, n)
    assert reqs[0].input_ids == [50258, 50259, 50360, 50364]  # large-v3's ids
    with Seq2SeqEngine(model_path=path, device="cpu", dtype="float32",
                       max_running_requests=n, context_length=4 + out_len + 8) as engine:
        got = time_engine(engine, reqs, out_len)["output_ids"]
    hf = WhisperForConditionalGeneration.from_pretrained(path).eval()
    with torch.no_grad():
        expected = hf.generate(**hf_inputs(path, reqs, "cpu"), max_new_tokens=out_len,
                               min_new_tokens=out_len, do_sample=False)
    assert got == expected[:, -out_len:].tolist()
    assert len({tuple(t) for t in got}) >= 2, "outputs should differ by clip"


def test_an_image_prompt_never_holds_the_image_token():
    """A small vocabulary whose last id is the image token (the tests' tiny Florence-2):
    the random prompt ids stay below it, as the engine refuses a placeholder in the prompt."""
    reqs = make_requests(Workload(64, 40, 4, image_size=8), 300, True, 299, eos=2)
    assert all(299 not in r.input_ids[1:-1] and max(r.input_ids[1:-1]) < 299 for r in reqs)


def test_florence_shape_tokenizer_makes_chat_prompts(tmp_path):
    """The served shape's chat prompts are BOS, the task's prompt, EOS (as HF's processor
    makes them); a tokenizer without a BOS token is refused by name, not with a TypeError."""
    from transformers import AutoTokenizer

    from seq2serve.runtime.frontend.image_prompts import task_prompt_ids

    path = str(write_shape("florence-2-large", tmp_path / "florence"))
    info = ModelConfig.from_path(path).arch.frontend_info()
    tok = AutoTokenizer.from_pretrained(path)
    ids = task_prompt_ids(tok, "what is here", info)
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id and len(ids) > 2
    assert tok.bos_token_id < AutoConfig.from_pretrained(path).text_config.vocab_size
    tok.bos_token = None
    with pytest.raises(ValueError, match="no BOS or EOS token"):
        task_prompt_ids(tok, "what is here", info)
