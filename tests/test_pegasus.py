"""Pegasus (`PegasusForConditionalGeneration`) against HF's `generate` in float32: greedy and
4 beams (tokens and scores) with the checkpoint's forced EOS at the length limit, and the
pooled encoder embedding. Two shapes: pegasus-large's (scaled embeddings, relu, the head tied
to the shared embedding) and one with unscaled embeddings, gelu and an untied head whose
raised EOS logit ends outputs at different lengths."""

from __future__ import annotations

import pytest

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.tools.demo_checkpoint import write_pegasus_checkpoint
from seq2serve.tests.family_parity import check_embeddings, check_generate, cpu_engine
from seq2serve.tests.helpers import SOURCES

MAX_NEW = 10
_TINY = dict(d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
             decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=40)
SHAPES = {  # (config, the cases' settings: a tied head repeats tokens without the ban)
    "large": (dict(_TINY, scale_embedding=True, activation_function="relu",
                   tie_word_embeddings=True, embed_scale=0.5), {"no_repeat_ngram_size": 3}),
    "untied_gelu": (dict(_TINY, scale_embedding=False, activation_function="gelu",
                         tie_word_embeddings=False, eos_bias=6.0), {}),
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def served(request, tmp_path_factory):
    config, settings = SHAPES[request.param]
    path = str(write_pegasus_checkpoint(tmp_path_factory.mktemp(request.param), seed=1,
                                        **config))
    tok = load_tokenizer(path)
    with cpu_engine(path) as engine:
        yield request.param, path, settings, engine, [tok(s).input_ids for s in SOURCES[:4]]


def test_greedy_and_beams_give_hfs_tokens_and_scores(served):
    shape, path, settings, engine, sources = served
    mc = ModelConfig.from_path(path)
    assert mc.architecture == "PegasusForConditionalGeneration"
    assert mc.arch.decoder_start_token_id == 0 and mc.forced_eos_token_ids == (1,)
    cases = [dict(settings), dict(settings, num_beams=4)]
    lengths = check_generate(engine, path, sources, MAX_NEW, 1, cases)
    assert MAX_NEW in lengths  # the forced EOS at the length limit ended some
    if shape == "untied_gelu":
        assert len(lengths) > 2, lengths  # and the raised EOS others, at different lengths


def test_embeddings_are_hfs_pooled_encoder_output(served):
    _, path, _, engine, sources = served
    check_embeddings(engine, path, sources)
