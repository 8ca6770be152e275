"""`seq2serve bench offline | one-batch`: seq2serve and (with --baseline hf) Hugging Face
`generate` on the same model shape and workload, in one run, with the ratios (offline with
`--repeats N`: interleaved runs and the ratio of the medians, runtime/bench/interleaved.py)."""

from __future__ import annotations

import argparse
import gc
import json
import tempfile

from seq2serve.runtime.bench.workload import model_requests


def add_bench_parser(sub) -> None:
    from seq2serve.runtime.bench.plot import add_plot_parser
    from seq2serve.runtime.bench.quality import add_quality_parser
    from seq2serve.runtime.bench.sampling import add_sampling_parser
    from seq2serve.runtime.bench.serving import add_serving_parser

    add_serving_parser(sub)
    add_plot_parser(sub)
    add_quality_parser(sub)
    add_sampling_parser(sub)
    for name, fn, doc in (("offline", _offline, "throughput of many requests"),
                          ("one-batch", _one_batch, "latency of one batch")):
        p = sub.add_parser(name, help=doc)
        p.add_argument("--shape", help="a real model shape with random weights (mt5-large, "
                       "nllb-200-distilled-600m, opus-mt, bart-large-cnn, pegasus-large, "
                       "umt5-base, t5gemma-2b-2b, florence-2-large, whisper-large-v3, "
                       "whisper-large-v3-turbo, ...)")
        p.add_argument("--model-path", help="or a model directory (real weights)")
        p.add_argument("--num-requests", type=int, default=1024)
        p.add_argument("--input-len", type=int, default=128,
                       help="source tokens (a speech model's requests are 30 s clips with "
                            "Whisper's 4-token prompt instead)")
        p.add_argument("--output-len", type=int, default=128)
        p.add_argument("--image-size", type=int, default=None,
                       help="random images of this size a side (default: Mllama's 1120 = "
                            "4 tiles, Florence-2's 768)")
        p.add_argument("--batch-sizes", default="128",
                       help="comma-separated: concurrency (offline) or batch size (one-batch)")
        p.add_argument("--baseline", type=_baselines, default="none",
                       help="none, hf, ct2 (CTranslate2 on a CPU, offline) or hf,ct2")
        p.add_argument("--ct2-compute-type", default="float32",
                       help="CTranslate2's compute type (float32, int8, ...)")
        p.add_argument("--hf-modes", default="default,static")
        p.add_argument("--hf-max-batches", type=int, default=2)
        p.add_argument("--hf-batch-size", type=_sizes, nargs="+", action=_Sizes, default=None,
                       help="HF generate's batch size, or several, comma- or space-separated "
                            "(each is run; the ratio is against the best; default: the "
                            "largest of --batch-sizes)")
        p.add_argument("--num-beams", type=int, default=1,
                       help="beam search (offline): seq2serve, HF and CTranslate2 (beam_size) "
                            "all run num_beams beams; HF's batch halves until it fits")
        p.add_argument("--dtype", default="bfloat16")
        p.add_argument("--device", default=None)
        p.add_argument("--engine-args", default="{}", help="JSON of extra engine options")
        p.add_argument("--json", help="write all results here")
        if name == "offline":
            p.add_argument("--repeats", type=_positive, default=1,
                           help="run seq2serve and each baseline alternately N times each "
                                "(one engine, one baseline model); report the medians")
        p.set_defaults(fn=fn)


