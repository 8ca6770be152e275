"""What the hardware can do: measured copy bandwidth, and the bytes a decode step must move."""

from __future__ import annotations

import torch

from seq2serve.models.family import DecoderStacks
from seq2serve.models.florence2.config import Florence2Config
from seq2serve.models.mllama.config import MllamaConfig
from seq2serve.models.mt5.config import T5Config
from seq2serve.models.t5gemma.config import T5GemmaConfig


def copy_bandwidth(device: str = "cuda", gib: float = 1.0, repeats: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second (the bandwidth ceiling)."""
    n = int(gib * (1 << 30)) // 2
    src = torch.randn(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    del src, dst
    return 2 * n * 2 / times[len(times) // 2]


def decoder_step_bytes(arch, dtype_bytes: int = 2) -> int:
    """Weights a decode step reads once: the decoder stack and the LM head (embedding rows
    and the encoder are not read per step). For T5, cross K/V projections run once per input,
    so only q and o of the cross layers count."""
    if isinstance(arch, Florence2Config):  # its decoder is BART's
        arch = arch.text
    if isinstance(arch, T5GemmaConfig):
        s, vocab = arch.decoder, arch.vocab_size
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        per_layer = s.hidden_size * (2 * q + 2 * kv) + 2 * s.hidden_size * q \
            + 3 * s.hidden_size * s.intermediate_size  # self q/k/v/o, cross q/o, gated MLP
        return (s.num_layers * per_layer + vocab * s.hidden_size) * dtype_bytes
    if isinstance(arch, DecoderStacks):  # the BART family (BART, Marian, M2M100, mBART), Whisper
        d, ff = arch.d_model, arch.decoder_ffn_dim
        per_layer = 4 * d * d + 2 * d * d + 2 * d * ff
        return (arch.decoder_layers * per_layer + arch.vocab_size * d) * dtype_bytes
    if isinstance(arch, T5Config):
        d, inner, ff = arch.d_model, arch.num_heads * arch.d_kv, arch.d_ff
        per_layer = 4 * d * inner + 2 * d * inner + (3 if arch.is_gated else 2) * d * ff
        return (arch.num_decoder_layers * per_layer + arch.vocab_size * d) * dtype_bytes
    t = arch.text if isinstance(arch, MllamaConfig) else arch  # Llama / Mllama's text model
    d, h, kvh, hd, ff = (t.hidden_size, t.num_attention_heads, t.num_key_value_heads,
                         t.head_dim, t.intermediate_size)
    attn = d * (h + 2 * kvh) * hd + h * hd * d
    cross = 2 * d * h * hd  # q and o; k/v projections run once per image
    mlp = 3 * d * ff
    n_cross = arch.num_cross_attn_layers
    n_self = t.num_hidden_layers - n_cross
    return (n_self * (attn + mlp) + n_cross * (cross + mlp) + t.vocab_size * d) * dtype_bytes


def kv_bytes_per_token(arch, dtype_bytes: int = 2) -> tuple[int, int]:
    """(decoder self-attention, cross-attention) K/V bytes per token, all layers."""
    self_b = 2 * arch.num_self_attn_layers * arch.num_kv_heads * arch.head_dim * dtype_bytes
    cross_b = 2 * arch.num_cross_attn_layers * arch.num_kv_heads * arch.head_dim * dtype_bytes
    return self_b, cross_b
