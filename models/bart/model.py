"""The BART family: BART (summarization: bart-large-cnn), Pegasus (summarization), and the
translation models Marian (OPUS-MT), M2M100 (and NLLB-200), mBART(-50).

An encoder stack and a decoder stack of LayerNorm blocks with biased linears and scaled
dot-product attention; absolute positions added to the (scaled) embeddings, no relative bias.
The families differ only where `config.Family` says: whether the norm comes before each
sublayer (mBART, M2M100, Pegasus) or after its residual add (BART, Marian), a norm after the
embeddings (BART, mBART) and at the end of each stack (mBART, M2M100, Pegasus), the position
table, and a bias on the logits (BART, Marian, mBART, Pegasus). Batching, paging and caching
are the runtime's, as for T5.

Tensor parallelism splits it as T5: each rank holds its share of every stack's heads (q/k/v
column-parallel, the output row-parallel, its bias added once after the sum) and feed-forward
channels, and its vocabulary rows of the token embeddings and the head
(models/vocab_parallel.py); the position tables and norms are whole on every rank, and the
logits' bias is added to the gathered logits, so it is whole too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from seq2serve.models import parallel_state
from seq2serve.models.attention import Attention
from seq2serve.models.bart.config import BartConfig
from seq2serve.models.bart.positions import PositionTable
from seq2serve.models.bart.weights import hf_to_param, load_priority
from seq2serve.models.family import ModelFamily
from seq2serve.models.linear import ColumnParallelLinear, RowParallelLinear
from seq2serve.models.mlp import MLP
from seq2serve.models.norm import LayerNorm
from seq2serve.models.vocab_parallel import embedding, lm_head
from seq2serve.runtime.attention.base import AttentionKind

if TYPE_CHECKING:
    from seq2serve.runtime.attention.forward_batch import EncodeForwardBatch, ForwardBatch


def residual(norm: LayerNorm, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor],
             pre_norm: bool) -> torch.Tensor:
    """x + sublayer(norm(x)) (pre-norm), or norm(x + sublayer(x)) (post-norm)."""
    if pre_norm:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


def _local_heads(heads: int) -> int:
    """This tensor-parallel rank's attention heads (all of them at tp_size 1)."""
    return parallel_state.tensor_parallel().shard(heads, "attention heads")


class BartSelfAttention(nn.Module):
    """Heads split over tensor-parallel ranks (column-parallel q/k/v, row-parallel output:
    plain linears at tp_size 1), as T5's."""

    def __init__(self, d_model: int, heads: int, kind: AttentionKind, layer_id: int) -> None:
        super().__init__()
        head_dim, local = d_model // heads, _local_heads(heads)
        self.qkv = ColumnParallelLinear(d_model, [d_model, d_model, d_model], bias=True,
                                        what="heads' q/k/v")
        self.o = RowParallelLinear(d_model, d_model, bias=True, what="heads' outputs")
        self.attn = Attention(kind, layer_id, local, local, head_dim, scaling=head_dim**-0.5)
        self.inner = local * head_dim  # this rank's heads' share of q, k and v

    def forward(self, x: torch.Tensor, fb: ForwardBatch | EncodeForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv(x).split(self.inner, dim=-1)
        return self.o(self.attn(q, k, v, fb))


class BartCrossAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, layer_id: int) -> None:
        super().__init__()
        head_dim, local = d_model // heads, _local_heads(heads)
        self.q = ColumnParallelLinear(d_model, d_model, bias=True, what="heads' q")
        self.kv = ColumnParallelLinear(d_model, [d_model, d_model], bias=True,
                                       what="heads' k/v")
        self.o = RowParallelLinear(d_model, d_model, bias=True, what="heads' outputs")
        self.attn = Attention(AttentionKind.CROSS, layer_id, local, local, head_dim,
                              scaling=head_dim**-0.5)
        self.inner = local * head_dim

    def store_kv(self, encoder_hidden: torch.Tensor, fb: EncodeForwardBatch) -> None:
        k, v = self.kv(encoder_hidden).split(self.inner, dim=-1)
        self.attn.store_cross_kv(k, v, fb)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.o(self.attn(self.q(x), None, None, fb))


