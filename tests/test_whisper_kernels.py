"""Whisper on the runtime's Triton kernels: interpreted on the CPU against the torch_native
reference (the encoder attention over 1,500-position windows, the cross-attention decode
and extend kernels), and, on a CUDA machine (`pytest -m gpu`), against HF with CUDA graphs
on and off. Kept apart from tests/test_whisper.py: the interpreter takes ~20 s here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seq2serve.tests.helpers import make_scheduler, request, run_to_completion
from seq2serve.tests.whisper_checkpoints import clip, write_whisper_checkpoint

pytest.importorskip("soundfile")
pytest.importorskip("soxr")

PROMPT_LANGUAGE = "de"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    return str(write_whisper_checkpoint("multilingual", tmp_path_factory.mktemp("w") / "m",
                                        seed=5))


def _features(path: str, seeds) -> list:
    from seq2serve.encoders.audio_features import AudioProcessor
    from seq2serve.runtime.config.model_config import ModelConfig

    arch = ModelConfig.from_path(path).arch
    processor = AudioProcessor(path, path, arch.num_mel_bins, arch.max_source_positions)
    return [processor(clip(s)) for s in seeds]


def _run(path: str, features: list, max_new: int, ops=None, **kwargs) -> dict[str, list[int]]:
    from seq2serve.models.ops import use_ops
    from seq2serve.runtime.frontend.transcription import WhisperPrompt

    prompt = WhisperPrompt.from_model(path).tokens(PROMPT_LANGUAGE)
    sched = make_scheduler(path, page_size=4, **kwargs)
    if ops is not None:
        use_ops(sched.worker.model_runner.model, ops)
    for i, f in enumerate(features):
        tr = request(str(i), [], prompt, max_new_tokens=max_new)
        tr.encoder_inputs = [f]
        sched.add_request(tr)
    return run_to_completion(sched)


@pytest.mark.long  # (~55 s interpreted; the GPU check runs Whisper on the Triton kernels)
def test_triton_interpreted_matches_torch_native(ckpt):
    """The Triton attention kernels and the Triton ops (the biased GEMV of one decode row,
    LayerNorm) against the reference."""
    from seq2serve.models.ops import TritonOps

    features = _features(ckpt, [0])
    assert _run(ckpt, features, 3, TritonOps(gemv_blocks=(1024, 64)),
                attention_backend="triton") == \
        _run(ckpt, features, 3, attention_backend="torch_native")


def _hf_greedy(path: str, seeds, max_new: int) -> dict[str, list[int]]:
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    extractor = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    out = {}
    for i, s in enumerate(seeds):
        f = extractor(clip(s), sampling_rate=16_000, return_tensors="pt").input_features
        with torch.no_grad():
            out[str(i)] = model.generate(f, language=PROMPT_LANGUAGE, task="transcribe",
                                         max_new_tokens=max_new)[0].tolist()
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_whisper_matches_hf_with_graphs_on_the_gpu(ckpt):
    """float32 on the Triton backend with CUDA graphs, batched: HF's tokens; bfloat16 with
    graphs equals bfloat16 without."""
    seeds = [0, 1, 2, 5]
    features = _features(ckpt, seeds)
    got = _run(ckpt, features, 10, device="cuda", dtype="float32", attention_backend="triton")
    assert got == _hf_greedy(ckpt, seeds, 10)
    graphs = _run(ckpt, features, 10, device="cuda", dtype="bfloat16")
    eager = _run(ckpt, features, 10, device="cuda", dtype="bfloat16", disable_cuda_graph=True)
    assert graphs == eager


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_whisper_engine_starts_and_transcribes_on_the_gpu(ckpt):
    """The engine's start-up encodes a silent window (the encoder's kernels compiled before
    the first request), then serves audio bytes."""
    from seq2serve.runtime.frontend.engine import Seq2SeqEngine
    from seq2serve.runtime.frontend.transcription import WhisperPrompt
    from seq2serve.tests.whisper_checkpoints import encoded

    prompt = WhisperPrompt.from_model(ckpt).tokens(PROMPT_LANGUAGE)
    with Seq2SeqEngine(model_path=ckpt, device="cuda", dtype="float32") as engine:
        out = engine.generate(audio_data=encoded(clip(0), 16_000, "WAV", "FLOAT"),
                              decoder_input_ids=prompt,
                              sampling_params={"max_new_tokens": 10, "temperature": 0})
    assert out["output_ids"] == _hf_greedy(ckpt, [0], 10)["0"]


def test_checkpoint_problems_are_named(ckpt, tmp_path):
    """A missing tensor is named; a config whose encoder is not 30 s windows is refused."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from seq2serve.models.loader import load_model
    from seq2serve.runtime.config.model_config import ModelConfig

    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    tensors = load_file(str(Path(ckpt) / "model.safetensors"))
    del tensors["model.decoder.layers.1.encoder_attn.v_proj.bias"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="missing tensor.*decoder.layers.1.encoder_attn.v_proj"):
        load_model(ModelConfig.from_path(str(broken)), "cpu", torch.float32)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["max_source_positions"] = 750
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="max_source_positions 750.*30 s windows"):
        ModelConfig.from_path(str(broken))


def test_tp2_matches_hf_on_the_cpu(ckpt):
    """Tensor parallelism over two CPU ranks (gloo): each rank runs its heads and
    feed-forward channels of the encoder and decoder, the cross K/V of its heads."""
    from seq2serve.runtime.frontend.engine import Seq2SeqEngine
    from seq2serve.runtime.frontend.transcription import WhisperPrompt

    prompt = WhisperPrompt.from_model(ckpt).tokens(PROMPT_LANGUAGE)
    seeds = [0, 1]
    with Seq2SeqEngine(model_path=ckpt, device="cpu", dtype="float32", tp_size=2,
                       max_total_tokens=1024, max_cross_tokens=4096) as engine:
        assert engine.stats()["tp_devices"] == ["cpu", "cpu"]
        got = engine.generate(audio_data=[clip(s) for s in seeds], decoder_input_ids=prompt,
                              sampling_params={"max_new_tokens": 8, "temperature": 0})
        engine.check_integrity()
    expected = _hf_greedy(ckpt, seeds, 8)
    assert [r["output_ids"] for r in got] == [expected[str(i)] for i in range(len(seeds))]
