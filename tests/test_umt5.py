"""UMT5 (`UMT5ForConditionalGeneration`: mT5 with a relative position bias in every
self-attention layer) against HF's `generate` in float32: greedy and 4 beams (tokens and
scores) through the engine's CPU backend, the pooled encoder embedding, and greedy tokens
through the torch_native and Triton backends (the kernels interpreted) -- each reads every
layer's bias, in the encoder, the decoder's prefill and its decode steps. Sources longer than
the relative-attention max distance; two shapes: gated-gelu with a tied (scaled) head, and
relu with an untied one and unequal layer counts."""

from __future__ import annotations

import os

import pytest

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.tests.family_parity import check_embeddings, check_generate, cpu_engine
from seq2serve.tests.helpers import (
    SOURCES,
    hf_greedy,
    hf_model,
    make_scheduler,
    make_t5,
    request,
    run_to_completion,
)

MAX_NEW = 10
EOS = 1
SHAPES = {
    "gated_tied": dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
                       num_decoder_layers=2, feed_forward_proj="gated-gelu",
                       tie_word_embeddings=True, relative_attention_num_buckets=8,
                       relative_attention_max_distance=12, embed_scale=0.3, seed=1),
    "relu_untied": dict(d_model=36, d_kv=12, num_heads=3, d_ff=48, num_layers=3,
                        num_decoder_layers=2, feed_forward_proj="relu",
                        tie_word_embeddings=False, relative_attention_num_buckets=12,
                        relative_attention_max_distance=16, seed=2),
}


# the cases' settings (a tied head repeats tokens without the ban), and a factor on the
# untied head's EOS row that ends beam hypotheses at different lengths
SETTINGS = {"gated_tied": ({"no_repeat_ngram_size": 3}, 1.0), "relu_untied": ({}, 8.0)}


def _raise_eos(path: str, factor: float) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(f"{path}/model.safetensors")
    state["lm_head.weight"][EOS] *= factor
    save_file(state, f"{path}/model.safetensors", metadata={"format": "pt"})


@pytest.fixture(scope="module", params=sorted(SHAPES))
def served(request, tmp_path_factory):
    cfg = SHAPES[request.param]
    path = str(make_t5(tmp_path_factory.mktemp(request.param), umt5=True, **cfg))
    settings, eos_factor = SETTINGS[request.param]
    if eos_factor != 1.0:
        _raise_eos(path, eos_factor)
    # transformers 5 reads every UMT5 config as tied and so scales an untied head's logits
    # too; the checkpoint (as Google's umt5 configs) says untied: transformers 4's reading
    hf_model(path).config.tie_word_embeddings = cfg["tie_word_embeddings"]
    tok = load_tokenizer(path)
    sources = [tok(s).input_ids for s in (SOURCES[3], SOURCES[0], SOURCES[4])]
    assert max(map(len, sources)) > 2 * cfg["relative_attention_max_distance"]
    with cpu_engine(path) as engine:
        yield path, engine, sources, settings


def test_greedy_and_beams_give_hfs_tokens_and_scores(served):
    path, engine, sources, settings = served
    mc = ModelConfig.from_path(path)
    assert mc.architecture == "UMT5ForConditionalGeneration" and mc.arch.bias_per_layer
    cases = [dict(settings), dict(settings, num_beams=4, length_penalty=0.5)]
    lengths = check_generate(engine, path, sources, MAX_NEW, EOS, cases)
    if settings == {}:  # the raised EOS ended some hypotheses early
        assert min(lengths) < MAX_NEW, lengths


def test_embeddings_are_hfs_pooled_encoder_output(served):
    path, engine, sources, _ = served
    check_embeddings(engine, path, sources)


@pytest.mark.parametrize("backend", ["torch_native", "triton"])
def test_every_backend_reads_each_layers_bias(served, backend):
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU test; the GPU check runs the kernels")
    path, _, sources, _ = served
    sched = make_scheduler(path, attention_backend=backend, page_size=4)
    # a decoder prompt of several tokens runs the extend kernel over several positions
    requests = [(sources[0], None), (sources[2], [0, 37, 5, 12])]
    for i, (ids, decoder_ids) in enumerate(requests):
        sched.add_request(request(str(i), ids, decoder_ids, max_new_tokens=6))
    out = run_to_completion(sched)
    for i, (ids, decoder_ids) in enumerate(requests):
        assert out[str(i)] == hf_greedy(path, ids, 6, decoder_ids), (backend, i)
