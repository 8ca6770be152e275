"""The GPU check: every change to kernels, models, the model runner, CUDA graphs or the
scheduler passes it on a GPU before it lands (CI has no GPU). On a lent GPU machine:

    bash scripts/gpu_check.sh            # = source benchmarks/gpu_setup.sh; python3 scripts/gpu_check.py

Parts, each ending in one verdict line (`PASS` / `FAIL`):
1. `tests`: the `gpu`-marked tests (Triton against torch_native and HF, CUDA graphs on == off,
   decode with and without split-KV in bf16 and fp16 for T5, Llama and Mllama).
2. `serve <shape>`: `seq2serve serve` on each real shape with random weights in bf16, then one
   request over HTTP (completion, chat, chat with an image) that must return every token, and
   one newer feature: /v1/embeddings (unit vectors) on the encoder-decoder text shapes, a
   JSON-schema answer on Llama (it parses and is one of the schema's values).
3. `bench`: a short `bench one-batch` and `bench offline` on mT5-large, and
   `benchmarks/bench_grammar.py` on the Llama-3.2-1B shape (64 JSON-schema requests against
   the same batch without grammars), `benchmarks/bench_documents.py` on the NLLB-600M shape
   (20 documents of 50 sentences against the same sentences as a flat list) (figures
   printed).
4. `serving`: mT5-large served and loaded by `bench serving` (128 streams from 8 client
   processes, 512 requests, 64 -> 64), the offline engine on the same workload in the same
   run, served by four HTTP processes (`--api-server-count 4`): every request answered, and
   the server / offline ratio printed (`benchmarks/serving_vs_offline.sh`; issue 38's full
   figures run it at 256 streams).
5. `families`: issue 44's shapes in bf16 with random weights, `bart-large-cnn` (4 beams) and
   `florence-2-large` (3 beams, a random 768x768 image a request), and issue 43's
   `whisper-large-v3` (greedy, 30 s clips; the encoder stage's TFLOP/s and share of the
   measured bf16 matmul peak printed): `benchmarks/graphs_parity.py` (CUDA graphs on == off,
   token for token: the verdict) and `bench offline --baseline hf` against HF `generate` at
   several batch sizes, default and static cache (figures printed; best against best).
   `--families whisper-large-v3` runs a subset.
6. `serving-audio` (only when named, in a call of its own): whisper-large-v3 served and
   loaded with 30 s WAV clips on /v1/audio/transcriptions (`bench serving --audio-seconds
   30`: 128 at once from 4 client processes after a warm-up round, then Poisson arrivals),
   the offline engine on the same clips: every request answered, the server / offline ratio
   printed; then the same 128 at once against four API servers (`--api-server-count 4`),
   which say whether one HTTP process is what limits a speech server (~450 s in all).

Logs and bench JSON go to $OUT (the lent machine's return folder) or /tmp/gpu_check. The exit
status is the number of failed parts. `--only tests,serve,bench,serving,families` runs a
subset; the tests part alone has outgrown one 600 s call of a lent machine, so `--only
tests-fast` (with GPU_CHECK_WORKERS=16), `--only tests-slow` (GPU_CHECK_WORKERS=6) and `--only
tests-florence` (Florence-2's two, ~480 s) split it in three, and `serve` (~330 s), `bench`
(~260 s) and `families` overrun one call together: run them apart (and with Whisper,
`families` itself: `--families bart-large-cnn,florence-2-large` and `--families
whisper-large-v3` in two calls). Write the output to a file under $OUT rather
than through a pipe, so a call that times out still returns the verdicts printed so far.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = Path(os.environ.get("OUT") or "/tmp/gpu_check")
SHAPES = ["mt5-large", "flan-t5-xl", "llama-3.2-1b", "mllama-11b", "nllb-200-distilled-600m"]
NEW_TOKENS = 16


def verdict(part: str, ok: bool, detail: str) -> bool:
    line = f"{'PASS' if ok else 'FAIL'}  {part:<22} {detail}"
    print(line, flush=True)
    with open(LOGS / "verdicts.txt", "a") as f:
        f.write(line + "\n")
    return ok


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "seq2serve.runtime.cli", *args]


# the slowest gate tests (~200 s together with 6 workers on an H200): `tests-slow` runs them
# alone and `tests-fast` all the others (~490 s with 16 workers), so that each part fits one
# 600 s call of a lent machine; `tests` runs all of them
SLOW_TESTS = [
    "tests/test_gpu.py::test_cuda_graphs_for_mllama",
    "tests/test_gpu.py::test_decode_splits_graphs_and_dtypes[t5-bfloat16]",
    "tests/test_gpu.py::test_beam_search_matches_hf_with_graphs_in_float32_and_bfloat16",
    "tests/test_gpu.py::test_bart_family_matches_hf_with_graphs_in_float32[marian]",
    "tests/test_whisper_kernels.py::test_whisper_matches_hf_with_graphs_on_the_gpu",
    "tests/test_whisper_kernels.py::test_whisper_engine_starts_and_transcribes_on_the_gpu",
    "tests/test_gpu.py::test_new_families_match_hf_with_graphs_in_float32[t5gemma_gqa_capped]",
    "tests/test_gpu.py::test_new_families_match_hf_with_graphs_in_float32[t5gemma_mha_untied]",
]
# Florence-2's two GPU tests took 450 and 481 s on an H200 run together (twenty-first
# session): a part of their own, `tests-florence`, which `tests-fast` leaves out too
FLORENCE_TESTS = [
    "tests/test_gpu.py::test_florence2_matches_hf_with_graphs",
    "tests/test_gpu.py::test_florence2_compiled_tower_matches_hf",
]
GATE_TESTS = ["tests/test_gpu.py", "tests/test_triton_kernels.py", "tests/test_triton_ops.py",
              "tests/test_scoring.py", "tests/test_gpu_quantization.py",
              "tests/test_whisper_kernels.py", "tests/test_top_p_kernel.py",
              "tests/test_race_kernel.py", "tests/test_beam_cross_attention.py",
              "tests/test_beam_copy.py", "tests/test_beam_topk.py",
              "tests/test_gpu_tensor_parallel.py"]  # (2 GPUs, else skips)


def check_tests(which: str = "tests") -> bool:
    """`which`: tests (every gate test), tests-fast (all but SLOW_TESTS and FLORENCE_TESTS),
    tests-slow, tests-florence."""
    log = LOGS / f"gpu_{which.replace('-', '_')}.log"
    start = time.monotonic()
    if which == "tests-slow":
        selection = SLOW_TESTS
    elif which == "tests-florence":
        selection = FLORENCE_TESTS
    else:
        skip = ([a for t in SLOW_TESTS + FLORENCE_TESTS for a in ("--deselect", t)]
                if which == "tests-fast" else [])
        selection = GATE_TESTS + skip
    with open(log, "w") as f:
        # several workers: most of the time is Triton compiling kernel variants on the CPU
        # (GPU_CHECK_WORKERS: more on a host with the cores: the part has outgrown 600 s at 8)
        n = int(os.environ.get("GPU_CHECK_WORKERS") or min(8, os.cpu_count() or 1))
        workers = ["-n", str(n)] if _has_xdist() else []
        code = subprocess.call([sys.executable, "-m", "pytest", "-v", "-rfE", "-m", "gpu", "-p",
                                "no:cacheprovider", *workers, "--durations=10", *selection],
                               cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    summary = next((ln for ln in reversed(lines) if " in " in ln and ("passed" in ln or
                                                                      "failed" in ln)),
                   lines[-1] if lines else "no output")
    if code:
        print("\n".join(lines[-40:]))
    return verdict(which, code == 0, f"{summary} ({time.monotonic() - start:.0f} s)")


def _has_xdist() -> bool:
    import importlib.util

    return importlib.util.find_spec("xdist") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _image_url() -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.effect_noise((1120, 1120), 64).convert("RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _request(shape: str) -> tuple[str, dict]:
    common = {"max_tokens": NEW_TOKENS, "temperature": 0,
              "ignore_eos": True}
    if shape.startswith("mllama"):
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": _image_url()}},
            {"type": "text", "text": "What is in this picture?"}]}]}
    if shape.startswith("llama"):
        return "/v1/chat/completions", {**common, "messages": [
            {"role": "user", "content": "Name three colours."}]}
    return "/v1/completions", {**common, "prompt": "translate English to German: Good morning."}


SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
          "required": ["colour"], "additionalProperties": False}


def _feature(shape: str, url: str) -> tuple[bool, str]:
    """One newer feature per shape on the GPU: an encoder-decoder text model's /v1/embeddings
    (the encoder stage's pooling; unit vectors), a Llama's JSON-schema output (the grammar
    mask in the sampler; the answer parses and is one of the schema's values)."""
    import json

    import httpx

    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    if shape.startswith("llama"):
        r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": model, "max_tokens": 32, "messages": [
                {"role": "user", "content": "Pick a colour."}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "c", "schema": SCHEMA}}})
        if r.status_code != 200:
            return False, f"json_schema {r.status_code} {r.text[:300]}"
        text = r.json()["choices"][0]["message"]["content"]
        try:
            ok = json.loads(text)["colour"] in SCHEMA["properties"]["colour"]["enum"]
        except (ValueError, KeyError, TypeError):
            ok = False
        return ok, f"json_schema -> {text!r}"
    if shape.startswith(("mllama", "whisper")):
        return True, ""
    r = httpx.post(url + "/v1/embeddings", timeout=120, json={
        "model": model, "input": ["Good morning.", "A longer sentence to embed here."],
        "encoding_format": "float"})
    if r.status_code != 200:
        return False, f"embeddings {r.status_code} {r.text[:300]}"
    norms = [sum(x * x for x in d["embedding"]) ** 0.5 for d in r.json()["data"]]
    return all(abs(n - 1) < 1e-2 for n in norms), f"embeddings norms {norms}"


