"""Mllama's vision tower, as HF `MllamaVisionModel` defines it.

Each image is split into up to `max_num_tiles` tiles; each tile into patches plus a class
token. Tile and position embeddings are gated by the image's aspect ratio. A local transformer
runs over all tiles of an image, then a gated global transformer; the output concatenates the
final states with chosen intermediate layers'. As in the reference, padded tiles and padded
patches are computed too and real tokens may attend to them (only padding->padding is
blocked); the caller keeps only the real tiles' outputs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from seq2serve.models import parallel_state
from seq2serve.models.linear import ColumnParallelLinear, RowParallelLinear
from seq2serve.models.mllama.config import MllamaVisionConfig
from seq2serve.runtime.kernels.activations import torch_activation

# the order the vision tower's attention tries PyTorch's kernels in (the first that takes the
# call runs it). FlashAttention first by default; SEQ2SERVE_VISION_CUDNN=1 puts cuDNN's kernel
# first: 1.22x faster on an H100 (benchmarks/bench_vision.py: 52.6 % vs 43.2 % of the bf16
# matmul peak) but it builds a plan for every new shape, ~3 s each, so it then runs one call
# per image (an image's shape takes one of max_num_tiles values: at most that many stalls).
# The masked padding call and CPUs fall through to the others.
VISION_CUDNN = os.environ.get("SEQ2SERVE_VISION_CUDNN", "0") == "1"
VISION_SDPA_BACKENDS = ([SDPBackend.CUDNN_ATTENTION] if VISION_CUDNN else []) + [
    SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class AspectRatioEmbedding(nn.Module):
    """A per-tile vector chosen by the image's aspect ratio id, scaled by tanh(gate)."""

    def __init__(self, cfg: MllamaVisionConfig) -> None:
        super().__init__()
        self.max_tiles, self.hidden = cfg.max_num_tiles, cfg.hidden_size
        self.embedding = nn.Embedding(cfg.max_aspect_ratio_id + 1,
                                      cfg.max_num_tiles * cfg.hidden_size)
        self.gate = nn.Parameter(torch.empty(1), requires_grad=False)

    def forward(self, x: torch.Tensor, aspect_ratio_ids: torch.Tensor) -> torch.Tensor:
        e = self.embedding(aspect_ratio_ids).reshape(-1, self.max_tiles, 1, self.hidden)
        return x + e * self.gate.tanh()


class GatedPositionEmbedding(nn.Module):
    """Patch positions (weighted by 1 - tanh(gate)) plus tile positions (by tanh(gate))."""

    def __init__(self, cfg: MllamaVisionConfig) -> None:
        super().__init__()
        self.max_tiles, self.hidden, self.num_patches = (cfg.max_num_tiles, cfg.hidden_size,
                                                         cfg.num_patches)
        self.gate = nn.Parameter(torch.empty(1), requires_grad=False)
        self.embedding = nn.Parameter(torch.empty(cfg.num_patches, cfg.hidden_size),
                                      requires_grad=False)
        self.tile_embedding = nn.Embedding(cfg.max_aspect_ratio_id + 1,
                                           cfg.max_num_tiles * cfg.num_patches * cfg.hidden_size)

    def forward(self, x: torch.Tensor, aspect_ratio_ids: torch.Tensor) -> torch.Tensor:
        gate = self.gate.tanh()
        x = x + (1 - gate) * self.embedding.view(1, 1, self.num_patches, self.hidden)
        tiles = self.tile_embedding(aspect_ratio_ids).reshape(
            x.shape[0], self.max_tiles, self.num_patches, self.hidden)
        return x + gate * tiles


class VisionAttention(nn.Module):
    def __init__(self, cfg: MllamaVisionConfig) -> None:
        super().__init__()
        tp = parallel_state.tensor_parallel()
        self.heads = tp.shard(cfg.attention_heads, "vision attention heads")  # this rank's
        self.head_dim = cfg.hidden_size // cfg.attention_heads
        inner = cfg.attention_heads * self.head_dim
        self.qkv_proj = ColumnParallelLinear(cfg.hidden_size, [inner, inner, inner],
                                             what="vision heads' q/k/v")
        self.o_proj = RowParallelLinear(inner, cfg.hidden_size, what="vision heads' outputs")

    def forward(self, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        """x [images, tokens, hidden], every image with the same `layout`. Real queries see
        every key, padding included (as HF); padding queries see the real keys only."""
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.heads, self.head_dim).transpose(1, 2)
                   for t in self.qkv_proj(x).chunk(3, dim=-1))
        with sdpa_kernel(VISION_SDPA_BACKENDS, set_priority=True):
            if VISION_CUDNN:  # unmasked, for the fast kernels; per image: one plan a shape
                out = torch.empty_like(q)
                for i in range(b):
                    out[i:i + 1] = F.scaled_dot_product_attention(q[i:i + 1], k[i:i + 1],
                                                                  v[i:i + 1])
            else:
                out = F.scaled_dot_product_attention(q, k, v)  # unmasked: the fast kernels
            if layout.pad.numel():  # the few padding queries again, without the padding keys
                out[:, :, layout.pad] = F.scaled_dot_product_attention(
                    q[:, :, layout.pad], k, v, attn_mask=layout.real_keys)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class VisionLayer(nn.Module):
    def __init__(self, cfg: MllamaVisionConfig, gated: bool) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn = VisionAttention(cfg)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.fc1 = ColumnParallelLinear(cfg.hidden_size, cfg.intermediate_size, bias=True,
                                        what="vision feed-forward channels")
        self.fc2 = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, bias=True,
                                     what="vision feed-forward channels")
        self.act = torch_activation(cfg.hidden_act)
        self.gated = gated
        if gated:
            self.gate_attn = nn.Parameter(torch.empty(1), requires_grad=False)
            self.gate_ffn = nn.Parameter(torch.empty(1), requires_grad=False)

    def forward(self, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), layout)
        x = x + (self.gate_attn.tanh() * h if self.gated else h)
        h = self.fc2(self.act(self.fc1(self.post_attention_layernorm(x))))
        return x + (self.gate_ffn.tanh() * h if self.gated else h)


