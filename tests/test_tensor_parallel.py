"""Tensor parallelism on the CPU (gloo): `tp_size=2` gives the same greedy tokens as
Hugging Face (and so as `tp_size=1`) in float32 for T5 (6 heads), Llama (GQA: 6 query heads,
2 key/value heads), Mllama (with images), T5Gemma (GQA, sliding windows, soft-caps; beams
too), the BART family (Marian, BART, M2M100 as NLLB, mBART, Pegasus; beams too) and
Florence-2 (with images), through `Seq2SeqEngine`; sizes that do not divide the heads are
refused with a message naming them; a rank that dies takes the server down."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from seq2serve import Seq2SeqEngine
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.tools.demo_checkpoint import (
    write_llama_checkpoint,
    write_mllama_checkpoint,
    write_pegasus_checkpoint,
    write_t5gemma_checkpoint,
)
from seq2serve.tests.bart_checkpoints import CORPUS, write_bart_checkpoint
from seq2serve.tests.bart_cnn_checkpoints import GENERATION, write_bart_cnn_checkpoint
from seq2serve.tests.family_parity import check_generate, hf_generate
from seq2serve.tests.helpers import SOURCES, hf_greedy, make_t5
from seq2serve.tests.server_helpers import ServerProcess

GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
REGEX = "[a-z]{2,5}-[0-9]{2,4}( [a-z]{1,4}){0,2}"
SEEDED = {"max_new_tokens": 8, "temperature": 1.5, "top_p": 0.95, "seed": 7, "ignore_eos": True}
# 6 heads (3 a rank), gated and plain feed-forward, tied and untied heads; an odd vocabulary
# (the last rank's embedding rows are padding)
T5_TP = {"vocab_size": 32101, "d_model": 48, "d_kv": 8, "num_heads": 6, "d_ff": 96,
         "num_layers": 2, "num_decoder_layers": 2, "feed_forward_proj": "gated-gelu",
         "tie_word_embeddings": False, "relative_attention_num_buckets": 8,
         "relative_attention_max_distance": 16, "seed": 4}
POOLS = {"device": "cpu", "max_total_tokens": 2048, "max_cross_tokens": 2048}


@pytest.fixture(scope="module")
def t5_tp_dir(tmp_path_factory):
    return str(make_t5(tmp_path_factory.mktemp("t5tp"), **T5_TP))


def test_t5_tp2_matches_hf_and_tp1(t5_tp_dir):
    tok = load_tokenizer(t5_tp_dir)
    sources = SOURCES[:6]
    refs = [hf_greedy(t5_tp_dir, tok(s).input_ids, GREEDY["max_new_tokens"]) for s in sources]
    assert len({tuple(r) for r in refs}) > 2  # the oracle's outputs differ by source
    with Seq2SeqEngine(model_path=t5_tp_dir, tp_size=2, **POOLS) as engine:
        assert engine.stats()["tp_devices"] == ["cpu", "cpu"]
        outs = engine.generate(prompt=sources, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == refs
        # a repeated source hits the encoder cache: its cross K/V slots, named by rank 0's
        # books, hold the right heads on both ranks
        again = engine.generate(prompt=sources[0], sampling_params=GREEDY)
        assert again["meta_info"]["encoder_cache_hit"] and again["output_ids"] == refs[0]
        sampled = engine.generate(prompt=sources, sampling_params=SEEDED)
        engine.check_integrity()
    with Seq2SeqEngine(model_path=t5_tp_dir, tp_size=1, **POOLS) as engine:
        single = engine.generate(prompt=sources, sampling_params=GREEDY)
        assert [o["output_ids"] for o in single] == refs
        # a request's K/V bytes count every rank's slice: as much as on one rank
        assert [o["meta_info"]["kv_bytes"] for o in single] == \
            [o["meta_info"]["kv_bytes"] for o in outs]
        # seeded sampling draws the same tokens from the gathered logits as from one rank's
        alone = engine.generate(prompt=sources, sampling_params=SEEDED)
    assert [o["output_ids"] for o in sampled] == [o["output_ids"] for o in alone]
    assert [o["output_ids"] for o in alone] != refs


def test_t5_int8_tp2_quantizes_each_shard_as_the_whole(t5_tp_dir):
    """Each rank quantizes its shard; a row-parallel shard takes its rows' scales over every
    rank's columns, so the 8-bit values are those of tp_size 1 and so are the tokens."""
    sources = SOURCES[:4]
    outs = {}
    for tp in (2, 1):
        with Seq2SeqEngine(model_path=t5_tp_dir, tp_size=tp, quantization="int8",
                           **POOLS) as engine:
            outs[tp] = [o["output_ids"] for o in engine.generate(prompt=sources,
                                                                 sampling_params=GREEDY)]
    assert outs[2] == outs[1]


