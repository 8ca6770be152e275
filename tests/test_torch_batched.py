"""The CPU backend's batched decode steps against the reference backend (one request at a
time): the same logits at every step, for T5 (relative bias by distance, requests of several
lengths), Llama (grouped KV heads) and Mllama (per-token cross-attention ranges, a text-only
request beside image requests)."""

from __future__ import annotations

import torch

from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint, write_mllama_checkpoint
from seq2serve.tests.helpers import SOURCES, make_scheduler, record_results, request
from seq2serve.tests.mllama_oracle import random_image


def _steps(path: str, backend: str, requests, **kwargs) -> list[tuple[list[str], torch.Tensor]]:
    sched = make_scheduler(path, attention_backend=backend, page_size=4, **kwargs)
    steps = record_results(sched)
    for r in requests():
        sched.add_request(r)
    while sched.has_work:
        sched.step()
        sched.check_integrity()
    return [(rids, out.logits.clone()) for rids, out in steps]


def _same(path: str, requests, **kwargs) -> None:
    native = _steps(path, "torch_native", requests, **kwargs)
    batched = _steps(path, "torch_batched", requests, **kwargs)
    assert [r for r, _ in native] == [r for r, _ in batched]
    decode_steps = 0
    for (rids, a), (_, b) in zip(native, batched):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=str(rids))
        decode_steps += len(rids) > 1
    assert decode_steps > 3


def test_t5_decode_steps_match_the_reference(t5_dir):
    from seq2serve.runtime.config.tokenizer import load_tokenizer

    tok = load_tokenizer(t5_dir)
    sources = [tok(s).input_ids for s in SOURCES[:4]]

    def requests():
        return [request(f"r{i}", ids, max_new_tokens=6 + 3 * i, ignore_eos=True)
                for i, ids in enumerate(sources)]

    _same(t5_dir, requests)


def test_t5_kept_cross_kv_follow_requests_that_replace_finished_ones(t5_dir):
    """Two running rows for six requests of different sources: each finished request's
    table row and cross K/V slots go to the next one while the other row decodes on, so the
    cross K/V kept across decode steps must be dropped and gathered again."""
    from seq2serve.runtime.config.tokenizer import load_tokenizer

    tok = load_tokenizer(t5_dir)
    sources = [tok(s).input_ids for s in SOURCES[:6]]

    def requests():
        return [request(f"r{i}", ids, max_new_tokens=3 + 2 * (i % 3), ignore_eos=True)
                for i, ids in enumerate(sources)]

    _same(t5_dir, requests, max_running_requests=2)


def test_llama_decode_steps_match_the_reference(tmp_path):
    path = str(write_llama_checkpoint(tmp_path / "llama", init_scale=10.0, seed=1,
                                      num_attention_heads=4, num_key_value_heads=2))

    def requests():
        return [request(f"r{i}", [], list(range(5, 9 + 3 * i)), max_new_tokens=8,
                        ignore_eos=True) for i in range(3)]

    _same(path, requests)


def test_mllama_decode_steps_match_the_reference(tmp_path):
    from seq2serve.encoders.encoder_input import cross_spans
    from seq2serve.encoders.image_processor import ImageProcessor
    from seq2serve.runtime.config.model_config import ModelConfig
    from seq2serve.runtime.config.sampling_params import SamplingParams
    from seq2serve.runtime.messages.io_struct import TokenizedRequest

    path = str(write_mllama_checkpoint(tmp_path / "mllama", seed=3))
    arch = ModelConfig.from_path(path).arch
    proc = ImageProcessor(path, "m", arch.vision.num_patches)
    image = arch.image_token_id
    sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 6, "ignore_eos": True})

    def requests():
        imgs = [proc(str(i).encode(), lambda i=i, s=s: random_image(i, *s))
                for i, s in enumerate([(40, 90), (100, 50)])]

        def req(rid, ids, features):
            return TokenizedRequest(rid, [], ids, sp, encoder_inputs=features,
                                    cross_spans=cross_spans(ids, image,
                                                            [f.num_tokens for f in features]))

        return [req("text-then-image", [1, 50, 51, image, 52, 53], imgs[:1]),
                req("two-images", [image, image, 1, 60, 61, 62], imgs),
                req("text-only", [1, 70, 71, 72], [])]

    _same(path, requests)
