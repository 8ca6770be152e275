"""T5Gemma (`T5GemmaForConditionalGeneration`) against HF's `generate` in float32: greedy and
4 beams (tokens and scores) through the engine's CPU backend, the pooled encoder embedding, and
greedy and beam tokens through the torch_native and Triton backends (the kernels
interpreted). Sources and outputs longer than the sliding window, in the encoder (both sides
of a query) and the decoder (behind it). Two shapes: GQA with a tied head, logits soft-capped
hard enough to bend the scores (caps of 2 and 5) and alternating sliding layers; and MHA with
an encoder wider than the decoder, an untied head whose scaled EOS row ends outputs at
different lengths, a full first layer, no soft-caps and another activation."""

from __future__ import annotations

import pytest

from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.tools.demo_checkpoint import write_t5gemma_checkpoint
from seq2serve.tests.family_parity import check_embeddings, check_generate, cpu_engine
from seq2serve.tests.helpers import SOURCES

MAX_NEW = 10
_CAPPED = dict(sliding_window=3, attn_logit_softcapping=2.0, final_logit_softcapping=5.0,
               hidden_size=32, intermediate_size=48, head_dim=8, num_attention_heads=4,
               num_key_value_heads=2, query_pre_attn_scalar=8)
_PLAIN = dict(sliding_window=4, attn_logit_softcapping=None, final_logit_softcapping=None,
              num_attention_heads=2, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=12,
              hidden_activation="silu")
SHAPES = {  # (checkpoint, the cases' settings: a tied head repeats tokens without the ban)
    "gqa_capped": (dict(encoder=dict(_CAPPED, num_hidden_layers=3),
                        decoder=dict(_CAPPED, num_hidden_layers=2)),
                   {"no_repeat_ngram_size": 3}),
    "mha_untied": (dict(tie_word_embeddings=False, eos_factor=3.0,
                        encoder=dict(_PLAIN, hidden_size=40, intermediate_size=56,
                                     num_hidden_layers=2,
                                     layer_types=["full_attention", "sliding_attention"]),
                        decoder=dict(_PLAIN, hidden_size=32, intermediate_size=48,
                                     num_hidden_layers=3,
                                     layer_types=["full_attention", "sliding_attention",
                                                  "sliding_attention"])),
                   {}),
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def served(request, tmp_path_factory):
    config, settings = SHAPES[request.param]
    path = str(write_t5gemma_checkpoint(tmp_path_factory.mktemp(request.param), seed=1,
                                         **config))
    tok = load_tokenizer(path)
    sources = [tok(s).input_ids for s in SOURCES[:4]]
    with cpu_engine(path) as engine:
        yield request.param, path, settings, engine, sources


def test_greedy_and_beams_give_hfs_tokens_and_scores(served):
    shape, path, settings, engine, sources = served
    mc = ModelConfig.from_path(path)
    assert mc.architecture == "T5GemmaForConditionalGeneration"
    window = mc.arch.decoder.sliding_window
    assert max(len(s) for s in sources) > 2 * window + 1 and MAX_NEW > window
    lengths = check_generate(engine, path, sources, MAX_NEW, 1,
                             [dict(settings), dict(settings, num_beams=4)])
    if shape == "mha_untied":
        assert len(lengths) > 2, lengths  # the raised EOS ends outputs at different lengths


def test_embeddings_are_hfs_pooled_encoder_output(served):
    _, path, _, engine, sources = served
    check_embeddings(engine, path, sources)


@pytest.mark.parametrize("backend", ["torch_native", "triton"])
def test_other_backends_give_hfs_tokens(served, backend):
    """The reference backend and the Triton kernels (windows in the encoder, extend and decode
    kernels; soft-caps in those and the cross-attention kernels, beam groups' included)."""
    shape, path, settings, _, sources = served
    if shape == "mha_untied":
        pytest.skip("one shape is enough here (CI's time): the soft-capped one")
    with cpu_engine(path, attention_backend=backend) as engine:
        check_generate(engine, path, sources[:2], MAX_NEW, 1,
                       [dict(settings), dict(settings, num_beams=4)])


def test_config_errors_name_the_field(tmp_path):
    from seq2serve.models.t5gemma.config import T5GemmaConfig

    good = dict(vocab_size=96, bos_token_id=2, encoder=dict(_CAPPED, num_hidden_layers=2),
                decoder=dict(_CAPPED, num_hidden_layers=2))
    with pytest.raises(ValueError, match="encoder"):
        T5GemmaConfig.from_hf({k: v for k, v in good.items() if k != "encoder"})
    with pytest.raises(ValueError, match="layer_types"):
        T5GemmaConfig.from_hf(dict(good, decoder=dict(good["decoder"],
                                                      layer_types=["full_attention"])))
    with pytest.raises(ValueError, match="rope type"):
        T5GemmaConfig.from_hf(dict(good, encoder=dict(
            good["encoder"], rope_parameters={"rope_type": "linear", "factor": 2.0})))
    cfg = T5GemmaConfig.from_hf(good)
    assert cfg.encoder.sliding_layers == (True, False)  # HF's default: sliding, then full
    assert cfg.decoder_start_token_id == 2 and cfg.num_kv_heads == 2 and cfg.head_dim == 8