def test_t5_tp2_host_tier_brings_back_every_ranks_heads(t5_tp_dir):
    """An encoder output evicted to the host tier comes back without the encoder: each rank
    stored and loaded its own heads' K/V (the scheduler's copies, replayed on rank 1)."""
    tok = load_tokenizer(t5_tp_dir)
    a, b = SOURCES[0], SOURCES[4]
    need = max(len(tok(a).input_ids), len(tok(b).input_ids))
    with Seq2SeqEngine(model_path=t5_tp_dir, tp_size=2, device="cpu", page_size=4,
                       max_cross_tokens=need + 4, encoder_hidden_cache_mb=0,
                       host_cache_gb=0.01) as engine:
        first = engine.generate(prompt=a, sampling_params=GREEDY)
        engine.generate(prompt=b, sampling_params=GREEDY)  # evicts a's cross K/V to the host
        again = engine.generate(prompt=a, sampling_params=GREEDY)
        stats = engine.stats()
        engine.check_integrity()
    assert first["output_ids"] == hf_greedy(t5_tp_dir, tok(a).input_ids, 8)
    assert again["meta_info"]["encoder_cache_hit"] and again["output_ids"] == first["output_ids"]
    assert stats["encoder_cache_host_hits"] == 1


def _hf_causal_greedy(path: str, ids: list[int], n: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, num_beams=1,
                          min_new_tokens=n, attention_mask=torch.ones(1, len(ids)))
    return out[0, len(ids):].tolist()


def test_llama_gqa_tp2_matches_hf_with_a_cached_prefix(tmp_path):
    # 6 query heads over 2 key/value heads: each rank keeps one group of 3
    path = str(write_llama_checkpoint(tmp_path / "llama", init_scale=10.0, seed=1,
                                      hidden_size=48, intermediate_size=96,
                                      num_attention_heads=6, num_key_value_heads=2))
    tok = load_tokenizer(path)
    prompts = ["The capital of France is", "1 2 3 4 5 6 7 8 9 10 11 12", "A long prompt " * 12]
    ids = [tok(p).input_ids for p in prompts]
    refs = [_hf_causal_greedy(path, i, GREEDY["max_new_tokens"]) for i in ids]
    assert len({tuple(r) for r in refs}) == len(refs)
    with Seq2SeqEngine(model_path=path, tp_size=2, page_size=4, **POOLS) as engine:
        outs = engine.generate(input_ids=ids, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == refs
        # the long prompt again: its prefix's slots come from the radix cache (rank 0's
        # books), written into every rank's table row
        again = engine.generate(input_ids=ids[2], sampling_params=GREEDY)
        assert again["meta_info"]["cached_tokens"] > 0 and again["output_ids"] == refs[2]
        # a grammar request under tensor parallelism (issue 41): the tokens of one process
        constrained = {"max_new_tokens": 30, "temperature": 0, "regex": REGEX}
        tp2 = engine.generate(input_ids=ids[:2], sampling_params=constrained)
        engine.check_integrity()
    with Seq2SeqEngine(model_path=path, page_size=4, **POOLS) as engine:
        tp1 = engine.generate(input_ids=ids[:2], sampling_params=constrained)
    assert [o["output_ids"] for o in tp2] == [o["output_ids"] for o in tp1]
    assert all(re.fullmatch(REGEX, o["text"]) for o in tp2), [o["text"] for o in tp2]


# T5Gemma: 4 query heads over 2 key/value heads (one group a rank) in both stacks, an encoder
# wider than the decoder (the cross K/V project its width to the decoder's heads), a window of
# 3 behind the sources and outputs, soft-caps that bend the scores, an odd vocabulary
_GEMMA = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
              sliding_window=3, attn_logit_softcapping=2.0, final_logit_softcapping=5.0,
              intermediate_size=48, num_hidden_layers=2)