class _Sizes(argparse.Action):
    """`--hf-batch-size 128,256` and `--hf-batch-size 128 256` alike: one list."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, [size for sizes in values for size in sizes])


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return sizes


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--repeats takes a positive integer, got {text!r}")
    return int(text)


def _baselines(text: str) -> set[str]:
    names = set(text.split(","))
    if not names <= {"none", "hf", "ct2"}:
        raise argparse.ArgumentTypeError(f"--baseline takes none, hf, ct2 or a comma list of "
                                         f"them, got {text!r}")
    return names - {"none"}


def _model(args) -> tuple[str, dict]:
    if args.shape:
        from seq2serve.runtime.bench.shapes import write_shape

        return str(write_shape(args.shape, tempfile.mkdtemp())), {"load_format": "dummy"}
    if not args.model_path:
        raise ValueError("give --shape or --model-path")
    return args.model_path, {}


def _requests(model_dir: str, args, n: int):
    from seq2serve.runtime.config.model_config import ModelConfig

    mc = ModelConfig.from_path(model_dir)
    reqs = model_requests(mc, n, args.input_len, args.output_len, args.image_size)
    if reqs[0].audio is not None:  # the decoder's prompt is all its input length
        args.input_len = len(reqs[0].input_ids)
    return mc, reqs


def _engine(model_dir: str, load: dict, args, concurrency: int):
    from seq2serve import Seq2SeqEngine

    extra = json.loads(args.engine_args)
    # the benchmark is the engine's caller: all its images go in one call
    extra.setdefault("max_images_per_call", max(64, args.num_requests))
    return Seq2SeqEngine(model_path=model_dir, dtype=args.dtype, device=args.device,
                         max_running_requests=concurrency,
                         context_length=args.input_len + args.output_len + 8,
                         **load, **extra)


def _hardware(mc, dtype_bytes: int, device: str | None = None) -> dict:
    """On CUDA: the copy bandwidth and the weights a decode step reads; for a speech model
    also the bf16 matmul peak its encoder stage is measured against."""
    import torch

    from seq2serve.runtime.bench.hardware import (
        copy_bandwidth,
        decoder_step_bytes,
        matmul_peak_tflops,
    )

    if not torch.cuda.is_available() or (device or "cuda").startswith("cpu"):
        return {}
    hw = {"device_name": torch.cuda.get_device_name(), "copy_bandwidth_gbs":
          copy_bandwidth() / 1e9, "decoder_step_weight_bytes":
          decoder_step_bytes(mc.arch, dtype_bytes)}
    if mc.arch.frontend_info().get("has_audio"):
        hw["matmul_peak_tflops"] = matmul_peak_tflops()
    return hw


def _audio_report(mc, results: dict) -> None:
    """A speech model's encoder stage against the hardware: its FLOPs per 30 s clip
    (`whisper_encoder_flops`), and per seq2serve run the stage's TFLOP/s over
    `encoder_seconds` and their share of the measured bf16 matmul peak (CUDA); and where
    each side computes the log-mel features."""
    from seq2serve.runtime.bench.hardware import whisper_encoder_flops

    flops = whisper_encoder_flops(mc.arch)
    peak = results["hardware"].get("matmul_peak_tflops")
    results["encoder_flops_per_clip"] = flops
    results["feature_extraction"] = {
        "seq2serve": "timed: the clips' samples go in (as transcribe and /v1/audio/* send "
                     "them); the log-mel is computed on the model's device in the encoder "
                     "stage (in encoder_seconds)",
        "hf": "timed: WhisperFeatureExtractor(device=...) on each batch before generate"}
    for r in results["seq2serve"]:
        for run in [r, *r.get("runs", [])]:
            if run.get("encoder_seconds"):
                tflops = run["encoder_inputs"] * flops["stage"] / run["encoder_seconds"] / 1e12
                run["encoder_tflops_per_s"] = tflops
                if peak:
                    run["encoder_share_of_peak"] = tflops / peak
        if "encoder_tflops_per_s" in r:
            share = (f", {r['encoder_share_of_peak']:.0%} of the bf16 matmul peak "
                     f"({peak:.0f} TFLOP/s)" if peak else "")
            print(f"encoder stage: {r['encoder_inputs']} clips x {flops['stage'] / 1e12:.2f} "
                  f"TFLOP in {r['encoder_seconds']:.2f} s = {r['encoder_tflops_per_s']:.1f} "
                  f"TFLOP/s{share}", flush=True)


def _steps(r: dict) -> str:
    """A forward's wall time next to the device's busy time in it (CUDA only)."""
    if not r["device_busy_ms_per_step"]:
        return f"{r['step_ms']:.2f} ms/forward"
    return (f"{r['step_ms']:.2f} ms/forward, device busy {r['device_busy_ms_per_step']:.2f} "
            f"({r['device_busy_share']:.0%})")


def _gc(r: dict) -> str:
    """The scheduler's collector pauses in the run, where reported."""
    if not r.get("gc_pause_ms"):
        return ""
    ran = r.get("gc_scheduled_full_passes", 0)
    return (f", collector pauses {sum(r['gc_pause_ms']):.0f} ms"
            + (f" ({ran} of them the scheduler's own full pass{'es' if ran > 1 else ''})"
               if ran else ""))


