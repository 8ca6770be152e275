"""Hugging Face transformers `generate` on the same model shape and workload: the baseline
every benchmark compares with in the same run ("default": dynamic cache; "static": static
cache with the forward compiled, HF's fastest documented configuration)."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

from seq2serve.runtime.bench.workload import BenchRequest


def load_hf_model(model_dir: str, dtype: torch.dtype, device: str = "cuda"):
    """A randomly initialised HF model of the directory's config, built on the device."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSeq2SeqLM,
        Florence2ForConditionalGeneration,
        GenerationConfig,
        MllamaForConditionalGeneration,
        WhisperForConditionalGeneration,
    )

    config = AutoConfig.from_pretrained(model_dir)
    kind = config.model_type
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    classes = {"mllama": MllamaForConditionalGeneration,
               "florence2": Florence2ForConditionalGeneration,
               "whisper": WhisperForConditionalGeneration}
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # a model class builds with _from_config, an Auto class not
            model = (classes[kind]._from_config(config, dtype=dtype) if kind in classes
                     else auto.from_config(config, dtype=dtype))
    finally:
        torch.set_default_dtype(previous)
    if kind == "whisper":  # its prompt, language and suppression settings, as from_pretrained
        model.generation_config = GenerationConfig.from_pretrained(model_dir)
    return model.eval()


def hf_inputs(model_dir: str, reqs: list[BenchRequest], device: str,
              dtype: torch.dtype = torch.float32) -> dict:
    """`generate`'s inputs for `reqs`, made as HF's processors make them (in the timed
    region: `bench_hf` times them with the generation)."""
    if reqs[0].audio is not None:
        return _audio_inputs(model_dir, reqs, device, dtype)
    if reqs[0].image is not None and _config(model_dir)["model_type"] == "florence2":
        return _image_prompt_inputs(model_dir, reqs, device)
    ids = torch.tensor([r.input_ids for r in reqs], device=device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if reqs[0].image is not None:
        from transformers import AutoImageProcessor
        from transformers.models.mllama.processing_mllama import (
            convert_sparse_cross_attention_mask_to_dense,
            get_cross_attention_token_mask,
        )

        proc = AutoImageProcessor.from_pretrained(model_dir)
        pix = proc(images=[[r.image] for r in reqs], return_tensors="pt")
        num_tiles = pix.pop("num_tiles")
        masks = [get_cross_attention_token_mask(r.input_ids, 128256) for r in reqs]
        mask = convert_sparse_cross_attention_mask_to_dense(masks, num_tiles,
                                                            proc.max_image_tiles, ids.shape[1])
        inputs.update({k: v.to(device) for k, v in pix.items()},
                      cross_attention_mask=torch.tensor(mask, device=device))
    return inputs


def _config(model_dir: str) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def _image_prompt_inputs(model_dir: str, reqs: list[BenchRequest], device: str) -> dict:
    """Florence-2 as its processor feeds it: the image's placeholder tokens (as many as its
    features), then the prompt."""
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(model_dir)
    pixels = proc(images=[r.image for r in reqs], return_tensors="pt")["pixel_values"]
    image_token = _config(model_dir)["image_token_id"]
    ids = torch.tensor([[image_token] * proc.image_seq_length + r.input_ids for r in reqs],
                       device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": pixels.to(device)}


@functools.cache
def _feature_extractor(model_dir: str):
    """The directory's, or (none there, as the runtime reads such a directory) Whisper's
    default for the model's mel bins."""
    from transformers import WhisperFeatureExtractor

    if (Path(model_dir) / "preprocessor_config.json").is_file():
        return WhisperFeatureExtractor.from_pretrained(model_dir)
    return WhisperFeatureExtractor(feature_size=_config(model_dir)["num_mel_bins"])


def _audio_inputs(model_dir: str, reqs: list[BenchRequest], device: str,
                  dtype: torch.dtype) -> dict:
    """Whisper as HF's model card runs it: `WhisperFeatureExtractor`'s log-mel of the batch
    (its torch path, on `device`), and the requests' decoder prompt as `decoder_input_ids`,
    its language and task named too (HF then detects no language and suppresses from the
    prompt's end, as the runtime does)."""
    feats = _feature_extractor(model_dir)([r.audio for r in reqs], sampling_rate=16_000,
                                          return_tensors="pt",
                                          device=str(device)).input_features
    prompt = reqs[0].input_ids
    inputs = {"input_features": feats.to(device, dtype),
              "decoder_input_ids": torch.tensor([r.input_ids for r in reqs], device=device)}
    names = _prompt_names(model_dir)
    if names is not None:  # a multilingual model's: its language and task tokens
        languages, tasks = names
        inputs.update(language=languages[prompt[1]], task=tasks[prompt[2]])
    return inputs


@functools.cache
def _prompt_names(model_dir: str) -> tuple[dict[int, str], dict[int, str]] | None:
    """Language code and task by token id (generation_config.json's), or None for an
    English-only model."""
    from transformers import GenerationConfig

    gen = GenerationConfig.from_pretrained(model_dir)
    if not getattr(gen, "is_multilingual", False):
        return None
    return ({i: tok[2:-2] for tok, i in gen.lang_to_id.items()},
            {i: task for task, i in gen.task_to_id.items()})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_hf(model, model_dir: str, reqs: list[BenchRequest], batch_size: int,
             output_len: int, mode: str, max_batches: int | None = None,
             num_beams: int = 1, warmup: bool = True) -> dict:
    """Output tokens/s of `generate` over `reqs` in batches (timing `max_batches` batches and
    the image preprocessing or the audio's log-mel features, if any, and extrapolating to
    all of them); `warmup=False` on a model this already ran (`bench offline --repeats`)
    skips the untimed first batch."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    if mode == "static":
        # generate compiles the decoding forward itself when the cache is static
        model.generation_config.cache_implementation = "static"
    gen = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False,
               num_beams=num_beams)
    batches = [reqs[i:i + batch_size] for i in range(0, len(reqs), batch_size)]
    batches = [b for b in batches if len(b) == batch_size] or batches
    with torch.no_grad():
        t0 = time.perf_counter()
        if warmup:
            model.generate(**hf_inputs(model_dir, batches[0], device, dtype), **gen)  # compile
            _sync(device)
        warmup_s = time.perf_counter() - t0
        timed = batches[1: 1 + (max_batches or len(batches))] or batches[:1]
        start = time.perf_counter()
        for b in tqdm(timed, desc=f"HF generate ({mode})", unit="batch", disable=None):
            model.generate(**hf_inputs(model_dir, b, device, dtype), **gen)
        _sync(device)
        elapsed = time.perf_counter() - start
    tokens = sum(len(b) for b in timed) * output_len
    return {"mode": mode, "batch_size": batch_size, "num_beams": num_beams,
            "tokens_per_s": tokens / elapsed,
            "ms_per_step": elapsed / len(timed) / output_len * 1e3,
            "timed_batches": len(timed), "warmup_s": warmup_s}