T5GEMMA_TP = dict(vocab_size=32101, seed=2, encoder=dict(_GEMMA, hidden_size=40),
                  decoder=dict(_GEMMA, hidden_size=32))


@pytest.fixture(scope="module")
def t5gemma_tp_dir(tmp_path_factory):
    return str(write_t5gemma_checkpoint(tmp_path_factory.mktemp("t5gemma_tp"),
                                        tie_word_embeddings=False, **T5GEMMA_TP))


def _token_ids(path: str, n: int) -> list[list[int]]:
    tok = load_tokenizer(path)
    return [tok(s).input_ids for s in SOURCES[:n]]


def test_t5gemma_tp2_matches_hf_and_tp1(t5gemma_tp_dir):
    """Greedy and 4 beams (tokens and scores) are HF's at tp_size 2; greedy is tp_size 1's."""
    _tp2_matches_hf_and_tp1(t5gemma_tp_dir, _token_ids(t5gemma_tp_dir, 3), 6, 1)


def _tp2_matches_hf_and_tp1(path: str, sources: list[list[int]], max_new: int, eos: int,
                            settings: dict | None = None, skip: int = 1) -> None:
    """`settings` join both cases; `skip` 2 where the checkpoint forces a BOS."""
    settings = settings or {}
    with Seq2SeqEngine(model_path=path, tp_size=2, **POOLS) as engine:
        check_generate(engine, path, sources, max_new, eos,
                       [settings, dict(settings, num_beams=4)], skip)
        tp2 = engine.generate(input_ids=sources, sampling_params=GREEDY)
        engine.check_integrity()
    with Seq2SeqEngine(model_path=path, **POOLS) as engine:
        tp1 = engine.generate(input_ids=sources, sampling_params=GREEDY)
    assert [o["output_ids"] for o in tp2] == [o["output_ids"] for o in tp1]


def test_t5gemma_tp2_with_a_tied_head_matches_hf(tmp_path):
    """The head is each rank's rows of the decoder's embedding."""
    path = str(write_t5gemma_checkpoint(tmp_path, tie_word_embeddings=True, **T5GEMMA_TP))
    with Seq2SeqEngine(model_path=path, tp_size=2, **POOLS) as engine:
        check_generate(engine, path, _token_ids(path, 3), 6, 1, [{}])


# Marian: 6 encoder heads and 4 decoder heads (3 and 2 a rank), post-norm blocks, its own
# decoder embedding and an untied head (all three split by vocabulary rows over an odd
# vocabulary: one row past the tokenizer's), sinusoidal positions, final_logits_bias (pad
# raised: the trap it sets)
@pytest.fixture(scope="module")
def marian_tp_dir(tmp_path_factory):
    return str(write_bart_checkpoint("marian", tmp_path_factory.mktemp("marian_tp") / "m",
                                     seed=1, encoder_attention_heads=6, encoder_ffn_dim=48,
                                     vocab_size=83, decoder_vocab_size=83))