def check_serve(shape: str) -> bool:
    import httpx

    from seq2serve.runtime.bench.shapes import write_shape

    model_dir = write_shape(shape, tempfile.mkdtemp(prefix=shape))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(LOGS / f"serve_{shape}.log", "w")
    start = time.monotonic()
    proc = subprocess.Popen(_cli("serve", "--model-path", str(model_dir), "--load-format",
                                 "dummy", "--dtype", "bfloat16", "--port", str(port)),
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                return verdict(f"serve {shape}", False, f"server exited with {proc.returncode}"
                               f" (log: {log.name}):\n{Path(log.name).read_text()[-3000:]}")
            if time.monotonic() - start > 300:
                return verdict(f"serve {shape}", False, "not healthy after 300 s")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        ready = time.monotonic() - start
        path, body = _request(shape)
        latencies = []
        for _ in range(2):  # the first request, then a repeat (compiles and tunings done)
            t = time.monotonic()
            r = httpx.post(url + path, json=body, timeout=120)
            latencies.append(f"{(time.monotonic() - t) * 1e3:.0f}")
            if r.status_code != 200:
                break
        ok = r.status_code == 200 and r.json()["usage"]["completion_tokens"] == NEW_TOKENS
        detail = (f"ready in {ready:.0f} s, {path} {r.status_code} in "
                  f"{' then '.join(latencies)} ms, "
                  f"{r.json().get('usage') if r.status_code == 200 else r.text[:300]}")
        if ok:
            ok, more = _feature(shape, url)
            detail += f"; {more}" if more else ""
        return verdict(f"serve {shape}", ok, detail)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def check_bench() -> bool:
    runs = {
        "one_batch": ["bench", "one-batch", "--shape", "mt5-large", "--batch-sizes", "1",
                      "--output-len", "64"],
        "offline": ["bench", "offline", "--shape", "mt5-large", "--num-requests", "256",
                    "--batch-sizes", "128", "--output-len", "64"],
    }
    ok, lines = True, []
    for name, args in runs.items():
        out = LOGS / f"bench_{name}.json"
        p = subprocess.run(_cli(*args, "--json", str(out)), cwd=ROOT, capture_output=True,
                           text=True)
        lines += [ln for ln in p.stdout.splitlines() if ln.startswith("seq2serve")]
        if p.returncode:
            ok = False
            lines.append(p.stderr[-2000:])
    # issue 41's figure: 64 JSON-schema requests on the Llama-3.2-1B shape against the same
    # batch without grammars (the overlap kept: docs/grammar.md)
    r = _bench_script(lines, "bench_grammar.py", "--shape", "llama-3.2-1b", "--requests", "64",
                      "--max-tokens", "256")
    if r is not None:
        g, f = r["grammar"], r["free"]
        lines.append(f"grammar: step {g['step_ms']:.2f} ms against {f['step_ms']:.2f} ms free "
                     f"({r['step_ratio']:.2f}x), device busy {g['device_busy_share']:.0%} / "
                     f"{f['device_busy_share']:.0%}")
    # issue 42's figure: documents of 50 sentences against the same sentences as a flat list
    r = _bench_script(lines, "bench_documents.py", "--device", "cuda", "--shape",
                      "nllb-200-distilled-600m", "--documents", "20", "--sentences", "50",
                      "--repeat-share", "0", "--max-new-tokens", "48", "--rounds", "9")
    if r is not None:
        lines.append(f"documents: {r['ways']['documents']['sentences_per_s']:.0f} sentences/s, "
                     f"{r['documents_vs_flat']:.2f}x the flat list")
    ok = ok and not any(line.startswith(FAILED) for line in lines)
    return verdict("bench", ok, " | ".join(lines))


FAILED = "failed: "


def _bench_script(lines: list[str], script: str, *args: str, name: str = "") -> dict | None:
    """Run benchmarks/`script` with `args` and a --json file (named after the script and
    `name`): its JSON, or None (its output's end appended to `lines`, starting with
    FAILED)."""
    out = LOGS / script.replace(".py", f"{name}.json")
    p = subprocess.run([sys.executable, f"benchmarks/{script}", *args, "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True)
    if p.returncode or not out.exists():
        lines.append(f"{FAILED}{script}: {p.stdout[-1000:]} {p.stderr[-2000:]}")
        return None
    return json.loads(out.read_text())


# issue 44's shapes and issue 43's Whisper: (shape, beams of the graphs parity check, its
# workload, beams of the offline bench, its workload, HF batch sizes)
FAMILIES = [
    ("bart-large-cnn", 4, ["--requests", "32", "--input-len", "256", "--output-len", "32"],
     4, ["--num-requests", "512", "--batch-sizes", "512", "--input-len", "512",
         "--output-len", "128"], "128,256"),
    ("florence-2-large", 3, ["--requests", "16", "--input-len", "16", "--output-len", "32"],
     3, ["--num-requests", "256", "--batch-sizes", "384", "--input-len", "16",
         "--output-len", "64"], "32,128"),
    # 30 s clips (the encoder's 1,500 positions) with Whisper's 4-token prompt, greedy as HF's
    # Whisper generate decodes by default; 2 beams in the parity check. On an H200 (twentieth
    # session) parity took ~90 s, the offline bench ~230 s with HF at 64 and 128; HF was
    # faster at 128 than at 64 in both modes, so 128 and 256 are tried now. HF's
    # cross-attention cache is ~245 MB a clip in bf16 (32 layers x 1,500 x 1,280 x 2 x 2 B):
    # 256 clips ~63 GB, which an H100 may not hold beside its static cache (the bench
    # reports an out-of-memory size and goes on). Run as `--only families --families
    # whisper-large-v3` in a call of its own.
    ("whisper-large-v3", 2, ["--requests", "16", "--output-len", "32"],
     1, ["--num-requests", "256", "--batch-sizes", "128,256", "--output-len", "64"],
     "128,256"),
]


def check_families(names: list[str] | None = None) -> bool:
    """`names`: the FAMILIES shapes to run (all by default)."""
    ok, lines = True, []
    chosen = [f for f in FAMILIES if names is None or f[0] in names]
    for shape, parity_beams, parity, beams, offline, hf_sizes in chosen:
        r = _bench_script(lines, "graphs_parity.py", "--shape", shape, "--num-beams",
                          str(parity_beams), *parity, name=f"_{shape}")
        if r is not None:
            beam_line = (f"; {parity_beams} beams {r['beams_same']}/{r['requests']} equal, "
                         f"scores within {r['max_beam_score_gap']:.4f}"
                         if "beams_same" in r else "")
            lines.append(f"{shape} graphs on == off: greedy {r['greedy_same']}/{r['requests']}"
                         f" equal, the rest apart at near-ties (log-probs within "
                         f"{r['max_logprob_gap']:.3f}){beam_line}")
        out = LOGS / f"bench_{shape}.json"
        p = subprocess.run(_cli("bench", "offline", "--shape", shape, "--num-beams", str(beams),
                                *offline, "--baseline", "hf", "--hf-batch-size", hf_sizes,
                                "--json", str(out)),
                           cwd=ROOT, capture_output=True, text=True)
        lines += [f"{shape}: {ln}" for ln in p.stdout.splitlines()
                  if ln.startswith(("seq2serve", "HF", "best against best", "encoder stage"))]
        if p.returncode:
            lines.append(f"{FAILED}{shape} bench offline: {p.stderr[-2000:]}")
    ok = ok and not any(line.startswith(FAILED) for line in lines)
    return verdict("families", ok, " | ".join(lines))


def check_serving() -> bool:
    # no py-spy inside the load (it stops the processes it samples); four HTTP processes
    return _serving_part("serving", ["mt5-large", "128", "512", "64", "64", ""], 512,
                         {"SERVE_ARGS": "--api-server-count 4"})


def check_serving_audio() -> bool:
    """Issue 43's server figure: whisper-large-v3 (dummy bf16) behind `seq2serve serve`, 30 s
    WAV clips to /v1/audio/transcriptions at 128 at once (the offline engine on the same clips
    after), then Poisson arrivals at 2 and 4 clips a second (~280 s); then 128 at once
    against four API servers (~170 s). In the twenty-first session one API server gave 0.66x
    the offline engine and four 0.96x, before the audio decode stopped waiting on the GIL."""
    # 512 clips, four waves of 128: with two, where the last wave's stragglers fell moved a
    # run's figure by a quarter (twenty-first session)
    audio = {"AUDIO_SECONDS": "30", "WORKERS": "4", "RATE_SECONDS": "30"}
    one = _serving_part("serving-audio", ["whisper-large-v3", "128", "512", "0", "64", "2 4"],
                        512, audio)
    four = _serving_part("serving-audio-4-api", ["whisper-large-v3", "128", "512", "0", "64",
                                                 ""], 512,
                         {**audio, "SERVE_ARGS": "--api-server-count 4"})
    return one and four


def _serving_part(name: str, args: list[str], requests: int, env: dict[str, str]) -> bool:
    """benchmarks/serving_vs_offline.sh with `args`: every one of `requests` answered and the
    server / offline ratio printed."""
    log = LOGS / f"{name.replace('-', '_')}.log"
    env = {**os.environ, "OUT": str(LOGS / name.replace("-", "_")), "NO_SPY": "1", **env}
    with open(log, "w") as f:
        code = subprocess.call(["bash", "benchmarks/serving_vs_offline.sh", *args], cwd=ROOT,
                               env=env, stdout=f, stderr=subprocess.STDOUT)
    text = log.read_text()
    lines = [ln.strip() for ln in text.splitlines()
             if ln.startswith(("requests ", "offline engine")) or "TTFT" in ln or "E2E" in ln
             or "ITL" in ln]
    ok = code == 0 and f"{requests}/{requests}" in text and "server / offline" in text
    return verdict(name, ok, " | ".join(lines) if ok else text[-3000:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="tests,serve,bench,serving,families")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--families", default=None,
                        help="comma-separated FAMILIES shapes for the families part (default: "
                             "all of them)")
    args = parser.parse_args()
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / "verdicts.txt").unlink(missing_ok=True)
    parts = args.only.split(",")
    results = []
    for which in ("tests", "tests-fast", "tests-slow", "tests-florence"):
        if which in parts:
            results.append(check_tests(which))
    if "serve" in parts:
        results += [check_serve(s) for s in args.shapes.split(",")]
    if "bench" in parts:
        results.append(check_bench())
    if "serving" in parts:
        results.append(check_serving())
    if "serving-audio" in parts:  # (not in the default --only: run it in a call of its own)
        results.append(check_serving_audio())
    if "families" in parts:
        results.append(check_families(args.families.split(",") if args.families else None))
    failed = results.count(False)
    print(f"gpu check: {len(results) - failed} of {len(results)} parts passed", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
