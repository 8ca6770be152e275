"""Mllama (Llama 3.2 Vision): a vision tower whose output becomes cross-attention K/V, and a
Llama text model with gated cross-attention layers at `cross_attention_layers`.

Masking follows the reference implementation: a text token sees only the images of its group
(its own `<|image|>` run up to the next one, the runtime passes each query's key range in
the ForwardBatch); a token with no image (text before the first `<|image|>`, text-only
requests) gets neither cross-attention nor the cross layer's MLP. (HF transformers 5 masks
only the MLP for such rows: huggingface/transformers#39379.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from seq2serve.models.attention import Attention
from seq2serve.models.block import pre_norm
from seq2serve.models.family import ModelFamily
from seq2serve.models.linear import ColumnParallelLinear, Linear, RowParallelLinear
from seq2serve.models.llama.model import LlamaDecoderLayer, local_heads
from seq2serve.models.mllama.config import MllamaConfig
from seq2serve.models.mllama.vision import MllamaVisionModel
from seq2serve.models.mllama.weights import hf_to_param
from seq2serve.models.mlp import GatedMLP
from seq2serve.models.norm import RMSNorm
from seq2serve.models.rotary import RotaryEmbedding, rope_inv_freq
from seq2serve.models.vocab_parallel import embedding, lm_head
from seq2serve.runtime.attention.base import AttentionKind

if TYPE_CHECKING:
    from seq2serve.runtime.attention.forward_batch import EncodeForwardBatch, ForwardBatch


class MllamaCrossAttention(nn.Module):
    def __init__(self, cfg: MllamaConfig, cross_id: int) -> None:
        super().__init__()
        t = cfg.text
        h, kvh, d = t.num_attention_heads, t.num_key_value_heads, t.head_dim
        local_h, local_kvh = local_heads(h, kvh)
        self.kv_size = local_kvh * d  # this rank's heads
        self.q_proj = ColumnParallelLinear(t.hidden_size, h * d, what="heads' q")
        self.kv_proj = ColumnParallelLinear(t.hidden_size, [kvh * d, kvh * d], what="heads' k/v")
        self.o_proj = RowParallelLinear(h * d, t.hidden_size, what="heads' outputs")
        self.q_norm = RMSNorm(d, t.rms_norm_eps)
        self.k_norm = RMSNorm(d, t.rms_norm_eps)
        self.attn = Attention(AttentionKind.CROSS, cross_id, local_h, local_kvh, d,
                              scaling=d**-0.5)

    def store_kv(self, vision_states: torch.Tensor, fb: EncodeForwardBatch) -> None:
        k, v = self.kv_proj(vision_states).split(self.kv_size, dim=-1)
        k = self.k_norm(k.view(-1, self.attn.num_kv_heads, self.attn.head_dim))
        self.attn.store_cross_kv(k, v, fb)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.attend(self.q_proj(x), fb)

    def attend(self, q: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """The sublayer's output from its q projection."""
        q = self.q_norm(q.view(-1, self.attn.num_heads, self.attn.head_dim))
        return self.o_proj(self.attn(q, None, None, fb))


class MllamaCrossAttentionLayer(nn.Module):
    """Cross-attention and an MLP, each tanh-gated; rows without an image pass through. Takes
    and returns (x, h) as LlamaDecoderLayer does."""

    def __init__(self, cfg: MllamaConfig, cross_id: int) -> None:
        super().__init__()
        t = cfg.text
        self.input_layernorm = RMSNorm(t.hidden_size, t.rms_norm_eps)
        self.cross_attn = MllamaCrossAttention(cfg, cross_id)
        self.cross_attn_attn_gate = nn.Parameter(torch.empty(1), requires_grad=False)
        self.post_attention_layernorm = RMSNorm(t.hidden_size, t.rms_norm_eps)
        self.mlp = GatedMLP(t.hidden_size, t.intermediate_size, t.hidden_act)
        self.cross_attn_mlp_gate = nn.Parameter(torch.empty(1), requires_grad=False)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None, fb: ForwardBatch,
                has_image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, x = pre_norm(self.input_layernorm, x, h, self.cross_attn.q_proj)
        h = self.cross_attn.attend(q, fb) * has_image
        gate_up, x = pre_norm(self.post_attention_layernorm, x,
                              self.cross_attn_attn_gate.tanh() * h, self.mlp.in_proj)
        h = self.mlp.after_in_proj(gate_up) * has_image
        return x, self.cross_attn_mlp_gate.tanh() * h


class MllamaForConditionalGeneration(ModelFamily):
    config_class = MllamaConfig
    tensor_parallel = True  # its layers split over ranks (models/parallel_state.py)
    # a token reads only its image group's cross keys: the runtime passes each token's range
    optional_inputs = ("cross_kv_start", "cross_kv_end")

    def __init__(self, cfg: MllamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        t = cfg.text
        self.vision_model = MllamaVisionModel(cfg.vision)
        self.multi_modal_projector = Linear(cfg.vision.vision_output_dim, t.hidden_size,
                                            bias=True)
        self.rotary = RotaryEmbedding(t.head_dim, t.rope_theta, t.rope_scaling)
        self.embed_tokens = embedding(t.vocab_size + 8, t.hidden_size)  # HF keeps 8 spare
        layers, self_id, cross_id = [], 0, 0
        for i in range(t.num_hidden_layers):
            if i in cfg.cross_attention_layers:
                layers.append(MllamaCrossAttentionLayer(cfg, cross_id))
                cross_id += 1
            else:
                layers.append(LlamaDecoderLayer(t, self_id))
                self_id += 1
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(t.hidden_size, t.rms_norm_eps)
        self.lm_head = lm_head(t.hidden_size, t.vocab_size)

    # --- the encoder stage -------------------------------------------------------------------
    def encode(self, fb: EncodeForwardBatch) -> torch.Tensor:
        """Vision tower + projector over the batch's images; the real tiles' states, packed."""
        imgs = fb.model_input
        states = self.vision_model(imgs.pixel_values, imgs.aspect_ratio_ids, imgs.num_tiles)
        return self.multi_modal_projector(torch.cat(states))

    def store_cross_kv(self, encoder_hidden: torch.Tensor, fb: EncodeForwardBatch) -> None:
        for layer in self.layers:
            if isinstance(layer, MllamaCrossAttentionLayer):
                layer.cross_attn.store_kv(encoder_hidden, fb)

    # --- the text model ----------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                fb: ForwardBatch) -> torch.Tensor:
        x, h = self.embed_tokens(input_ids), None
        rope = self.rotary(positions, x.dtype)
        has_image = self._rows_with_images(fb, x)
        for layer in self.layers:
            if isinstance(layer, MllamaCrossAttentionLayer):
                x, h = layer(x, h, fb, has_image)
            else:
                x, h = layer(x, h, rope, fb)
        return pre_norm(self.norm, x, h)[0]

    @staticmethod
    def _rows_with_images(fb: ForwardBatch, x: torch.Tensor) -> torch.Tensor:
        """[tokens, 1]: 1 where the token has at least one image to attend to."""
        if fb.cross_kv_start is None:
            return torch.zeros(x.shape[0], 1, dtype=x.dtype, device=x.device)
        return (fb.cross_kv_end > fb.cross_kv_start).to(x.dtype)[:, None]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    # --- weights -----------------------------------------------------------------------------
    weight_map = staticmethod(hf_to_param)

    def init_buffers(self) -> None:
        t = self.cfg.text
        self.rotary.inv_freq = rope_inv_freq(t.head_dim, t.rope_theta, t.rope_scaling).to(
            self.embed_tokens.weight.device)