class MllamaVisionModel(nn.Module):
    def __init__(self, cfg: MllamaVisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embedding = nn.Conv2d(cfg.num_channels, cfg.hidden_size, cfg.patch_size,
                                         stride=cfg.patch_size, bias=False)
        self.class_embedding = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)
        self.pre_tile_positional_embedding = AspectRatioEmbedding(cfg)
        self.post_tile_positional_embedding = AspectRatioEmbedding(cfg)
        self.gated_positional_embedding = GatedPositionEmbedding(cfg)
        self.layernorm_pre = nn.LayerNorm(cfg.hidden_size)
        self.layernorm_post = nn.LayerNorm(cfg.hidden_size)
        self.transformer = nn.ModuleList(VisionLayer(cfg, False)
                                         for _ in range(cfg.num_hidden_layers))
        self.global_transformer = nn.ModuleList(VisionLayer(cfg, True)
                                                for _ in range(cfg.num_global_layers))

    def forward(self, pixel_values: torch.Tensor, aspect_ratio_ids: torch.Tensor,
                num_tiles: list[int]) -> list[torch.Tensor]:
        """pixel_values [images, max_tiles, C, H, W] -> for each image, the states of its real
        tiles: [num_tiles * num_patches, vision_output_dim]."""
        cfg = self.cfg
        b, tiles = pixel_values.shape[:2]
        x = self.patch_embedding(pixel_values.flatten(0, 1).to(self.patch_embedding.weight.dtype))
        x = x.flatten(2).transpose(1, 2)  # [b * tiles, patches, dim]
        dim = x.shape[-1]
        x = self.pre_tile_positional_embedding(x.reshape(b, tiles, -1, dim), aspect_ratio_ids)
        cls = self.class_embedding.expand(b * tiles, 1, dim)
        x = torch.cat([cls, x.reshape(b * tiles, -1, dim)], dim=1)
        patches = x.shape[1]
        x = self.gated_positional_embedding(x.reshape(b, tiles, patches, dim), aspect_ratio_ids)
        x = self.layernorm_pre(x)
        padded = patches + (8 - patches % 8) % 8  # as HF: patches padded to a multiple of 8
        x = F.pad(x, (0, 0, 0, padded - patches))

        out = torch.empty(b, tiles, patches, cfg.vision_output_dim, dtype=x.dtype,
                          device=x.device)
        # images with the same number of real tiles share one token layout: run them together
        for n in sorted(set(num_tiles)):
            sel = torch.tensor([i for i, t in enumerate(num_tiles) if t == n], device=x.device)
            layout = TokenLayout.of(n, tiles, patches, padded, x.device)
            out[sel] = self._encode(x[sel], aspect_ratio_ids[sel], layout, patches, padded)
        return [out[i, :t].reshape(t * patches, -1) for i, t in enumerate(num_tiles)]

    def _encode(self, x, aspect_ratio_ids, layout, patches, padded) -> torch.Tensor:
        b, tiles, _, dim = x.shape
        h = x.reshape(b, tiles * padded, dim)
        keep: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.transformer):
            h = layer(h, layout)
            if i in self.cfg.intermediate_layers_indices:
                keep[i] = h
        h = self.layernorm_post(h)
        h = self.post_tile_positional_embedding(h.reshape(b, tiles, padded, dim),
                                                aspect_ratio_ids).reshape(b, tiles * padded, dim)
        for layer in self.global_transformer:
            h = layer(h, layout)
        inter = [keep[i] for i in self.cfg.intermediate_layers_indices]
        # HF stacks the intermediate states on a new last axis, then flattens (dim-major)
        stacked = torch.stack(inter, dim=-1).reshape(b, tiles * padded, -1)
        h = torch.cat([h, stacked], dim=-1).reshape(b, tiles, padded, -1)
        return h[:, :, :patches]


@dataclass(frozen=True)
class TokenLayout:
    """Where the padding is in an image's `tiles` x `padded` tokens: `pad`, the padding tokens'
    indices (padded patches of each tile, and whole tiles past the image's own); `real_keys`,
    a [1, tokens] mask (an attention mask's shape) that is True at every real token."""

    pad: torch.Tensor
    real_keys: torch.Tensor

    @classmethod
    def of(cls, num_real_tiles: int, tiles: int, patches: int, padded: int,
           device: torch.device) -> TokenLayout:
        pos = torch.arange(tiles * padded, device=device)
        is_real = ((pos // padded) < num_real_tiles) & ((pos % padded) < patches)
        return cls(pos[~is_real], is_real[None, :])