def test_marian_tp2_matches_hf_and_tp1(marian_tp_dir):
    """Greedy and 4 beams (tokens and scores) are HF's at tp_size 2; greedy is tp_size 1's."""
    path = marian_tp_dir
    tok = load_tokenizer(path)
    assert ModelConfig.from_path(path).arch.vocab_size % 2  # the last rank's rows: padding
    _tp2_matches_hf_and_tp1(path, [tok(s).input_ids for s in CORPUS[:3]], 8,
                            tok.eos_token_id)


def test_bart_tp2_with_a_tied_head_and_logits_bias_matches_hf(tmp_path):
    """bart-large-cnn's shape: 4 encoder and 2 decoder heads, the head tied to the shared
    embedding (each rank's rows of both), a final_logits_bias that raises EOS (added to the
    gathered logits), HF's forced BOS and EOS; greedy and 4 beams are HF's."""
    from transformers import AutoTokenizer

    path = str(write_bart_cnn_checkpoint("cnn", tmp_path / "cnn", seed=1))
    tok = AutoTokenizer.from_pretrained(path)
    sources = [tok(s).input_ids for s in SOURCES[:3]]
    beams = {k: GENERATION[k] for k in ("num_beams", "length_penalty", "no_repeat_ngram_size",
                                        "early_stopping")}
    cases = [({"no_repeat_ngram_size": 3}, {"num_beams": 1, "no_repeat_ngram_size": 3}),
             (beams, beams)]  # (ours, HF's: generation_config.json's 4 beams otherwise)
    with Seq2SeqEngine(model_path=path, tp_size=2, **POOLS) as engine:
        for case, hf_case in cases:
            got = engine.generate(input_ids=sources, sampling_params={
                "max_new_tokens": 10, "temperature": 0, **case})
            for ids, res in zip(sources, got):
                # after the start and forced BOS tokens (11 new: as test_bart_cnn.py's oracle)
                tokens, score = hf_generate(path, ids, 11, 2, skip=2, **hf_case)
                assert res["output_ids"] == tokens, (case, ids)
                if score is not None:
                    assert res["meta_info"]["beam_score"] == pytest.approx(score, abs=1e-4)
        engine.check_integrity()


def test_nllb_tp2_with_a_tied_head_matches_hf_and_tp1(tmp_path):
    """M2M100 as NLLB ships it: 4 encoder and 2 decoder heads (2 and 1 a rank), the head tied
    to the shared embedding (each rank's rows, over an odd vocabulary: one row past the
    tokenizer's 68), unscaled embeddings, relu, M2M100's offset sinusoidal positions; the
    tied head repeats tokens without the n-gram ban."""
    path = str(write_bart_checkpoint("nllb", tmp_path / "nllb", seed=5, vocab_size=69,
                                     decoder_attention_heads=2))
    tok = load_tokenizer(path)
    assert ModelConfig.from_path(path).arch.vocab_size % 2
    _tp2_matches_hf_and_tp1(path, [tok(s).input_ids for s in CORPUS[:3]], 8,
                            tok.eos_token_id, {"no_repeat_ngram_size": 3})


def test_mbart_tp2_with_a_forced_bos_matches_hf_and_tp1(tmp_path):
    """mBART-50: 4 encoder and 2 decoder heads, pre-norm blocks with a last norm in each
    stack, learned positions, scaled embeddings, tanh-approximated gelu, an untied head and
    final_logits_bias (added to the gathered logits), generation_config.json's forced BOS
    (German) after the start token."""
    path = str(write_bart_checkpoint("mbart", tmp_path / "mbart", seed=3,
                                     activation_function="gelu_new"))
    tok = load_tokenizer(path)
    _tp2_matches_hf_and_tp1(path, [tok(s).input_ids for s in CORPUS[:3]], 8,
                            tok.eos_token_id, skip=2)


