"""The command line and the package layout, as a user meets them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from seq2serve.tests.helpers import hf_greedy

BIN = Path(sys.executable).parent


def _run(*args, cwd=None, env=None):
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, **(env or {})})


def test_demo_checkpoint_and_generate(tmp_path):
    out = tmp_path / "demo"
    r = _run(str(BIN / "seq2serve"), "demo-checkpoint", "--family", "t5", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert "RANDOM" in (out / "README.md").read_text()
    prompt = "translate English to German: The house is wonderful."
    r = _run(str(BIN / "seq2serve"), "generate", "--model-path", str(out), "--prompt", prompt,
             "--max-new-tokens", "6", "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    ids = [13959, 1566, 12, 2968, 10, 37, 629, 19, 1627, 5, 1]  # the canonical T5 ids
    assert result["output_ids"] == hf_greedy(str(out), ids, 6)


def test_generate_without_model_path_uses_the_bundled_demo():
    r = _run(str(BIN / "seq2serve"), "generate", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "bundled demo" in r.stderr
    assert "one thousand nine hundred eighty-four" in r.stdout and "forty-two" in r.stdout


def test_generate_reports_a_bad_model_path(tmp_path):
    r = _run(str(BIN / "seq2serve"), "generate", "--model-path", str(tmp_path), "--prompt", "x")
    assert r.returncode == 2 and "no config.json" in r.stderr


def test_only_the_seq2serve_package_is_importable(tmp_path):
    code = ("import importlib.util as u, seq2serve.runtime, seq2serve.models.mt5;"
            "print(u.find_spec('runtime'), u.find_spec('models'), u.find_spec('encoders'))")
    r = _run(sys.executable, "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["None", "None", "None"]
