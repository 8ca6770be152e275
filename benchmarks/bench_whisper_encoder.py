"""Whisper large-v3's encoder on 30 s windows: seq2serve's (`models/whisper/model.py`'s
`encode`: the log-mel from the samples on the device, the convolutions, 32 layers on the
runtime's attention backend) and HF's `WhisperEncoder` (on the log-mel its feature extractor
made beforehand, untimed) with the same random weights, bf16 on CUDA, at several windows per
call, against the card's measured bf16 matmul peak; then the CUDA kernels of seq2serve's
encoder at the largest batch, heaviest first (torch.profiler).

    python3 benchmarks/bench_whisper_encoder.py [--batches 8,32 --windows 64 --json out]

The FLOPs counted are `runtime/bench/hardware.whisper_encoder_flops`'s "encoder" (the
convolutions as matmuls, each layer's projections, MLP and attention scores; ~2.27 TFLOP a
window for large-v3); the cross K/V projections the encoder stage adds in serving are left
out here (`bench offline --shape whisper-large-v3` reports the whole stage). The two
encoders' outputs are compared first (the largest difference, relative to the outputs'
scale, is printed and stored). `--device cpu --dtype float32 --encoder-layers 1
--decoder-layers 1 --batches 1` runs it small on a CPU (no peak, no profile).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
import torch

from seq2serve.runtime.bench.hardware import matmul_peak_tflops, whisper_encoder_flops
from seq2serve.runtime.bench.shapes import SHAPES, write_shape
from seq2serve.runtime.bench.workload import synthetic_clip


def encoders(args):
    """(seq2serve's model, HF's, the config) with one set of random weights: HF's model saved
    and loaded by the runtime's loader, as a checkpoint is."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    from seq2serve.models.loader import load_model
    from seq2serve.runtime.config.model_config import ModelConfig

    name = f"whisper-bench-{args.shape}"
    layers = {k: v for k, v in (("encoder_layers", args.encoder_layers),
                                ("decoder_layers", args.decoder_layers)) if v}
    SHAPES[name] = {**SHAPES[args.shape], **layers}
    path = write_shape(name, tempfile.mkdtemp(prefix="whisper-encoder"))
    dtype = getattr(torch, args.dtype)
    with torch.device(args.device):
        hf = WhisperForConditionalGeneration(WhisperConfig.from_pretrained(str(path)))
    hf = hf.to(dtype).eval()
    hf.save_pretrained(str(path))
    mc = ModelConfig.from_path(str(path))
    ours = load_model(mc, args.device, dtype)
    return ours, hf.model.encoder, mc.arch


def our_encode(model, backend, samples: torch.Tensor) -> torch.Tensor:
    """The encoder stage's forward as the model runner calls it, without the cross K/V
    writes (no pool here)."""
    from seq2serve.models.whisper.model import WindowBatch
    from seq2serve.runtime.attention.forward_batch import EncodeForwardBatch

    fb = EncodeForwardBatch(token_ids=None, model_input=WindowBatch(samples),
                            segment_lens=[model.cfg.max_source_positions] * samples.shape[0],
                            cross_out_loc=torch.empty(0, dtype=torch.int64),
                            cached_hidden=None, attn_backend=backend)
    backend.init_forward_metadata(fb)
    return model.encode(fb)


def _ms_per_window(fn, batch: int, calls: int, cuda: bool) -> float:
    fn()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / (calls * batch)


def main() -> None:
    from transformers import WhisperFeatureExtractor

    from seq2serve.runtime.attention import create_backend

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="whisper-large-v3")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--windows", type=int, default=64, help="windows timed per batch size")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--encoder-layers", type=int, default=None,
                    help="fewer encoder layers than the shape's (a small run on a CPU)")
    ap.add_argument("--decoder-layers", type=int, default=None,
                    help="fewer decoder layers (not timed here; a smaller model to build)")
    ap.add_argument("--json")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    ours, hf, cfg = encoders(args)
    backend = create_backend("triton" if cuda else "torch_batched", device=args.device)
    extractor = WhisperFeatureExtractor(feature_size=cfg.num_mel_bins)
    flops = whisper_encoder_flops(cfg)["encoder"]
    peak = matmul_peak_tflops() if cuda else None
    print(f"{flops / 1e12:.2f} TFLOP a window" + (f"; bf16 matmul peak {peak:.0f} TFLOP/s"
                                                   if peak else ""), flush=True)
    result = {"shape": args.shape, "encoder_layers": cfg.encoder_layers,
              "matmul_peak_tflops": peak, "tflop_per_window": flops / 1e12, "runs": []}
    batches = [int(b) for b in args.batches.split(",")]
    dtype = getattr(torch, args.dtype)
    with torch.inference_mode():
        for b in batches:
            clips = [synthetic_clip(1000 + i) for i in range(b)]
            samples = torch.from_numpy(np.stack(clips)).to(args.device)
            feats = extractor(clips, sampling_rate=16_000, return_tensors="pt",
                              device=args.device).input_features.to(args.device, dtype)
            calls = max(1, args.windows // b)
            if b == batches[0]:  # the same weights and input: the same output
                a = our_encode(ours, backend, samples).float()
                h = hf(feats).last_hidden_state.reshape(a.shape).float()
                result["max_relative_difference"] = ((a - h).abs().max() / h.abs().max()).item()
                print(f"outputs: largest difference {result['max_relative_difference']:.2e} "
                      f"of their scale", flush=True)
            for name, fn in (("seq2serve", lambda s=samples: our_encode(ours, backend, s)),
                             ("hf", lambda f=feats: hf(f))):
                ms = _ms_per_window(fn, b, calls, cuda)
                tflops = flops / ms / 1e9
                run = {"encoder": name, "batch": b, "ms_per_window": ms, "tflops": tflops}
                if peak:
                    run["share_of_peak"] = tflops / peak
                result["runs"].append(run)
                share = f", {100 * tflops / peak:4.1f} % of the matmul peak" if peak else ""
                print(f"{name:9s} batch {b:3d}: {ms:7.2f} ms a window, {tflops:6.1f} "
                      f"TFLOP/s{share}", flush=True)
        if cuda:
            with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                our_encode(ours, backend, samples)
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