class BartEncoderLayer(nn.Module):
    def __init__(self, cfg: BartConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.pre_norm = cfg.family.pre_norm
        self.self_attn = BartSelfAttention(d, cfg.encoder_attention_heads,
                                           AttentionKind.ENCODER, layer_id=-1)
        self.self_attn_norm = LayerNorm(d)
        self.ff = MLP(d, cfg.encoder_ffn_dim, cfg.activation, bias=True)
        self.ff_norm = LayerNorm(d)

    def forward(self, x: torch.Tensor, fb: EncodeForwardBatch) -> torch.Tensor:
        x = residual(self.self_attn_norm, x, lambda h: self.self_attn(h, fb), self.pre_norm)
        return residual(self.ff_norm, x, self.ff, self.pre_norm)


class BartDecoderLayer(nn.Module):
    def __init__(self, cfg: BartConfig, layer_id: int) -> None:
        super().__init__()
        d, heads = cfg.d_model, cfg.decoder_attention_heads
        self.pre_norm = cfg.family.pre_norm
        self.self_attn = BartSelfAttention(d, heads, AttentionKind.SELF, layer_id)
        self.self_attn_norm = LayerNorm(d)
        self.cross_attn = BartCrossAttention(d, heads, layer_id)
        self.cross_attn_norm = LayerNorm(d)
        self.ff = MLP(d, cfg.decoder_ffn_dim, cfg.activation, bias=True)
        self.ff_norm = LayerNorm(d)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        x = residual(self.self_attn_norm, x, lambda h: self.self_attn(h, fb), self.pre_norm)
        x = residual(self.cross_attn_norm, x, lambda h: self.cross_attn(h, fb), self.pre_norm)
        return residual(self.ff_norm, x, self.ff, self.pre_norm)


class BartForConditionalGeneration(ModelFamily):
    """HF's BartForConditionalGeneration, MarianMTModel, M2M100ForConditionalGeneration,
    MBartForConditionalGeneration and PegasusForConditionalGeneration, by `cfg.family`."""

    config_class = BartConfig
    tensor_parallel = True  # its layers split over ranks (models/parallel_state.py)

    def __init__(self, cfg: BartConfig) -> None:
        super().__init__()
        self.cfg = cfg
        fam, d = cfg.family, cfg.d_model
        self.embed_scale = math.sqrt(d) if cfg.scale_embedding else 1.0
        self.shared = embedding(cfg.vocab_size, d)  # the encoder's, and shared the decoder's
        self.decoder_embed = (None if cfg.decoder_shares_embedding
                              else embedding(cfg.vocab_size, d))
        self.encoder_positions = PositionTable(fam.positions, cfg.max_position_embeddings, d,
                                               cfg.pad_token_id)
        self.decoder_positions = PositionTable(fam.positions, cfg.max_position_embeddings, d,
                                               cfg.pad_token_id)
        self.encoder_embed_norm = LayerNorm(d) if fam.embed_norm else None
        self.decoder_embed_norm = LayerNorm(d) if fam.embed_norm else None
        self.encoder_layers = nn.ModuleList(BartEncoderLayer(cfg)
                                            for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(BartDecoderLayer(cfg, i)
                                            for i in range(cfg.decoder_layers))
        self.encoder_norm = LayerNorm(d) if fam.final_norm else None
        self.decoder_norm = LayerNorm(d) if fam.final_norm else None
        self.lm_head = lm_head(d, cfg.vocab_size)
        # [1, vocab], whole on every rank: added to the gathered logits
        self.final_logits_bias = (nn.Parameter(torch.empty(1, cfg.vocab_size),
                                               requires_grad=False)
                                  if fam.logits_bias else None)

    # --- the encoder stage -------------------------------------------------------------------
    def encode(self, fb: EncodeForwardBatch) -> torch.Tensor:
        """Run the encoder over a packed ragged batch; returns hidden states [tokens, d_model]."""
        ids = fb.token_ids
        rows = self.encoder_positions.encoder_rows(ids, fb.segment_lens)
        return self.encode_embeddings(self.shared(ids) * self.embed_scale, rows, fb)

    def encode_embeddings(self, x: torch.Tensor, rows: torch.Tensor,
                          fb: EncodeForwardBatch) -> torch.Tensor:
        """The encoder over inputs already embedded [tokens, d_model] (Florence-2: an image's
        features before its prompt's embeddings), at position table `rows`."""
        x = x + self.encoder_positions(rows)
        if self.encoder_embed_norm is not None:
            x = self.encoder_embed_norm(x)
        for layer in self.encoder_layers:
            x = layer(x, fb)
        return x if self.encoder_norm is None else self.encoder_norm(x)

    def store_cross_kv(self, encoder_hidden: torch.Tensor, fb: EncodeForwardBatch) -> None:
        """Project the encoder output to each decoder layer's cross K/V, once."""
        for layer in self.decoder_layers:
            layer.cross_attn.store_kv(encoder_hidden, fb)

    # --- the decoder -------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        embed = self.shared if self.decoder_embed is None else self.decoder_embed
        rows = self.decoder_positions.decoder_rows(input_ids, positions)
        x = embed(input_ids) * self.embed_scale + self.decoder_positions(rows)
        if self.decoder_embed_norm is not None:
            x = self.decoder_embed_norm(x)
        for layer in self.decoder_layers:
            x = layer(x, fb)
        return x if self.decoder_norm is None else self.decoder_norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        bias = self.final_logits_bias
        return self.lm_head(hidden, None if bias is None else bias.view(-1))

    # --- weights -----------------------------------------------------------------------------
    def weight_map(self, name: str) -> list[tuple[str, int | None]] | None:
        return hf_to_param(name, self.cfg)

    load_priority = staticmethod(load_priority)

    def tie_missing(self, missing: set[str]) -> set[str]:
        """lm_head tied to the decoder's embedding when the checkpoint has none and the config
        allows; a checkpoint without final_logits_bias has a zero one (HF's default)."""
        embed = self.shared if self.decoder_embed is None else self.decoder_embed
        missing = self.tie_lm_head(missing, embed, self.cfg.tie_word_embeddings)
        if "final_logits_bias" in missing:
            with torch.no_grad():
                self.final_logits_bias.zero_()
            missing = missing - {"final_logits_bias"}
        return missing

    def init_buffers(self) -> None:
        """The sinusoid tables (computed, not in the checkpoint)."""
        self.encoder_positions.init_buffers()
        self.decoder_positions.init_buffers()


def _embedding(vocab: int, dim: int) -> nn.Embedding:
    """A token embedding whole on every rank (Whisper's)."""
    e = nn.Embedding(vocab, dim)
    e.weight.requires_grad_(False)
    return e