def test_pegasus_tp2_with_a_tied_head_matches_hf_and_tp1(tmp_path):
    """pegasus-large's shape (tests/test_pegasus.py's: 4 encoder and 2 decoder heads, scaled
    embeddings, relu, the head tied to the shared embedding, its n-gram ban) over an odd
    vocabulary, with sinusoidal positions, final_logits_bias and the forced EOS at the length
    limit."""
    from seq2serve.tests.test_pegasus import SHAPES

    config, settings = SHAPES["large"]
    path = str(write_pegasus_checkpoint(tmp_path / "pegasus", seed=1, vocab_size=32101,
                                        **config))
    _tp2_matches_hf_and_tp1(path, _token_ids(path, 3), 8, 1, settings)


@pytest.mark.parametrize("shape", ["untied", "tied"])
def test_florence2_tp2_matches_hf_with_images(tmp_path, monkeypatch, shape):
    """The language model split as BART's (untied: 4 encoder and 2 decoder heads; tied: 2 and
    2, the head each rank's rows of the shared embedding); the vision tower whole on each
    rank."""
    from seq2serve.tests import florence2_checkpoints
    from seq2serve.tests.test_florence2 import IMAGES, MAX_NEW, TASKS, Oracle

    tied = florence2_checkpoints.SHAPES["tied"]  # its 3 decoder heads: 2 instead
    monkeypatch.setitem(florence2_checkpoints.SHAPES, "tied",
                        dict(tied, text=dict(tied["text"], decoder_attention_heads=2)))
    path = str(florence2_checkpoints.write_florence2_checkpoint(shape, tmp_path / "florence",
                                                                eos_boost=2.5))
    oracle = Oracle(path)
    inputs = [oracle.inputs(t, im) for t, im in zip(TASKS, IMAGES)]
    case = {"no_repeat_ngram_size": 3, "min_new_tokens": 2}
    with Seq2SeqEngine(model_path=path, tp_size=2, **POOLS) as engine:
        got = engine.generate(input_ids=[i["input_ids"][0].tolist() for i in inputs],
                              image_data=[[im] for im in IMAGES],
                              sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0,
                                               **case})
        engine.check_integrity()
    assert [g["output_ids"] for g in got] == [oracle.generate(i, **case)[0] for i in inputs]


@pytest.mark.parametrize("tp_size, message", [
    (4, "tp_size 4 does not divide the model's 6 attention heads"),  # the encoder's
    (3, "tp_size 3 does not divide the model's 4 attention heads"),  # the decoder's
])
def test_a_tp_size_that_does_not_divide_bart_heads_is_refused(marian_tp_dir, tp_size, message):
    from seq2serve.models.loader import check_tensor_parallel

    with pytest.raises(ValueError, match=message):
        check_tensor_parallel(ModelConfig.from_path(marian_tp_dir), tp_size)


@pytest.fixture(scope="module")
def mllama_tp():
    import tempfile

    from seq2serve.tests.mllama_oracle import MllamaOracle, random_image

    with tempfile.TemporaryDirectory() as d:
        # vision: 2 heads (1 a rank); text: 4 query heads over 2 key/value heads
        path = str(write_mllama_checkpoint(d, seed=3))
        yield path, MllamaOracle(path), [random_image(1, 40, 90), random_image(2, 100, 30)]


