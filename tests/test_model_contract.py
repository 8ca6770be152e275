"""Every registered family meets the declared contract (models/family.py), and the runtime
reads model members directly: no getattr/hasattr probe of a model, its class or its config."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from seq2serve.models import registry
from seq2serve.models.family import FamilyConfig, ModelFamily, contract_gaps
from seq2serve.models.loader import meta_device
from seq2serve.runtime.attention.forward_batch import optional_fields
from seq2serve.runtime.tools.demo_checkpoint import DEMO_MLLAMA_TEXT, DEMO_MLLAMA_VISION

ROOT = Path(__file__).resolve().parent.parent
_STACKS = dict(d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
               decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=40,
               vocab_size=96, max_position_embeddings=64)
_GEMMA = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8)
# tiny HF configs per model_type (HF's own config classes fill the rest)
_TINY = {
    "t5": dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2, num_decoder_layers=3,
               vocab_size=96),
    "mt5": dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2, vocab_size=96,
                feed_forward_proj="gated-gelu"),
    "umt5": dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2, vocab_size=96),
    "llama": dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2),
    "mllama": dict(vision_config=DEMO_MLLAMA_VISION, text_config=DEMO_MLLAMA_TEXT),
    "marian": dict(_STACKS, pad_token_id=5, decoder_start_token_id=5),
    "m2m_100": dict(_STACKS),
    "mbart": dict(_STACKS),
    "bart": dict(_STACKS, forced_bos_token_id=0),
    "pegasus": dict(_STACKS),
    "whisper": dict(_STACKS, max_source_positions=1500, max_target_positions=32),
    "t5gemma": dict(vocab_size=96, encoder=_GEMMA, decoder=dict(_GEMMA, num_hidden_layers=3)),
    "florence2": dict(text_config=dict(_STACKS, model_type="bart"), image_token_id=96,
                      vision_config=dict(depths=[1, 2], patch_size=[7, 3], patch_stride=[4, 2],
                                         patch_padding=[3, 1], patch_prenorm=[False, True],
                                         embed_dim=[16, 24], num_heads=[2, 3],
                                         num_groups=[2, 3], window_size=3, projection_dim=32)),
}


def _tiny_config(architecture: str) -> dict:
    from transformers import AutoConfig

    model_type = next(t for t, a in registry._MODEL_TYPES.items() if a == architecture)
    hf = AutoConfig.for_model(model_type, **_TINY[model_type]).to_dict()
    return {**hf, "architectures": [architecture]}


def _is_ids(value) -> bool:
    return isinstance(value, tuple) and all(isinstance(i, int) for i in value)


@pytest.mark.parametrize("architecture", registry.supported_architectures())
def test_every_registered_family_meets_the_contract(architecture):
    cls = registry.model_class(architecture)
    cfg = cls.config_class.from_hf(_tiny_config(architecture))
    assert contract_gaps(cls, cfg) == []
    # the pool shape: what the model runner sizes its pools by
    assert isinstance(cfg.is_encoder_decoder, bool)
    for name in ("vocab_size", "num_self_attn_layers", "num_kv_heads", "head_dim"):
        assert isinstance(getattr(cfg, name), int) and getattr(cfg, name) > 0, name
    assert isinstance(cfg.num_cross_attn_layers, int) and cfg.num_cross_attn_layers >= 0
    assert cfg.max_length is None or cfg.max_length > 0
    assert cfg.input_vocab_size >= cfg.vocab_size
    assert _is_ids(cfg.eos_token_ids) and cfg.eos_token_ids
    for name in ("forced_eos_token_ids", "suppressed_token_ids", "suppress_tokens",
                 "begin_suppress_tokens"):
        assert _is_ids(getattr(cfg, name)), name
    for name in ("decoder_start_token_id", "forced_bos_token_id"):
        assert getattr(cfg, name) is None or isinstance(getattr(cfg, name), int), name
    assert cfg.is_encoder_decoder == (cfg.decoder_start_token_id is not None)
    assert isinstance(cfg.frontend_info(), dict)
    # the model: built as the loader builds it, its optional members of the declared types
    with meta_device():
        model = cls(cfg)
    assert isinstance(model, ModelFamily)
    assert set(cls.optional_inputs) <= {f.name for f in optional_fields()}
    assert isinstance(cls.tensor_parallel, bool)
    for suffix in cls.keep_in_model_dtype:
        assert any(n.endswith(suffix) for n, _ in model.named_modules()), suffix
    if cfg.num_cross_attn_layers:  # an encoder stage of its own
        assert type(model).encode is not ModelFamily.encode
        assert type(model).store_cross_kv is not ModelFamily.store_cross_kv
    else:
        assert cfg.max_encoder_length == cfg.max_length and not cfg.is_encoder_decoder
    for name, shard in model.absent_shards():
        assert name in dict(model.named_parameters()) and isinstance(shard, int)


def test_the_contract_check_names_what_a_family_lacks():
    class NoLogits(ModelFamily):
        config_class = FamilyConfig

        def forward(self, input_ids, positions, fb):
            return input_ids

        def weight_map(self, name):
            return None

    class HalfConfig(FamilyConfig):
        vocab_size, eos_token_ids, is_encoder_decoder = 8, (1,), False

    gaps = contract_gaps(NoLogits, HalfConfig())
    assert "abstract compute_logits" in gaps
    assert {f"config member {n}" for n in ("num_kv_heads", "head_dim", "max_length")} <= set(gaps)
    assert contract_gaps(torch.nn.Linear, HalfConfig()) == [f"{torch.nn.Linear!r} is not a "
                                                           f"ModelFamily"]


# getattr/hasattr on a model, its class or its config (`arch`, `self.arch`, `mc.arch`, ...)
_PROBE = re.compile(r"\b(?:getattr|hasattr)\(\s*(?:self\.)?(?:model|model_cls|cls|arch"
                    r"|[\w.]+\.arch|[\w.]+\.model)\s*,")


def test_the_probe_pattern_finds_the_probes_it_replaced():
    for line in ('getattr(self.model, "optional_inputs", ())',
                 'hasattr(arch, "frontend_info")', 'getattr(cls, "tensor_parallel", False)',
                 'getattr(self.arch, "forced_bos_token_id", None)',
                 'getattr(mc.arch, "image_token_id", None)',
                 'sorted(keys, key=getattr(model, "load_priority", lambda _: 0))'):
        assert _PROBE.search(line), line
    for line in ('getattr(module, "weight", None)', 'getattr(self, f.name)',
                 'getattr(model.get_submodule(name), "shard_sizes", None)'):
        assert not _PROBE.search(line), line


def test_no_model_member_is_probed_in_the_runtime():
    files = [p for d in ("runtime", "models", "encoders", "cross_attention", "lang")
             for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 50
    probes = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
              for i, line in enumerate(p.read_text().splitlines(), 1) if _PROBE.search(line)]
    assert probes == []


def test_compile_encoder_on_a_family_without_one_warns_and_serves(t5_dir, caplog):
    """`--compile-encoder` on a family with nothing to compile (T5) is named in a warning,
    not silently ignored, and the model serves as without it."""
    from seq2serve.runtime.config.tokenizer import load_tokenizer
    from seq2serve.tests.helpers import (
        SOURCES,
        hf_greedy,
        make_scheduler,
        request,
        run_to_completion,
    )

    with caplog.at_level("WARNING", logger="seq2serve.runtime.executor.model_runner"):
        sched = make_scheduler(t5_dir, compile_encoder=True)
    assert "--compile-encoder: T5ForConditionalGeneration has no encoder part" in caplog.text
    ids = load_tokenizer(t5_dir).encode(SOURCES[0])
    sched.add_request(request("a", ids, max_new_tokens=6))
    assert run_to_completion(sched)["a"] == hf_greedy(t5_dir, ids, 6)