def _offline(args) -> dict:
    from seq2serve.runtime.bench.engine_bench import bench_engine

    model_dir, load = _model(args)
    if "ct2" in args.baseline:  # both engines run the same weights
        from seq2serve.runtime.bench.ct2_baseline import ensure_weights

        model_dir, load = ensure_weights(model_dir), {}
    mc, reqs = _requests(model_dir, args, args.num_requests)
    results = {"workload": vars(args) | {"fn": None, "baseline": sorted(args.baseline)},
               "hardware": _hardware(mc, 2, args.device), "seq2serve": [], "hf": []}
    if args.repeats > 1:
        from seq2serve.runtime.bench.interleaved import offline_repeated

        results = offline_repeated(args, model_dir, load, reqs, results, _engine)
        if reqs[0].audio is not None:
            _audio_report(mc, results)
        return _report(results)
    outputs = None
    for c in [int(x) for x in args.batch_sizes.split(",")]:
        with _engine(model_dir, load, args, c) as engine:
            r = bench_engine(engine, reqs, args.output_len, args.num_beams, c)
        outputs = r.pop("output_ids")
        r["concurrency"] = c
        results["seq2serve"].append(r)
        print(f"seq2serve  concurrency {c:4d}: {r['tokens_per_s']:10.0f} tok/s  "
              f"({r['decode_steps']} forwards, {_steps(r)}, host waiting for the device "
              f"{r['host_waiting_share']:.0%} of the time, encoder "
              f"{r['encoder_seconds']:.2f} s{_gc(r)})", flush=True)
        if "kv_ratio_to_greedy" in r:
            print(f"KV bytes per request with {args.num_beams} beams: "
                  f"{r['kv_bytes_per_request'] / 2**20:.1f} MiB, "
                  f"{r['kv_ratio_to_greedy']:.2f}x a greedy request's", flush=True)
    if reqs[0].audio is not None:
        _audio_report(mc, results)
    sizes = args.hf_batch_size or [max(int(x) for x in args.batch_sizes.split(","))]
    if "hf" in args.baseline:
        results["hf"] = [r for size in sizes for r in _hf(model_dir, reqs, args, size)]
    if "ct2" in args.baseline:
        results["hf"] += [_ct2(model_dir, reqs, args, size, outputs) for size in sizes]
    return _report(results)


def _ct2(model_dir: str, reqs, args, batch_size: int, ours: list[list[int]]) -> dict:
    from seq2serve.runtime.bench.ct2_baseline import bench_ct2

    if (args.device or "cpu") != "cpu":
        raise ValueError("--baseline ct2 runs on a CPU (--device cpu)")
    r = bench_ct2(model_dir, reqs, batch_size, args.output_len, args.ct2_compute_type,
                  beam_size=args.num_beams)
    theirs = r.pop("output_ids")
    r["same_output_as_seq2serve"] = sum(a == b for a, b in zip(ours, theirs))
    print(f"CTranslate2 {args.ct2_compute_type} batch {batch_size:4d}: "
          f"{r['tokens_per_s']:10.0f} tok/s  ({r['threads']} threads; output equal to "
          f"seq2serve's for {r['same_output_as_seq2serve']}/{len(ours)} requests)", flush=True)
    return r


