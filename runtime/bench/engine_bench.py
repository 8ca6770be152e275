"""seq2serve's side of the benchmarks: the engine on a model directory and a workload."""

from __future__ import annotations

import time

from seq2serve.runtime.bench.step_stats import gc_delta, step_times
from seq2serve.runtime.bench.workload import BenchRequest


def bench_engine(engine, reqs: list[BenchRequest], output_len: int, num_beams: int = 1,
                 concurrency: int | None = None) -> dict:
    """Submit every request at once (the scheduler batches them); output tokens/s (with
    beams: of the best hypotheses, all output_len long), and the KV bytes a request held.
    Warmed on the workload's own shapes (`concurrency` requests, output_len tokens), as a
    server is after its first batches and as the HF baseline warms on a full batch: the
    kernels a batch of that size compiles or tunes on first use are not timed."""
    warm_engine(engine, reqs, num_beams, full=(concurrency or len(reqs), output_len))
    return time_engine(engine, reqs, output_len, num_beams)


def _sampling(output_len: int, num_beams: int, reqs: list[BenchRequest]) -> dict:
    sp = {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True,
          "num_beams": num_beams}
    if reqs[0].audio is not None:  # EOS never chosen, as HF's min_new_tokens bans it
        sp["min_new_tokens"] = output_len
    return sp


def _images(reqs: list[BenchRequest]):
    return [[r.image] for r in reqs] if reqs[0].image is not None else None


def request_inputs(reqs: list[BenchRequest], warm: bool = False) -> dict:
    """`Seq2SeqEngine.generate`'s inputs for `reqs`: token ids (and images), or a speech
    model's audio as `transcribe` and /v1/audio/transcriptions send it (16 kHz samples, the
    log-mel computed on the model's device in the encoder stage, the decoder prompt).
    `warm`: other audio of the same shapes (the samples negated), which no encoder cache
    entry of the timed run's audio can serve."""
    if reqs[0].audio is not None:
        return {"audio_data": [-r.audio if warm else r.audio for r in reqs],
                "decoder_input_ids": [r.input_ids for r in reqs]}
    return {"input_ids": [r.input_ids for r in reqs], "image_data": _images(reqs)}


def warm_engine(engine, reqs: list[BenchRequest], num_beams: int = 1,
                full: tuple[int, int] | None = None) -> None:
    """Compile / allocate outside the timing, on other inputs: a few requests cut short, or
    with `full` = (requests, output_len) the workload's own shapes (the sources reversed,
    their lengths kept; a speech model's clips negated), as the baselines warm up on a full
    batch (`bench offline`)."""
    count, output_len = full or (4, 4)
    warm = min(len(reqs), count)
    if reqs[0].image is not None or reqs[0].audio is not None:
        inputs = request_inputs(reqs[:warm], warm=True)
    elif full:
        inputs = {"input_ids": [r.input_ids[::-1] for r in reqs[:warm]]}
    else:
        inputs = {"input_ids": [r.input_ids[:8] + [1] for r in reqs[:warm]]}
    engine.generate(**inputs, sampling_params=_sampling(output_len, num_beams, reqs))
    engine.flush_cache()


def time_engine(engine, reqs: list[BenchRequest], output_len: int, num_beams: int = 1) -> dict:
    """One timed run of `bench_engine` on a warm engine (a cache it leaves is flushed, so
    that the next run starts alike)."""
    sp = _sampling(output_len, num_beams, reqs)
    before = engine.stats()
    start = time.perf_counter()
    outs = engine.generate(**request_inputs(reqs), sampling_params=sp)
    elapsed = time.perf_counter() - start
    after = engine.stats()
    # the share of the time the scheduler waited for the device: near 1 means device-bound
    device_bound = (after["host_wait_seconds"] - before["host_wait_seconds"]) / elapsed
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    ttfts = sorted(o["meta_info"].get("scheduler_ttft", 0.0) for o in outs)
    steps = after["forwards"] - before["forwards"]
    kv = {"kv_bytes_per_request": _mean(o["meta_info"]["kv_bytes"] for o in outs)}
    if num_beams > 1:  # the same requests without beams, for the memory ratio
        greedy = engine.generate(**request_inputs(reqs[:16]),
                                 sampling_params={**sp, "num_beams": 1})
        kv["greedy_kv_bytes_per_request"] = _mean(o["meta_info"]["kv_bytes"] for o in greedy)
        kv["kv_ratio_to_greedy"] = kv["kv_bytes_per_request"] / kv["greedy_kv_bytes_per_request"]
    engine.flush_cache()
    return {"tokens_per_s": tokens / elapsed, "seconds": elapsed, "tokens": tokens, **kv,
            "output_ids": [o["output_ids"] for o in outs],
            "decode_steps": steps, **step_times(before, after, elapsed, steps),
            "encoder_seconds": after["encoder_seconds"] - before["encoder_seconds"],
            # inputs the encoder ran on (not served from its cache): the encoder's FLOPs
            "encoder_inputs": after["encoder_inputs"] - before["encoder_inputs"],
            "host_waiting_share": device_bound,
            # the scheduler process's garbage-collector pauses in the run (ms; gen 0, 1, 2)
            "gc_pause_ms": gc_delta(before, after),
            # of them, full passes the scheduler ran itself (memory/collector.py: on going
            # idle, as after the run's last step, or every --gc-full-pass-interval seconds)
            "gc_scheduled_full_passes": (after.get("gc_scheduled_full_passes", 0)
                                         - before.get("gc_scheduled_full_passes", 0)),
            "ttft_p50_ms": ttfts[len(ttfts) // 2] * 1e3, "ttft_p99_ms":
            ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] * 1e3}


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def bench_one_batch(engine, reqs: list[BenchRequest], output_len: int) -> dict:
    """Latency of one batch: time to first token and per-token decode time."""
    sp = _sampling(output_len, 1, reqs)
    engine.generate(**request_inputs(reqs, warm=True), sampling_params=sp)  # warm-up
    engine.flush_cache()
    before = engine.stats()
    start = time.perf_counter()
    outs = engine.generate(**request_inputs(reqs), sampling_params=sp)
    elapsed = time.perf_counter() - start
    after = engine.stats()
    # the scheduler's clock: first token to last, over the tokens after the first
    per_token = [o["meta_info"]["decode_seconds"] / (output_len - 1) for o in outs]
    steps = after["forwards"] - before["forwards"]
    return {"batch_size": len(reqs),
            "ttft_ms": max(o["meta_info"]["scheduler_ttft"] for o in outs) * 1e3,
            "ms_per_token": max(per_token) * 1e3, **step_times(before, after, elapsed, steps)}
