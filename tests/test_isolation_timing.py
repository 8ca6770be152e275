"""Issue 39's paired timing test: with `--dp-size 2` and isolation on (the default `user`), the
time bob waits for a source alice has just sent is no different from the time he waits for a
fresh one (paired, >= 200 trials, a two-sided sign-flip permutation test at p > 0.05), and no
response field tells them apart. A statistical test fails 5 % of the time even where nothing
leaks, so it runs only with SEQ2SERVE_SOAK=1 (`SEQ2SERVE_SOAK=1 pytest tests/
test_isolation_timing.py -s` prints the figures); docs/reliability.md has a run's result."""

from __future__ import annotations

import os
import random
import statistics
import time

import httpx
import pytest

from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.server_helpers import ServerProcess

pytestmark = pytest.mark.skipif(os.environ.get("SEQ2SERVE_SOAK") != "1",
                                reason="a timing soak: SEQ2SERVE_SOAK=1")

TRIALS = 200
FIELDS = ("cached_tokens", "encoder_cache_hit", "replica")


def _send(client: httpx.Client, text: str, user: str) -> tuple[float, dict]:
    start = time.perf_counter()
    r = client.post("/generate", json={"text": text, "user": user,
                                       "sampling_params": {"max_new_tokens": 4,
                                                           "temperature": 0}})
    elapsed = time.perf_counter() - start
    assert r.status_code == 200, r.text
    return elapsed, r.json()["meta_info"]


def _sign_flip_p(diffs: list[float], rounds: int = 20_000, seed: int = 0) -> float:
    """Two-sided p of the mean paired difference under random sign flips."""
    rng = random.Random(seed)
    observed = abs(sum(diffs))
    hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) >= observed
               for _ in range(rounds))
    return (hits + 1) / (rounds + 1)


def test_another_users_source_costs_bob_the_same_time_as_a_fresh_one():
    srv = ServerProcess(str(default_demo_path()), "--dp-size", "2", "--max-total-tokens",
                        "16384", "--max-cross-tokens", "16384")
    rng = random.Random(39)
    numbers = rng.sample(range(100_000, 1_000_000), 2 * TRIALS)
    diffs, seen, fresh = [], [], []
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            for i in range(5):  # warm both replicas
                _send(c, f"translate digits to English: {i}", "warm")
            for t in range(TRIALS):
                a, b = (f"translate digits to English: {n}" for n in numbers[2 * t:2 * t + 2])
                _send(c, a, "alice")  # alice's source: cached under her namespace only
                order = [(a, seen), (b, fresh)]
                rng.shuffle(order)  # which of the two bob sends first is random
                times = {}
                for text, bucket in order:
                    elapsed, meta = _send(c, text, "bob")
                    assert not meta["encoder_cache_hit"] and meta["cached_tokens"] == 0, meta
                    assert "replica" not in meta, meta
                    bucket.append(elapsed)
                    times[text] = elapsed
                diffs.append(times[a] - times[b])
    finally:
        srv.kill()
    p = _sign_flip_p(diffs)
    print(f"{TRIALS} paired trials: bob's time for alice's source median "
          f"{statistics.median(seen) * 1e3:.1f} ms, for a fresh one "
          f"{statistics.median(fresh) * 1e3:.1f} ms; mean difference "
          f"{statistics.mean(diffs) * 1e3:+.2f} ms, sign-flip p = {p:.3f}")
    assert p > 0.05, p