def _one_batch(args) -> dict:
    from seq2serve.runtime.bench.engine_bench import bench_one_batch

    if "ct2" in args.baseline:
        raise ValueError("--baseline ct2 is for bench offline")
    model_dir, load = _model(args)
    results = {"workload": vars(args) | {"fn": None, "baseline": sorted(args.baseline)},
               "seq2serve": [], "hf": []}
    mc = None
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        mc, reqs = _requests(model_dir, args, b)
        with _engine(model_dir, load, args, b) as engine:
            r = bench_one_batch(engine, reqs, args.output_len)
        results["seq2serve"].append(r)
        print(f"seq2serve  batch {b:4d}: {r['ms_per_token']:.3f} ms/token, "
              f"TTFT {r['ttft_ms']:.1f} ms ({_steps(r)})", flush=True)
    results["hardware"] = _hardware(mc, 2, args.device)
    hw = results["hardware"]
    if hw:
        floor_ms = hw["decoder_step_weight_bytes"] / (hw["copy_bandwidth_gbs"] * 1e9) * 1e3
        hw["floor_ms_per_token"] = floor_ms
        for r in results["seq2serve"]:
            r["floor_ratio"] = r["ms_per_token"] / floor_ms
            r["bandwidth_share"] = floor_ms / r["ms_per_token"]
    if "hf" in args.baseline:
        b = int(args.batch_sizes.split(",")[0])
        _, reqs = _requests(model_dir, args, 2 * b)
        results["hf"] = _hf(model_dir, reqs, args, b)
    return _report(results)


def _hf(model_dir: str, reqs, args, batch_size: int) -> list[dict]:
    import torch

    from seq2serve.runtime.bench.hf_baseline import bench_hf, load_hf_model

    out = []
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    beams = getattr(args, "num_beams", 1)
    for mode in args.hf_modes.split(","):
        model = load_hf_model(model_dir, getattr(torch, args.dtype), device)
        size = batch_size
        while True:
            try:
                r = bench_hf(model, model_dir, reqs, size, args.output_len, mode,
                             args.hf_max_batches, beams)
            except torch.cuda.OutOfMemoryError:
                if beams > 1 and size > 1:  # beams multiply HF's cache: its batch that fits
                    size //= 2
                    torch.cuda.empty_cache()
                    continue
                r = {"mode": mode, "batch_size": size, "error": "out of memory"}
            except Exception as e:  # noqa: BLE001 - a baseline that cannot run is reported
                r = {"mode": mode, "batch_size": size, "error": f"{type(e).__name__}: {e}"}
            break
        out.append(r)
        print(f"HF {mode:8s} batch {r['batch_size']:4d}: "
              f"{r.get('tokens_per_s', float('nan')):10.0f} tok/s  {r.get('error', '')}",
              flush=True)
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        torch._dynamo.reset()
    return out


def _report(results: dict) -> dict:
    ours = max((r["tokens_per_s"] for r in results["seq2serve"] if "tokens_per_s" in r),
               default=None)
    for h in results.get("hf", []):
        if "tokens_per_s" in h and ours:
            h["seq2serve_ratio"] = ours / h["tokens_per_s"]
            name = h["mode"] if h["mode"].startswith("ct2") else f"HF {h['mode']}"
            medians = " (of the medians)" if h.get("repeats", 1) > 1 else ""
            print(f"ratio seq2serve / {name}: {h['seq2serve_ratio']:.2f}x{medians}")
    best = {}
    for h in results.get("hf", []):
        name = h["mode"] if h["mode"].startswith("ct2") else f"HF {h['mode']}"
        if "tokens_per_s" in h and h["tokens_per_s"] > best.get(name, {}).get("tokens_per_s", 0):
            best[name] = h
    if ours and len(results.get("hf", [])) > len(best):  # several batch sizes: best vs best
        for name, h in best.items():
            print(f"best against best: seq2serve {ours:.0f} tok/s / {name} at batch "
                  f"{h['batch_size']} {h['tokens_per_s']:.0f} tok/s = "
                  f"{ours / h['tokens_per_s']:.2f}x")
        results["best_ratios"] = {name: ours / h["tokens_per_s"] for name, h in best.items()}
    hw = results.get("hardware", {})
    if hw:
        print(f"device {hw['device_name']}, copy bandwidth {hw['copy_bandwidth_gbs']:.0f} GB/s")
    return results


def run(args) -> int:
    results = args.fn(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


