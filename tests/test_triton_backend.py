"""The Triton backend end to end: the scheduler (on the CPU, kernels interpreted) generates the
same greedy tokens as the torch_native backend and as Hugging Face."""

from __future__ import annotations

import os

import pytest

from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.tests.helpers import SOURCES, hf_greedy, make_scheduler, request, run_to_completion

MAX_NEW = 8

# the helpers' scheduler runs on the CPU, where only the interpreter can run Triton kernels
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU engine test; on a GPU see test_triton_kernels.py")


def _generate(path: str, backend: str, requests: list[tuple[list[int], list[int] | None]],
              page_size: int) -> dict[str, list[int]]:
    sched = make_scheduler(path, attention_backend=backend, page_size=page_size)
    for i, (ids, decoder_ids) in enumerate(requests):
        sched.add_request(request(str(i), ids, decoder_ids, max_new_tokens=MAX_NEW,
                                  ignore_eos=True))
    return run_to_completion(sched)


@pytest.mark.parametrize("name,page_size", [("mt5_gated_untied", 16), ("t5_silu_oddheads", 4)])
def test_triton_matches_torch_native_and_hf(t5_checkpoints, name, page_size):
    path = t5_checkpoints[name]
    tok = load_tokenizer(path)
    sources = [tok(s).input_ids for s in (SOURCES[0], SOURCES[2], SOURCES[3])]
    # a decoder prompt longer than one token runs the extend kernel over several positions
    requests = [(sources[0], None), (sources[1], None), (sources[2], [0, 37, 5, 12])]
    out = _generate(path, "triton", requests, page_size)
    assert out == _generate(path, "torch_native", requests, page_size)
    for i, (ids, decoder_ids) in enumerate(requests):
        assert out[str(i)] == hf_greedy(path, ids, MAX_NEW, decoder_ids), f"request {i}"


@pytest.mark.long  # (~60 s interpreted; the GPU check's float32 beam tests run the kernel)
def test_beam_groups_read_their_cross_kv_once_and_match_hf(tmp_path, monkeypatch):
    """Beam search on the Triton backend: decode steps with beam groups run the beam-group
    cross-attention kernel (a group's K/V read once for its rows), mixed with a greedy request
    (a group of one), and the hypotheses and scores are HF's."""
    from pathlib import Path

    from seq2serve.runtime.attention import triton_backend
    from seq2serve.tests.helpers import T5_CONFIGS, make_t5
    from seq2serve.tests.test_beam_search import CASES, beam_request, hf_beams, run

    path = str(make_t5(Path(tmp_path) / "t5", **T5_CONFIGS["t5_relu_untied"]))
    calls = []
    kernel = triton_backend.beam_cross_attention_rows

    def counted(*args, **kwargs):
        calls.append(int(args[5].max()))  # the largest group of the call
        return kernel(*args, **kwargs)

    monkeypatch.setattr(triton_backend, "beam_cross_attention_rows", counted)
    tok = load_tokenizer(path)
    sources = [tok(s).input_ids for s in SOURCES[:2]]
    sched = make_scheduler(path, attention_backend="triton", page_size=4)
    expected = {}
    for c, case in enumerate(CASES[:2]):
        for s, ids in enumerate(sources):
            rid = f"c{c}s{s}"
            sched.add_request(beam_request(rid, ids, *case))
            expected[rid] = hf_beams(path, ids, *case)
    sched.add_request(request("greedy", sources[0], max_new_tokens=4))
    got = run(sched)
    assert calls and max(calls) == max(case[0] for case in CASES[:2])
    for rid, hyps in expected.items():
        rids = [rid] + [f"{rid}-{i}" for i in range(1, len(hyps))]
        for r, (tokens, score) in zip(rids, hyps):
            assert got[r][0] == tokens, r
            assert got[r][1]["beam_score"] == pytest.approx(score, abs=1e-4), r
    assert got["greedy"][0] == hf_greedy(path, sources[0], 4)
