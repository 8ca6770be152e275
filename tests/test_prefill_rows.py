"""Short prefills replayed as decode rows (`worker_batch.decode_rows`, what the CUDA graph
runner does with them): the logits of every request's last token equal the EXTEND forward's,
for T5 (cached decoder prefix, forced prefixes), Llama (shared prompt prefix) and Mllama (text
before an image, two images, a text-only request in the same batch). The torch_native backend
masks by position; the Triton decode kernel reads exactly each row's keys [0, p], so only it
can catch a wrong row length."""

from __future__ import annotations

import pytest
import torch

from seq2serve.encoders.encoder_input import cross_spans
from seq2serve.encoders.image_processor import ImageProcessor
from seq2serve.runtime.attention.forward_batch import ForwardMode
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.executor.worker_batch import decode_rows
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint, write_mllama_checkpoint
from seq2serve.tests.helpers import make_scheduler, request
from seq2serve.tests.mllama_oracle import random_image


def _sp() -> SamplingParams:
    return SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 4, "ignore_eos": True})


def _both_ways(sched, requests: list[TokenizedRequest]) -> tuple[torch.Tensor, torch.Tensor]:
    """Admit `requests` (one EXTEND batch); return its last-token logits computed as EXTEND
    and as decode rows."""
    captured = []
    launch = sched.worker.launch

    def spy(wb):
        if wb.forward_mode is ForwardMode.EXTEND:
            captured.append(wb)
        return launch(wb)

    sched.worker.launch = spy
    for r in requests:
        sched.add_request(r)
    sched.step()
    sched.worker.launch = launch
    (wb,) = captured
    lens = wb.inputs.extend_lens
    assert sum(lens) > len(lens)  # a real prefill, not 1 token each
    runner = sched.worker.model_runner
    extend = runner.forward(wb).logits
    rows, last = decode_rows(wb)
    assert rows.forward_mode is ForwardMode.DECODE and rows.batch_size == sum(lens)
    as_rows = runner.forward(rows).logits[last]
    return extend, as_rows


@pytest.mark.parametrize("backend", ["torch_native", "torch_batched", "triton"])
def test_t5_prefill_as_rows_with_a_cached_prefix(t5_dir, backend):
    sched = make_scheduler(t5_dir, attention_backend=backend, page_size=4)
    prefix = [0, 644, 19, 3, 9, 1566, 12, 5, 37]
    sched.add_request(request("warm", [5, 6, 7, 8, 9], prefix, max_new_tokens=1))
    while sched.has_work:
        sched.step()
    # the same source and prefix plus more: 8 tokens from the radix cache, the rest computed
    extend, rows = _both_ways(sched, [
        request("a", [5, 6, 7, 8, 9], prefix + [629, 17, 4], max_new_tokens=4),
        request("b", [11, 12, 13], [0, 71, 72, 73, 74, 75], max_new_tokens=4)])
    assert sched.running[0].cached_tokens == 8
    torch.testing.assert_close(rows, extend, rtol=1e-4, atol=1e-4)
    sched.check_integrity()


@pytest.mark.parametrize("backend", ["torch_native", "torch_batched", "triton"])
def test_llama_prefill_as_rows_with_a_shared_prefix(tmp_path, backend):
    path = str(write_llama_checkpoint(tmp_path / "llama", init_scale=10.0))
    sched = make_scheduler(path, attention_backend=backend, page_size=4)
    shared = list(range(100, 113))
    sched.add_request(TokenizedRequest("warm", [], shared, SamplingParams.from_dict(
        {"temperature": 0, "max_new_tokens": 1})))
    while sched.has_work:
        sched.step()
    extend, rows = _both_ways(sched, [
        TokenizedRequest("a", [], shared + [7, 8, 9], _sp()),
        TokenizedRequest("b", [], [200, 201, 202, 203, 204], _sp())])
    assert sched.running[0].cached_tokens == 12
    torch.testing.assert_close(rows, extend, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["torch_native", "torch_batched", "triton"])
def test_mllama_prefill_as_rows_with_image_groups(tmp_path, backend):
    path = str(write_mllama_checkpoint(tmp_path / "mllama", seed=3))
    sched = make_scheduler(path, attention_backend=backend)
    arch = sched.model_config.arch
    proc = ImageProcessor(path, "m", arch.vision.num_patches)
    imgs = [proc(str(i).encode(), lambda i=i, s=s: random_image(i, *s))
            for i, s in enumerate([(40, 90), (100, 50)])]
    image = arch.image_token_id

    def req(rid, ids, features):
        return TokenizedRequest(rid, [], ids, _sp(), encoder_inputs=features, cross_spans=cross_spans(
            ids, image, [f.num_tokens for f in features]))

    extend, rows = _both_ways(sched, [
        req("text-then-image", [1, 50, 51, image, 52, 53], imgs[:1]),
        req("two-images", [image, image, 1, 60, 61, 62], imgs),
        req("text-only", [1, 70, 71, 72], [])])
    torch.testing.assert_close(rows, extend, rtol=1e-4, atol=1e-4)
