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
