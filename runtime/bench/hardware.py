"""What the hardware can do: measured copy bandwidth and bf16 matmul peak; and what a model
asks of it: the bytes a decode step must move, the FLOPs of Whisper's encoder stage."""

from __future__ import annotations

import torch

from seq2serve.models.family import DecoderStacks
from seq2serve.models.florence2.config import Florence2Config
from seq2serve.models.mllama.config import MllamaConfig
from seq2serve.models.mt5.config import T5Config
from seq2serve.models.t5gemma.config import T5GemmaConfig
from seq2serve.models.whisper.config import N_FRAMES, WhisperConfig


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


def matmul_peak_tflops(sizes: tuple[int, ...] = (4096, 8192), device: str = "cuda") -> float:
    """The best bf16 TFLOP/s of square matmuls of `sizes` (cuBLAS through torch, timed by
    Triton's do_bench): the ceiling an encoder's share is measured against."""
    from triton.testing import do_bench

    best = 0.0
    for n in sizes:
        a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
        ms = do_bench(lambda: a @ b, warmup=50, rep=300)  # noqa: B023
        best = max(best, 2 * n**3 / ms / 1e9)
    torch.cuda.empty_cache()  # (an engine started next plans its pools from what is free)
    return best


def whisper_encoder_flops(arch: WhisperConfig) -> dict[str, float]:
    """The matmul FLOPs of Whisper's encoder stage for one 30 s window (2 FLOPs a
    multiply-add), with d = d_model, f = encoder_ffn_dim, m = num_mel_bins, n = 1,500
    positions (3,000 log-mel frames through the stride-2 convolution), L = encoder layers:
      conv front end  2 * 3000 * 3 * m * d  +  2 * 1500 * 3 * d * d   (kernel 3, as matmuls)
      each layer      2 * n * (4 * d * d + 2 * d * f)   (q, k, v, out; fc1, fc2)
                      + 4 * n * n * d                   (scores Q K^T and P V, all heads)
      cross K/V       2 * n * 2 * d * d  per decoder layer (the stage projects the encoder
                      output into each decoder layer's cross K/V once per window)
    Not counted (not matmuls, or negligible): the STFT and the 201 x m mel filter matmul of
    the log-mel, the norms, GELUs, softmax and position adds."""
    d, f, m = arch.d_model, arch.encoder_ffn_dim, arch.num_mel_bins
    n = arch.max_source_positions
    conv = 2 * N_FRAMES * 3 * m * d + 2 * n * 3 * d * d
    layer = 2 * n * (4 * d * d + 2 * d * f) + 4 * n * n * d
    cross_kv = arch.decoder_layers * 2 * n * 2 * d * d
    encoder = conv + arch.encoder_layers * layer
    return {"conv_front_end": conv, "encoder_layers": arch.encoder_layers * layer,
            "encoder": encoder, "cross_kv": cross_kv, "stage": encoder + cross_kv}


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
