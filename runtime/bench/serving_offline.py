"""`bench serving --compare-offline`: the offline engine (`Seq2SeqEngine`, no HTTP) on the
server's model and the same workload, after the load, in the same run: what the server costs
over the engine it wraps. The model path comes from the server's /get_model_info. On a GPU
the server still holds its memory: give the engine what is left (`mem_fraction` is the share
of the device that may be in use once the pools are made: with a server at `--mem-fraction
0.45`, `--engine-args '{"mem_fraction": 0.9}'`)."""

from __future__ import annotations

import time

from seq2serve.runtime.bench.step_stats import window


def compare_offline(base_url: str, prompts: list[str] | list[dict] | list[bytes],
                    output_len: int, concurrency: int | None, engine_args: dict,
                    num_beams: int = 1,
                    warmup_prompts: list[str] | list[dict] | list[bytes] | None = None
                    ) -> dict:
    """The engine's output tokens/s over `prompts`, all submitted at once with at most
    `concurrency` requests running (None: all; with beams, that many times num_beams rows),
    after a warm-up: `warmup_prompts` as the server's warm-up sent them (None: two short
    requests). Audio files (bytes) go in as `audio_data` with the server's decoder prompt
    (English, no timestamps) and exactly `output_len` tokens each. Chat messages (dicts) go
    in as the chat endpoint hands them to generate (`Seq2SeqEngine.chat_inputs`: the
    template applied, or Florence-2's task), their images with them, in one call."""
    import httpx

    from seq2serve import Seq2SeqEngine

    info = httpx.get(base_url.rstrip("/") + "/get_model_info", timeout=60).json()
    running = (concurrency or len(prompts)) * num_beams
    sp = {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}
    if num_beams > 1:
        sp["num_beams"] = num_beams
    opts = {"max_running_requests": running, **engine_args}
    if isinstance(prompts[0], dict):  # (the engine's caller: all its images in one call)
        opts.setdefault("max_images_per_call", max(64, len(prompts)))
    inputs = lambda p: {"prompt": p}  # noqa: E731
    if isinstance(prompts[0], bytes):
        from seq2serve.runtime.frontend.transcription import WhisperPrompt

        whisper = WhisperPrompt.from_model(info["model_path"])
        ids = whisper.tokens("en" if whisper.is_multilingual else None)
        sp = {**sp, "ignore_eos": False, "min_new_tokens": output_len}
        inputs = lambda p: {"audio_data": p, "decoder_input_ids": [ids] * len(p)}  # noqa: E731
    with Seq2SeqEngine(model_path=info["model_path"], **opts) as engine:
        if isinstance(prompts[0], dict):
            inputs = lambda p: _chat_batch(engine, p)  # noqa: E731
        if warmup_prompts:
            engine.generate(**inputs(warmup_prompts), sampling_params=sp)
        else:
            engine.generate(**inputs(prompts[:2]), sampling_params={
                **sp, "max_new_tokens": 2, "min_new_tokens": 0})
        engine.flush_cache()
        before, start = engine.stats(), time.perf_counter()
        outs = engine.generate(**inputs(prompts), sampling_params=sp)
        seconds = time.perf_counter() - start
        scheduler = window(before, engine.stats(), seconds)
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"model_path": info["model_path"], "engine_args": opts, "seconds": seconds,
            "output_tokens": tokens, "output_tokens_per_s": tokens / seconds,
            "requests_per_s": len(outs) / seconds, "scheduler": scheduler}


def _chat_batch(engine, messages: list[dict]) -> dict:
    """One generate call's inputs for one user message a request (`chat_inputs` each)."""
    each = [engine.chat_inputs([m]) for m in messages]
    key = "input_ids" if "input_ids" in each[0] else "text"
    return {"prompt" if key == "text" else key: [e[key] for e in each],
            "image_data": [e.get("image_data") or [] for e in each]}
