"""`seq2serve bench offline --baseline ct2`: CTranslate2 converts the same checkpoint and runs
the same workload in the same command; its greedy outputs are an independent oracle of
seq2serve's (both force the same number of tokens, EOS an ordinary token)."""

from __future__ import annotations

import json
import subprocess
import sys

from seq2serve.tests.helpers import T5_CONFIGS, make_t5


def test_ct2_baseline_runs_the_same_model_and_agrees(tmp_path):
    path = make_t5(tmp_path / "t5", **T5_CONFIGS["t5_gated_tied"])
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "-m", "seq2serve.runtime.cli", "bench", "offline",
                        "--model-path", str(path), "--device", "cpu", "--dtype", "float32",
                        "--num-requests", "12", "--input-len", "10", "--output-len", "9",
                        "--batch-sizes", "6", "--baseline", "ct2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(out.read_text())
    (ct2,) = results["hf"]
    assert ct2["mode"] == "ct2-float32" and ct2["tokens_per_s"] > 0
    assert ct2["same_output_as_seq2serve"] == 12
    assert "ratio seq2serve / ct2-float32" in p.stdout


def test_ct2_baseline_is_refused_where_it_cannot_run(tmp_path):
    path = make_t5(tmp_path / "t5", **T5_CONFIGS["t5_gated_tied"])
    p = subprocess.run([sys.executable, "-m", "seq2serve.runtime.cli", "bench", "one-batch",
                        "--model-path", str(path), "--device", "cpu", "--baseline", "ct2"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "--baseline ct2 is for bench offline" in p.stderr
    p = subprocess.run([sys.executable, "-m", "seq2serve.runtime.cli", "bench", "offline",
                        "--model-path", str(path), "--baseline", "gpu-magic"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "--baseline takes none, hf, ct2" in p.stderr
