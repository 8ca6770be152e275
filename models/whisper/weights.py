"""Hugging Face Whisper tensor names -> this model's parameters (and shard of a fused weight).
Whisper's k_proj has no bias: the fused biases' k parts are zero (`model.absent_shards`)."""

from __future__ import annotations

from seq2serve.models.bart.weights import LAYER, block_names, layer_targets

_STACK = {"model.encoder.conv1.weight": "conv1.weight", "model.encoder.conv1.bias": "conv1.bias",
          "model.encoder.conv2.weight": "conv2.weight", "model.encoder.conv2.bias": "conv2.bias",
          "model.encoder.embed_positions.weight": "encoder_positions",
          "model.encoder.layer_norm.weight": "encoder_norm.weight",
          "model.encoder.layer_norm.bias": "encoder_norm.bias",
          "model.decoder.embed_tokens.weight": "embed_tokens.weight",
          "model.decoder.embed_positions.weight": "decoder_positions",
          "model.decoder.layer_norm.weight": "decoder_norm.weight",
          "model.decoder.layer_norm.bias": "decoder_norm.bias",
          "proj_out.weight": "lm_head.weight"}


def hf_to_param(name: str, cfg) -> list[tuple[str, int | None]] | None:
    """The (parameter, shard) pairs a checkpoint tensor fills; None if unknown."""
    if name in _STACK:
        return [(_STACK[name], None)]
    m = LAYER.match(name)
    if not m or name.endswith("k_proj.bias"):
        return None  # Whisper's keys have no bias
    return layer_targets(m)


def checkpoint_names(cfg) -> list[str]:
    """Every tensor a complete HF checkpoint of this config has (proj_out optional when tied)."""
    names = list(_STACK)
    for stack, n in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        names += [t for t in block_names(stack, n) if not t.endswith("k_proj.bias")]
    return names
