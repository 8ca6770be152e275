"""`seq2serve bench serving` against a real server on the demo model: load from two client
processes (fixed concurrency and Poisson arrivals) merged into one report, and the offline
engine on the same workload with the ratio."""

from __future__ import annotations

import asyncio
import json

import pytest

from seq2serve.runtime.bench.serving import measure, print_summary
from seq2serve.runtime.bench.serving_load import LoadSpec, _sse_lines, make_prompts
from seq2serve.runtime.bench.serving_workers import split
from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
from seq2serve.tests.server_helpers import ServerProcess


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(str(default_demo_path()))
    yield srv
    srv.kill()


def test_split_shares_the_requests_concurrency_and_rate():
    spec = LoadSpec("http://x", tuple(make_prompts(7, 3)), 4, concurrency=5, rate=None)
    shares = split(spec, 3)
    assert sorted(p for s in shares for p in s.prompts) == sorted(spec.prompts)
    assert [s.concurrency for s in shares] == [2, 2, 1]
    assert [s.rate for s in split(LoadSpec("u", ("a", "b"), 4, None, 6.0), 2)] == [3.0, 3.0]
    assert len(split(spec, 9)) == 7  # no worker without a prompt


@pytest.mark.parametrize("concurrency, rate", [(3, None), (None, 40.0)],
                         ids=["concurrency", "poisson"])
def test_two_workers_report_merged_figures(server, concurrency, rate):
    res = measure(server.url, 6, 4, 5, concurrency, rate, workers=2)
    assert (res["completed"], res["failed"], res["workers"]) == (6, 0, 2), res["errors"]
    assert res["output_tokens"] == 6 * 5  # the server's usage counts, ignore_eos
    assert res["input_tokens"] > 0 and res["requests_per_s"] > 0
    for name in ("ttft", "itl", "tpot", "e2e"):
        f = res[name]
        assert 0 < f["p50_ms"] <= f["p90_ms"] <= f["p99_ms"], name
    assert res["ttft"]["p50_ms"] <= res["e2e"]["p99_ms"]
    assert 1.0 <= res["tokens_per_event"] <= 5.0  # (5 tokens a stream, at least one event)
    assert len(res["client_cpu_share"]) == 2


def test_beam_requests_are_answered_whole(server, capsys):
    """`--num-beams`: beam search is not streamed, so a request's first token comes with its
    last (TTFT = E2E), with no inter-token gaps and no time a token (not a TPOT of 0, which
    read as a figure); the server's usage counts the tokens."""
    res = measure(server.url, 4, 4, 5, 2, None, workers=1, num_beams=3)
    assert (res["completed"], res["failed"], res["num_beams"]) == (4, 0, 3), res["errors"]
    assert res["output_tokens"] == 4 * 5 and res["input_tokens"] > 0
    assert res["ttft"] == res["e2e"] and not res["itl"] and not res["tpot"]
    print_summary(res)
    out = capsys.readouterr().out
    assert "answered whole" in out and "TPOT" not in out and "TTFT" in out
    with pytest.raises(ValueError, match="num-beams"):
        measure(server.url, 1, 1, 1, 1, None, num_beams=0)


def test_cli_with_workers_and_compare_offline(server, tmp_path, capsys):
    import json

    from seq2serve.runtime.cli import main

    out = tmp_path / "serving.json"
    assert main(["bench", "serving", "--base-url", server.url, "--num-requests", "4",
                 "--input-len", "4", "--output-len", "5", "--concurrency", "2", "--workers", "2",
                 "--compare-offline", "--engine-args", '{"device": "cpu"}',
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["completed"] == 4 and res["workers"] == 2
    off = res["offline"]
    assert off["model_path"] == str(default_demo_path()) and off["output_tokens"] == 4 * 5
    assert res["server_over_offline"] == pytest.approx(
        res["output_tokens_per_s"] / off["output_tokens_per_s"])
    assert off["scheduler"]["forwards_by_mode"]["decode"] > 0  # (the engine's own window)
    assert off["scheduler"]["encoder_inputs"] == 4
    out = capsys.readouterr().out
    assert "server / offline" in out and "warm-up (not in the figures below): 2/2" in out
    assert "server during the load: " in out and "offline engine's scheduler: " in out
    assert res["warmup"]["completed"] == 2  # the default: one round of --concurrency


def test_the_servers_side_of_the_load_comes_with_the_figures(server):
    """`server`: the scheduler's counters over the load (/debug/stats before and after): the
    load's encoder inputs (prompts no earlier test sent) and its forwards, by mode."""
    res = measure(server.url, 4, 6, 5, 2, None, seed=41)
    s = res["server"]
    assert s["encoder_inputs"] == 4
    assert sum(s["forwards_by_mode"].values()) == s["forwards"]
    # 5 tokens each, at most 2 requests at once: at least 2 rounds of 4 decode steps
    assert 8 <= s["forwards_by_mode"]["decode"] <= 4 * 5
    assert s["seconds"] >= res["seconds"] * 0.5 and s["step_ms"] > 0
    assert s["device_busy_ms_per_step"] == 0.0  # (no CUDA events on the CPU)


def _generated_tokens(url: str) -> float:
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    return float(next(ln.split()[-1] for ln in text.splitlines()
                      if ln.startswith("seq2serve_generation_tokens_total")))


def test_a_warm_up_round_runs_first_and_stays_out_of_the_figures(server):
    """By default (`warmup=None`) one round of the load's concurrency runs before the timed
    load, with prompts the load does not repeat; the server generates for both, the figures
    count only the load's, and the warm-up's come apart."""
    from seq2serve.runtime.bench.serving import warmup_count, warmup_workload, workload

    before = _generated_tokens(server.url)
    res = measure(server.url, 4, 4, 5, 3, None, warmup=None)
    assert (res["completed"], res["output_tokens"]) == (4, 4 * 5), res["errors"]
    w = res["warmup"]
    assert (w["completed"], w["output_tokens"]) == (3, 3 * 5), w["errors"]
    assert _generated_tokens(server.url) - before == (4 + 3) * 5
    assert not set(warmup_workload(3, 4, 0, None)) & set(workload(4, 4, 0))
    assert [warmup_count(100, 8, None), warmup_count(5, 8, None), warmup_count(100, None, 2.6),
            warmup_count(100, None, 0.2)] == [8, 5, 3, 1]
    assert measure(server.url, 2, 4, 5, 2, None)["warmup"] is None  # (the function: none)
    with pytest.raises(ValueError, match="warmup-requests"):
        measure(server.url, 1, 1, 1, 1, None, warmup=-1)


def test_sse_lines_split_at_line_feeds_only():
    """A random model's text may hold U+2028 or U+0085: one event stays one line (httpx's
    aiter_lines cut such an event, and the load counted a failed request)."""
    event = "data: " + json.dumps({"choices": [{"text": "a\u2028b\x85c\rd"}]},
                                  ensure_ascii=False)
    data = (event + "\r\n\ndata: [DONE]\n\n").encode()

    class Chunked:
        async def aiter_bytes(self):
            for i in range(0, len(data), 5):
                yield data[i:i + 5]

    async def lines():
        return [line async for line in _sse_lines(Chunked())]

    got = asyncio.run(lines())
    assert got[0] == event.encode() and b"data: [DONE]" in got
    assert json.loads(got[0][6:])["choices"][0]["text"] == "a\u2028b\x85c\rd"
