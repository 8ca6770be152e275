"""`bench serving --compare-offline`: the offline engine (`Seq2SeqEngine`, no HTTP) on the
server's model and the same workload, after the load, in the same run: what the server costs
over the engine it wraps. The model path comes from the server's /get_model_info. On a GPU
the server still holds its memory: give the engine what is left (`mem_fraction` is the share
of the device that may be in use once the pools are made: with a server at `--mem-fraction
0.45`, `--engine-args '{"mem_fraction": 0.9}'`)."""

from __future__ import annotations

import time


def compare_offline(base_url: str, prompts: list[str], output_len: int,
                    concurrency: int | None, engine_args: dict, num_beams: int = 1) -> dict:
    """The engine's output tokens/s over `prompts`, all submitted at once with at most
    `concurrency` requests running (None: all; with beams, that many times num_beams rows),
    after a short warm-up."""
    import httpx

    from seq2serve import Seq2SeqEngine

    info = httpx.get(base_url.rstrip("/") + "/get_model_info", timeout=60).json()
    running = (concurrency or len(prompts)) * num_beams
    sp = {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}
    if num_beams > 1:
        sp["num_beams"] = num_beams
    opts = {"max_running_requests": running, **engine_args}
    with Seq2SeqEngine(model_path=info["model_path"], **opts) as engine:
        engine.generate(prompts[:2], {**sp, "max_new_tokens": 2})
        engine.flush_cache()
        start = time.perf_counter()
        outs = engine.generate(prompts, sp)
        seconds = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"model_path": info["model_path"], "engine_args": opts, "seconds": seconds,
            "output_tokens": tokens, "output_tokens_per_s": tokens / seconds,
            "requests_per_s": len(outs) / seconds}
