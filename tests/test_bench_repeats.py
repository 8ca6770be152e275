"""`bench offline --repeats N`: the runs interleave (each round runs every system once, in
turn), each side is its median over the rounds, and the ratio is the ratio of the medians;
one real run with CTranslate2 on a tiny checkpoint checks the command end to end."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from seq2serve.runtime.bench.repeats import interleave, paired_ratios, summarize
from seq2serve.tests.helpers import T5_CONFIGS, make_t5


def test_rounds_alternate_the_systems_and_keep_each_ones_results_in_order():
    calls = []

    def runner(name, speeds):
        it = iter(speeds)
        return lambda: calls.append(name) or {"tokens_per_s": next(it)}

    seen = []
    runs = interleave({"ours": runner("ours", [5, 1, 9]), "ct2": runner("ct2", [4, 8, 2])}, 3,
                      on_run=lambda r, name, res: seen.append((r, name)))
    assert calls == ["ours", "ct2"] * 3
    assert seen == [(r, n) for r in range(3) for n in ("ours", "ct2")]
    assert [r["tokens_per_s"] for r in runs["ours"]] == [5, 1, 9]
    assert [r["tokens_per_s"] for r in runs["ct2"]] == [4, 8, 2]


def test_median_min_max_and_ratios():
    ours = [{"tokens_per_s": v} for v in (700, 520, 860, 610, 790)]
    theirs = [{"tokens_per_s": v} for v in (640, 910, 700, 600, 820)]
    s, t = summarize(ours), summarize(theirs)
    assert s["tokens_per_s"] == statistics.median([700, 520, 860, 610, 790]) == 700
    assert (s["tokens_per_s_min"], s["tokens_per_s_max"], s["repeats"]) == (520, 860, 5)
    assert s["tokens_per_s_runs"] == [700, 520, 860, 610, 790]
    assert t["tokens_per_s"] == 700  # even count would average the middle two
    assert summarize([{"tokens_per_s": 1}, {"tokens_per_s": 4}])["tokens_per_s"] == 2.5
    assert paired_ratios(ours, theirs) == [a / b for a, b in
                                           zip((700, 520, 860, 610, 790),
                                               (640, 910, 700, 600, 820))]
    with pytest.raises(ValueError):
        paired_ratios(ours, theirs[:2])


def test_zero_repeats_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        interleave({"a": dict}, 0)


def test_repeats_interleave_seq2serve_and_ctranslate2_in_one_command(tmp_path):
    path = make_t5(tmp_path / "t5", **T5_CONFIGS["t5_gated_tied"])
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "-m", "seq2serve.runtime.cli", "bench", "offline",
                        "--model-path", str(path), "--device", "cpu", "--dtype", "float32",
                        "--num-requests", "8", "--input-len", "10", "--output-len", "6",
                        "--batch-sizes", "8", "--baseline", "ct2", "--repeats", "2",
                        "--json", str(out)], check=False, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rounds = [line.split()[2] for line in p.stdout.splitlines() if line.startswith("round ")]
    assert rounds == ["seq2serve", "ct2-float32"] * 2
    results = json.loads(out.read_text())
    (ours,), (ct2,) = results["seq2serve"], results["hf"]
    for side in (ours, ct2):
        speeds = [r["tokens_per_s"] for r in side["runs"]]
        assert side["repeats"] == 2 and side["tokens_per_s"] == statistics.median(speeds)
        assert side["tokens_per_s_min"] == min(speeds) > 0
    for r in ours["runs"]:  # the scheduler's collector pauses in each timed run, per gen
        assert len(r["gc_pause_ms"]) == 3 and min(r["gc_pause_ms"]) >= 0
    assert ct2["seq2serve_ratio"] == pytest.approx(ours["tokens_per_s"] / ct2["tokens_per_s"])
    assert len(ct2["paired_ratios"]) == 2
    assert ct2["same_output_as_seq2serve"] == 8  # CTranslate2 is the oracle of the outputs
    assert "(of the medians)" in p.stdout


def test_repeats_with_a_baseline_refuse_several_concurrencies(tmp_path):
    path = make_t5(tmp_path / "t5", **T5_CONFIGS["t5_gated_tied"])
    p = subprocess.run([sys.executable, "-m", "seq2serve.runtime.cli", "bench", "offline",
                        "--model-path", str(path), "--device", "cpu", "--dtype", "float32",
                        "--num-requests", "4", "--batch-sizes", "2,4", "--baseline", "ct2",
                        "--repeats", "2"], check=False, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode != 0 and "one --batch-sizes value" in p.stderr
    p = subprocess.run([sys.executable, "-m", "seq2serve.runtime.cli", "bench", "offline",
                        "--model-path", str(path), "--repeats", "0"],
                       check=False, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode != 0 and "--repeats takes a positive integer" in p.stderr