def test_mllama_tp2_matches_hf_with_images(mllama_tp):
    path, oracle, images = mllama_tp
    tok = oracle.processor.tokenizer
    text = tok("Describe the picture", add_special_tokens=False).input_ids
    image, bos = 128256, tok.bos_token_id
    cases = [([image, bos] + text, [images[0]]),
             ([image, image, bos] + text, [images[0], images[1]]),
             ([bos] + text, [])]
    with Seq2SeqEngine(model_path=path, tp_size=2, max_images_per_request=2,
                       max_image_pixels=200_000, **POOLS) as engine:
        outs = engine.generate(input_ids=[c[0] for c in cases],
                               image_data=[c[1] for c in cases], sampling_params=GREEDY)
        for (ids, imgs), out in zip(cases, outs):
            assert out["output_ids"] == oracle.generate_ids(ids, imgs, GREEDY["max_new_tokens"])
        # beam search: the beams' table rows and copied last pages, on every rank
        ids = cases[0][0]
        out = engine.generate(input_ids=ids, image_data=[images[0]],
                              sampling_params={"num_beams": 3, "max_new_tokens": 6,
                                               "ignore_eos": True})
        engine.check_integrity()
    (tokens, score), = oracle.beams(ids, [images[0]], 6, num_beams=3, eos_token_id=[])
    assert out["output_ids"] == tokens
    assert out["meta_info"]["beam_score"] == pytest.approx(score, abs=1e-4)


@pytest.mark.parametrize("tp_size, message", [
    (4, "tp_size 4 does not divide the model's 6 attention heads"),
    (0, "tp_size must be a positive integer"),
])
def test_a_tp_size_that_does_not_fit_is_refused(t5_tp_dir, tp_size, message):
    with pytest.raises(Exception, match=message):
        Seq2SeqEngine(model_path=t5_tp_dir, tp_size=tp_size, **POOLS)


@pytest.mark.parametrize("tp_size, message", [
    (3, "tp_size 3 does not divide the model's 4 attention heads"),
    (4, "tp_size 4 does not divide the model's 2 key/value heads"),
])
def test_a_tp_size_that_does_not_divide_t5gemmas_heads_is_refused(t5gemma_tp_dir, tp_size,
                                                                  message):
    """The check the engine makes before any rank starts (the engine's path: T5's above)."""
    from seq2serve.models.loader import check_tensor_parallel

    with pytest.raises(ValueError, match=message):
        check_tensor_parallel(ModelConfig.from_path(t5gemma_tp_dir), tp_size)


def _rank_processes(scheduler_pid: int) -> list[int]:
    """The scheduler's children started by multiprocessing's spawn (the tp ranks)."""
    out = subprocess.run(["pgrep", "-P", str(scheduler_pid)], capture_output=True, text=True,
                         check=False)
    return [int(p) for p in out.stdout.split() if b"spawn_main" in _cmdline(int(p))]


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def test_a_dead_rank_ends_the_server(t5_tp_dir):
    srv = ServerProcess(t5_tp_dir, "--tp-size", "2", "--max-total-tokens", "2048",
                        "--max-cross-tokens", "2048")
    try:
        scheduler = next(p for p in srv.children() if b"scheduler" in _cmdline(p))
        ranks = _rank_processes(scheduler)
        assert len(ranks) == 1
        assert "tp 2 ranks on cpu,cpu" in srv.output()  # the startup line's layout
        os.kill(ranks[0], signal.SIGKILL)
        start = time.monotonic()
        code = srv.proc.wait(timeout=15)
        assert code != 0 and time.monotonic() - start < 15
        out = srv.output()
        assert "tensor-parallel rank 1" in out and "scheduler process" in out
    finally:
        srv.kill()


def test_the_rendezvous_port_is_configurable(t5_tp_dir):
    """--dist-init-port: the ranks meet there; a port in use is refused by name at start."""
    import socket

    import psutil

    from seq2serve.tests.server_helpers import free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as e:
            ServerProcess(t5_tp_dir, "--tp-size", "2", "--dist-init-port", str(busy))
        assert f"dist_init_port {busy}" in str(e.value) and "in use" in str(e.value)
    port = free_port()
    srv = ServerProcess(t5_tp_dir, "--tp-size", "2", "--dist-init-port", str(port),
                        "--max-total-tokens", "2048", "--max-cross-tokens", "2048")
    try:
        scheduler = next(p for p in srv.children() if b"scheduler" in _cmdline(p))
        listening = {c.laddr.port for c in psutil.Process(scheduler).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN}
        assert port in listening
    finally:
        srv.kill()
