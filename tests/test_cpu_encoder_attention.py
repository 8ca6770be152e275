"""The CPU backend's encoder attention (torch_batched: inputs padded into groups, one fused
product per group) against the reference's one-input-at-a-time loop (torch_native), on
ragged batches: equal lengths (a view, no copy), mixed lengths (padded groups, reordered
back), T5's relative bias and grouped KV heads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from seq2serve.models.mt5.relative_position import RelativePositionBias
from seq2serve.runtime.attention.base import AttentionKind
from seq2serve.runtime.attention.forward_batch import EncodeForwardBatch
from seq2serve.runtime.attention.padded_segments import PaddedSegments
from seq2serve.runtime.attention.torch_batched import TorchBatchedBackend
from seq2serve.runtime.attention.torch_native import TorchNativeBackend


def _encode(backend, lens, q, k, v, layer, bias):
    fb = EncodeForwardBatch(token_ids=None, model_input=None, segment_lens=lens,
                            cross_out_loc=torch.empty(0), cached_hidden=None)
    backend.init_forward_metadata(fb)
    return backend.forward_encoder(q, k, v, layer, fb, bias)


@pytest.mark.parametrize("lens", [[6] * 5, [5, 5, 3, 9, 1, 9, 9, 2, 40, 7], [1], [3, 70]])
@pytest.mark.parametrize("heads,kv_heads,with_bias,window,softcap", [
    (4, 4, True, None, None), (4, 2, False, None, None),
    (4, 2, False, 2, 0.5),  # T5Gemma's: keys at most 2 away, scores soft-capped
    (4, 4, True, 5, None),
])
def test_batched_encoder_attention_matches_the_reference(lens, heads, kv_heads, with_bias,
                                                         window, softcap):
    torch.manual_seed(0)
    dim, total = 8, sum(lens)
    layer = SimpleNamespace(kind=AttentionKind.ENCODER, layer_id=-1, num_heads=heads,
                            num_kv_heads=kv_heads, head_dim=dim, scaling=dim**-0.5,
                            sliding_window=window, softcap=softcap)
    q = torch.randn(total, heads, dim)
    k, v = torch.randn(total, kv_heads, dim), torch.randn(total, kv_heads, dim)
    bias = None
    if with_bias:
        bias = RelativePositionBias(32, 128, heads, True)
        torch.nn.init.normal_(bias.weight, std=2.0)
    with torch.inference_mode():
        ref = _encode(TorchNativeBackend(), lens, q, k, v, layer, bias)
        out = _encode(TorchBatchedBackend(), lens, q, k, v, layer, bias)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_groups_keep_padding_small_and_cover_every_input_once():
    lens = [1, 2, 3, 50, 51, 52, 200, 4, 4, 4, 4]
    seg = PaddedSegments(lens, heads=8, device=torch.device("cpu"))
    assert sum(g.count for g in seg.groups) == len(lens)
    for g in seg.groups:
        real = g.count * g.length if g.valid is None else int(g.valid.sum())
        assert g.count * g.length <= 1.25 * real
    rows = torch.cat([torch.arange(g.start, g.start + g.count * g.length) if g.rows is None
                      else g.rows for g in seg.groups])
    assert sorted(rows.tolist()) == list(range(sum(lens)))
    # inputs of one length are one group, read as a view of the packed rows
    (same,) = PaddedSegments([7] * 9, heads=8, device=torch.device("cpu")).groups
    assert same.index is None and same.count == 9
