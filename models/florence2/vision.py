"""Florence-2's image encoder, as HF's `Florence2VisionBackbone` and
`Florence2MultiModalProjector` define it.

DaViT: stages of a patch-embedding convolution (a LayerNorm before or after it) and blocks,
each a spatial block (window attention) and a channel block (attention between channel
groups, over all the image's tokens), both with depthwise-convolution position mixing and an
MLP. The projector adds learned 2-D positions (column embedding, then row embedding, per
channel) and the cosine table's first row, prepends the mean of the tokens, projects to the
language model's width and normalises: [images, 1 + h * w, d_model].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from seq2serve.models.florence2.config import Florence2VisionConfig
from seq2serve.models.linear import Linear
from seq2serve.models.norm import LayerNorm
from seq2serve.runtime.kernels.activations import torch_activation


def _depthwise(dim: int) -> nn.Conv2d:
    return nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)


def _channels_last_norm(norm: LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """`norm` over the channels of [B, C, H, W]."""
    return norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class PatchEmbed(nn.Module):
    def __init__(self, in_dim: int, dim: int, kernel: int, stride: int, padding: int,
                 pre_norm: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_dim, dim, kernel_size=kernel, stride=stride, padding=padding)
        self.norm = LayerNorm(in_dim if pre_norm else dim)
        self.pre_norm = pre_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            return self.conv(_channels_last_norm(self.norm, x))
        return _channels_last_norm(self.norm, self.conv(x))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, activation: str) -> None:
        super().__init__()
        self.fc1 = Linear(dim, hidden, bias=True)
        self.fc2 = Linear(hidden, dim, bias=True)
        self.act = torch_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class WindowAttention(nn.Module):
    """Heads attend within windows of window x window tokens (the grid zero-padded at its
    right and bottom edges to whole windows; padding is attended to, as in HF)."""

    def __init__(self, dim: int, heads: int, window: int, qkv_bias: bool) -> None:
        super().__init__()
        self.qkv = Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = Linear(dim, dim, bias=True)
        self.heads, self.window = heads, window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, H, W, C] -> [B, H * W, C]."""
        b, h, w, c = x.shape
        s = self.window
        x = F.pad(x, (0, 0, 0, (s - w % s) % s, 0, (s - h % s) % s))
        ph, pw = x.shape[1] // s, x.shape[2] // s
        win = x.view(b, ph, s, pw, s, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s, c)
        q, k, v = self.qkv(win).view(win.shape[0], s * s, 3, self.heads, -1).permute(
            2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, scale=(c // self.heads) ** -0.5)
        out = self.proj(out.transpose(1, 2).reshape(win.shape[0], s * s, c))
        out = out.view(b, ph, pw, s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(b, ph * s, pw * s, c)
        return out[:, :h, :w].reshape(b, h * w, c)


class ChannelAttention(nn.Module):
    """Each group of channels attends over its channels, each channel a vector of all the
    image's tokens (scaled by tokens**-0.5)."""

    def __init__(self, dim: int, groups: int, qkv_bias: bool) -> None:
        super().__init__()
        self.qkv = Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = Linear(dim, dim, bias=True)
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N, C] -> [B, N, C]."""
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.groups, -1).permute(2, 0, 3, 4, 1)
        out = F.scaled_dot_product_attention(q, k, v, scale=n**-0.5)  # [B, G, C/G, N]
        return self.proj(out.permute(0, 3, 1, 2).reshape(b, n, c))


class MixingBlock(nn.Module):
    """x + dwconv(x), then x + attn(norm1(x)); x + dwconv(x), then x + ffn(norm2(x)).
    `spatial`: window attention (the spatial block), else channel attention."""

    def __init__(self, cfg: Florence2VisionConfig, stage: int, spatial: bool) -> None:
        super().__init__()
        dim = cfg.embed_dim[stage]
        self.conv1, self.conv2 = _depthwise(dim), _depthwise(dim)
        self.norm1, self.norm2 = LayerNorm(dim), LayerNorm(dim)
        self.ffn = FeedForward(dim, int(dim * cfg.mlp_ratio), cfg.activation_function)
        self.spatial = spatial
        if spatial:
            self.window_attn = WindowAttention(dim, cfg.num_heads[stage], cfg.window_size,
                                               cfg.qkv_bias)
        else:
            self.channel_attn = ChannelAttention(dim, cfg.num_groups[stage], cfg.qkv_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        x = (self.conv1(x) + x).flatten(2).transpose(1, 2)  # [B, N, C]
        if self.spatial:
            x = x + self.window_attn(self.norm1(x).view(b, h, w, c))
        else:
            x = x + self.channel_attn(self.norm1(x))
        x = x.transpose(1, 2).reshape(b, c, h, w)
        x = (self.conv2(x) + x).flatten(2).transpose(1, 2)
        x = x + self.ffn(self.norm2(x))
        return x.transpose(1, 2).reshape(b, c, h, w)


class DaViTBlock(nn.Module):
    def __init__(self, cfg: Florence2VisionConfig, stage: int) -> None:
        super().__init__()
        self.spatial_block = MixingBlock(cfg, stage, spatial=True)
        self.channel_block = MixingBlock(cfg, stage, spatial=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.channel_block(self.spatial_block(x))


class DaViT(nn.Module):
    """[B, C, H, W] pixels -> the last stage's features [B, embed_dim[-1], h, w]."""

    def __init__(self, cfg: Florence2VisionConfig) -> None:
        super().__init__()
        dims = (cfg.in_channels, *cfg.embed_dim)
        self.convs = nn.ModuleList(
            PatchEmbed(dims[i], dims[i + 1], k, s, p, cfg.patch_prenorm[i])
            for i, (k, s, p) in enumerate(cfg.stages))
        self.blocks = nn.ModuleList(
            nn.ModuleList(DaViTBlock(cfg, i) for _ in range(depth))
            for i, depth in enumerate(cfg.depths))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, blocks in zip(self.convs, self.blocks):
            x = conv(x)
            for block in blocks:
                x = block(x)
        return x


class Position2D(nn.Module):
    """Learned positions of the feature grid: a column embedding (the first half of the
    channels) and a row embedding (the rest)."""

    def __init__(self, cfg: Florence2VisionConfig) -> None:
        super().__init__()
        dim, rows = cfg.embed_dim[-1], cfg.max_position_embeddings
        self.row_embeddings = nn.Embedding(rows, dim // 2)
        self.column_embeddings = nn.Embedding(rows, dim - dim // 2)

    def forward(self, h: int, w: int, device: torch.device) -> torch.Tensor:
        """[C, h, w]."""
        col = self.column_embeddings(torch.arange(w, device=device))  # [w, C - C/2]
        row = self.row_embeddings(torch.arange(h, device=device))  # [h, C/2]
        grid = torch.cat([col[None].expand(h, w, -1), row[:, None].expand(h, w, -1)], dim=-1)
        return grid.permute(2, 0, 1)


class ImageProjector(nn.Module):
    """HF's multi_modal_projector, for one frame per image (its temporal table's row 0:
    sin 0 = 0 in the even channels, cos 0 = 1 in the odd ones)."""

    def __init__(self, cfg: Florence2VisionConfig) -> None:
        super().__init__()
        self.image_position_embed = Position2D(cfg)
        self.image_projection = Linear(cfg.embed_dim[-1], cfg.projection_dim)
        self.image_proj_norm = LayerNorm(cfg.projection_dim)
        self.dim = cfg.embed_dim[-1]
        self._first: torch.Tensor | None = None  # first_frame's row, made once

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """[B, C, h, w] -> [B, 1 + h * w, projection_dim]."""
        _, _, h, w = feats.shape
        x = (feats + self.image_position_embed(h, w, feats.device)).flatten(2).transpose(1, 2)
        x = x + self.first_frame(x.dtype, x.device)
        x = torch.cat([x.mean(dim=1, keepdim=True), x], dim=1)
        return self.image_proj_norm(self.image_projection(x))

    def first_frame(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Row 0 of HF's cosine temporal table: [sin 0, cos 0, sin 0, ...], made on the device
        once (a copy from the host each call waited for the tower's kernels)."""
        row = self._first
        if row is None or row.dtype != dtype or row.device != device:
            row = torch.zeros(self.dim, dtype=dtype, device=device)
            row[1::2] = math.cos(0.0)
            self._first = row
        return row
