"""Model directories of real shapes (config, tokenizer, image processor: no weights) for
benchmarks, served with load_format="dummy" (random weights). The translation and
summarization shapes, T5Gemma's and Florence-2's (NLLB, OPUS-MT, BART, Pegasus, T5Gemma,
Florence-2) get T5's tokenizer: benchmarks send token ids, and every id it makes is in their
vocabularies (Florence-2's prompts are sent without the image's placeholder tokens, which the
runtime does not need and HF's baseline gets prepended). Whisper's shapes get a Whisper
tokenizer made here with the real vocabulary's 51,866 ids (each special and timestamp token
at its real id: runtime/tools/whisper_tokenizer.py), the real generation_config.json's
prompt and suppression settings, and the feature extractor's preprocessor_config.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from seq2serve.runtime.tools.demo_checkpoint import (
    LLAMA3_TOKENIZER,
    MLLAMA_CHAT_TEMPLATE,
    T5_TOKENIZER,
)
from seq2serve.runtime.tools.whisper_tokenizer import write_whisper_tokenizer

_T5 = dict(architectures=["MT5ForConditionalGeneration"], model_type="mt5",
           feed_forward_proj="gated-gelu", d_kv=64, relative_attention_num_buckets=32,
           relative_attention_max_distance=128, layer_norm_epsilon=1e-6,
           tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)

# openai/whisper-large-v3's config.json (its ids: end of text 50257, start of transcript 50258,
# 100 languages from 50259, translate 50359, transcribe 50360, no timestamps 50364, then the
# 1,501 timestamps to 51865), less its num_hidden_layers: HF reads that key as encoder_layers,
# so a copy with fewer encoder layers would get 32 back
_WHISPER_LARGE_V3 = {
    "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
    "vocab_size": 51866, "num_mel_bins": 128, "d_model": 1280, "encoder_layers": 32,
    "decoder_layers": 32, "encoder_attention_heads": 20,
    "decoder_attention_heads": 20, "encoder_ffn_dim": 5120, "decoder_ffn_dim": 5120,
    "activation_function": "gelu", "max_source_positions": 1500, "max_target_positions": 448,
    "scale_embedding": False, "tie_word_embeddings": True, "use_cache": True,
    "pad_token_id": 50256, "bos_token_id": 50257, "eos_token_id": 50257,
    "decoder_start_token_id": 50258, "begin_suppress_tokens": [220, 50257]}
# its generation_config.json, less the timing-only alignment heads (lang_to_id added by
# write_shape: every language token at its id)
WHISPER_GENERATION = {
    "decoder_start_token_id": 50258, "bos_token_id": 50257, "eos_token_id": 50257,
    "pad_token_id": 50257, "is_multilingual": True, "no_timestamps_token_id": 50364,
    "prev_sot_token_id": 50362, "max_initial_timestamp_index": 50, "max_length": 448,
    "return_timestamps": False, "begin_suppress_tokens": [220, 50257],
    "task_to_id": {"translate": 50359, "transcribe": 50360},
    "suppress_tokens": [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63,
                        90, 91, 92, 93, 359, 503, 522, 542, 873, 893, 902, 918, 922, 931, 1350,
                        1853, 1982, 2460, 2627, 3246, 3253, 3268, 3536, 3846, 3961, 4183, 4667,
                        6585, 6647, 7273, 9061, 9383, 10428, 10929, 11938, 12033, 12331, 12562,
                        13793, 14157, 14635, 15265, 15618, 16553, 16604, 18362, 18956, 20075,
                        21675, 22520, 26130, 26161, 26435, 28279, 29464, 31650, 32302, 32470,
                        36865, 42863, 47425, 49870, 50254, 50258, 50359, 50360, 50361, 50362,
                        50363]}
WHISPER_TEXT_TOKENS = 50257  # the multilingual vocabulary's ordinary tokens (ids below EOT)

SHAPES: dict[str, dict] = {
    # google/t5-small (the CPU comparisons with CTranslate2)
    "t5-small": {**_T5, "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
                 "feed_forward_proj": "relu", "tie_word_embeddings": True, "vocab_size": 32128,
                 "d_model": 512, "d_ff": 2048, "num_heads": 8, "num_layers": 6,
                 "num_decoder_layers": 6},
    "mt5-base": {**_T5, "vocab_size": 250112, "d_model": 768, "d_ff": 2048, "num_heads": 12,
                 "num_layers": 12, "num_decoder_layers": 12},
    "mt5-large": {**_T5, "vocab_size": 250112, "d_model": 1024, "d_ff": 2816, "num_heads": 16,
                  "num_layers": 24, "num_decoder_layers": 24},
    # google/umt5-base: a position bias in every self-attention layer
    "umt5-base": {**_T5, "architectures": ["UMT5ForConditionalGeneration"], "model_type": "umt5",
                  "vocab_size": 256384, "d_model": 768, "d_ff": 2048, "num_heads": 12,
                  "num_layers": 12, "num_decoder_layers": 12},
    "flan-t5-xl": {**_T5, "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
                   "vocab_size": 32128, "d_model": 2048, "d_ff": 5120, "num_heads": 32,
                   "num_layers": 24, "num_decoder_layers": 24},
    # facebook/nllb-200-distilled-600M (M2M100 architecture)
    "nllb-200-distilled-600m": {
        "architectures": ["M2M100ForConditionalGeneration"], "model_type": "m2m_100",
        "vocab_size": 256206, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
        "encoder_attention_heads": 16, "decoder_attention_heads": 16,
        "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "activation_function": "relu",
        "max_position_embeddings": 1024, "scale_embedding": True, "tie_word_embeddings": True,
        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2},
    # Helsinki-NLP/opus-mt-en-de (Marian)
    "opus-mt": {
        "architectures": ["MarianMTModel"], "model_type": "marian", "vocab_size": 58101,
        "decoder_vocab_size": 58101, "d_model": 512, "encoder_layers": 6, "decoder_layers": 6,
        "encoder_attention_heads": 8, "decoder_attention_heads": 8, "encoder_ffn_dim": 2048,
        "decoder_ffn_dim": 2048, "activation_function": "swish", "max_position_embeddings": 512,
        "scale_embedding": True, "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True, "pad_token_id": 58100, "eos_token_id": 0,
        "decoder_start_token_id": 58100, "forced_eos_token_id": 0},
    # facebook/bart-large-cnn (its config.json; the T5 tokenizer's ids fit its vocabulary)
    "bart-large-cnn": {
        "architectures": ["BartForConditionalGeneration"], "model_type": "bart",
        "vocab_size": 50264, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
        "encoder_attention_heads": 16, "decoder_attention_heads": 16,
        "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "activation_function": "gelu",
        "max_position_embeddings": 1024, "scale_embedding": False, "tie_word_embeddings": True,
        "normalize_before": False, "add_final_layer_norm": False, "pad_token_id": 1,
        "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2,
        "forced_bos_token_id": 0, "forced_eos_token_id": 2},
    # google/pegasus-large (its config.json; the T5 tokenizer's ids fit its vocabulary)
    "pegasus-large": {
        "architectures": ["PegasusForConditionalGeneration"], "model_type": "pegasus",
        "vocab_size": 96103, "d_model": 1024, "encoder_layers": 16, "decoder_layers": 16,
        "encoder_attention_heads": 16, "decoder_attention_heads": 16,
        "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "activation_function": "relu",
        "max_position_embeddings": 1024, "scale_embedding": True, "tie_word_embeddings": True,
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
        "forced_eos_token_id": 1},
    # google/t5gemma-2b-2b-prefixlm: two Gemma 2 2B stacks (head size 256, GQA, every other
    # layer a 4,096-token window, soft-capped scores and logits)
    "t5gemma-2b-2b": {
        "architectures": ["T5GemmaForConditionalGeneration"], "model_type": "t5gemma",
        "vocab_size": 256000, "tie_word_embeddings": True, "pad_token_id": 0,
        "eos_token_id": 1, "bos_token_id": 2,
        **{stack: {"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
                   "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                   "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                   "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                   "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
                   "max_position_embeddings": 8192,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
           for stack in ("encoder", "decoder")}},
    # microsoft/Florence-2-large as HF's Florence2ForConditionalGeneration reads it: a DaViT
    # tower (768x768 images: 576 grid tokens and one pooled) feeding BART-large; its 51,289
    # tokens and the `<image>` placeholder HF's processor adds (HF embeds it too)
    "florence-2-large": {
        "architectures": ["Florence2ForConditionalGeneration"], "model_type": "florence2",
        "image_token_id": 51289, "tie_word_embeddings": True,
        "text_config": {"model_type": "bart", "vocab_size": 51290, "d_model": 1024,
                        "encoder_layers": 12, "decoder_layers": 12,
                        "encoder_attention_heads": 16, "decoder_attention_heads": 16,
                        "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096,
                        "activation_function": "gelu", "max_position_embeddings": 1024,
                        "scale_embedding": False, "pad_token_id": 1, "bos_token_id": 0,
                        "eos_token_id": 2, "decoder_start_token_id": 2,
                        "forced_eos_token_id": 2},
        "vision_config": {"model_type": "florence_vision", "depths": [1, 1, 9, 1],
                          "patch_size": [7, 3, 3, 3], "patch_stride": [4, 2, 2, 2],
                          "patch_padding": [3, 1, 1, 1],
                          "patch_prenorm": [False, True, True, True],
                          "embed_dim": [256, 512, 1024, 2048], "num_heads": [8, 16, 32, 64],
                          "num_groups": [8, 16, 32, 64], "window_size": 12,
                          "projection_dim": 1024, "max_position_embeddings": 50,
                          "max_temporal_embeddings": 100}},
    "whisper-large-v3": _WHISPER_LARGE_V3,
    # openai/whisper-large-v3-turbo: the same encoder, a 4-layer decoder
    "whisper-large-v3-turbo": {**_WHISPER_LARGE_V3, "decoder_layers": 4},
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "tie_word_embeddings": True,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "bos_token_id": 128000, "eos_token_id": 128009},
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "tie_word_embeddings": False,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "bos_token_id": 128000, "eos_token_id": 128009},
    "mllama-11b": {
        "architectures": ["MllamaForConditionalGeneration"], "model_type": "mllama",
        "image_token_index": 128256,
        "text_config": {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                        "num_hidden_layers": 40, "num_attention_heads": 32,
                        "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
                        "max_position_embeddings": 131072,
                        "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38],
                        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
                                            "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192},
                        "eos_token_id": 128009, "bos_token_id": 128000},
        "vision_config": {"hidden_size": 1280, "intermediate_size": 5120,
                          "num_hidden_layers": 32, "num_global_layers": 8,
                          "attention_heads": 16, "image_size": 560, "patch_size": 14,
                          "max_num_tiles": 4, "vision_output_dim": 7680,
                          "intermediate_layers_indices": [3, 7, 15, 23, 30]},
    },
}


def write_shape(name: str, out: str | Path) -> Path:
    """A model directory of the named shape, to serve with load_format="dummy"."""
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; choose from {sorted(SHAPES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(SHAPES[name], indent=2))
    if name.startswith("mllama"):
        from transformers import MllamaImageProcessor, PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(str(LLAMA3_TOKENIZER))
        tok.add_tokens(["<|image|>"], special_tokens=True)
        tok.chat_template = MLLAMA_CHAT_TEMPLATE
        tok.save_pretrained(str(out))
        MllamaImageProcessor(size={"height": 560, "width": 560},
                                max_image_tiles=4).save_pretrained(str(out))
    elif name.startswith("florence"):
        from transformers import AutoTokenizer, CLIPImageProcessor

        # the T5 tokenizer with a BOS token: Florence-2's prompt is BOS, task, EOS
        tok = AutoTokenizer.from_pretrained(str(T5_TOKENIZER))
        tok.add_special_tokens({"bos_token": "<s>"})
        tok.save_pretrained(str(out))
        # Florence-2's processor: 768x768, ImageNet's mean and deviation, 577 image tokens
        CLIPImageProcessor(size={"height": 768, "width": 768}, do_center_crop=False,
                           crop_size={"height": 768, "width": 768}, resample=3,
                           image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
                           image_seq_length=577).save_pretrained(str(out))
    elif name.startswith("whisper"):
        _write_whisper(out, SHAPES[name])
    elif name.startswith("llama"):
        for f in LLAMA3_TOKENIZER.iterdir():
            shutil.copy(f, out / f.name)
    else:
        for f in T5_TOKENIZER.iterdir():
            shutil.copy(f, out / f.name)
    return out


def _write_whisper(out: Path, cfg: dict) -> None:
    """The tokenizer (every special token at the real model's id), generation_config.json and
    the feature extractor's settings (128 mel bins for large-v3)."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    specials = write_whisper_tokenizer(out, tuple(LANGUAGES), timestamps=True,
                                       text_tokens=WHISPER_TEXT_TOKENS)
    gen = {**WHISPER_GENERATION,
           "lang_to_id": {f"<|{c}|>": specials[f"<|{c}|>"] for c in LANGUAGES}}
    for key in ("decoder_start_token_id", "no_timestamps_token_id", "prev_sot_token_id"):
        assert gen[key] == specials[{"decoder_start_token_id": "<|startoftranscript|>",
                                     "no_timestamps_token_id": "<|notimestamps|>",
                                     "prev_sot_token_id": "<|startofprev|>"}[key]]
    assert cfg["vocab_size"] == WHISPER_TEXT_TOKENS + len(specials) + 1501
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    WhisperFeatureExtractor(feature_size=cfg["num_mel_bins"]).save_pretrained(str(out))
