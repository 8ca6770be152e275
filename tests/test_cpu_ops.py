"""OneDnnOps (the CPU's float32 ops, weights prepacked for oneDNN) against `F.linear`: any row
count and leading shape, with and without a bias; what was not packed (another dtype, an
8-bit weight) runs as the reference; a model loaded on the CPU packs every linear weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2serve.models.cpu_ops import OneDnnOps, onednn_available
from seq2serve.models.linear import Linear
from seq2serve.models.ops import use_ops
from seq2serve.models.quantized_weight import QuantizedWeight

pytestmark = pytest.mark.skipif(not onednn_available(), reason="PyTorch without oneDNN")


def test_packed_linear_matches_f_linear():
    torch.manual_seed(0)
    layer = Linear(96, [40, 24], bias=True)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    ops = OneDnnOps()
    use_ops(layer, ops)
    ops.warm(layer)
    assert id(layer.weight) in ops._packed
    with torch.inference_mode():
        for shape in [(1, 96), (3, 96), (64, 96), (2, 5, 96)]:
            x = torch.randn(shape)
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias),
                                       rtol=1e-5, atol=1e-4)
        x = torch.randn(7, 192)[:, ::2]  # a strided input
        torch.testing.assert_close(ops.linear(x, layer.weight),
                                   F.linear(x, layer.weight), rtol=1e-5, atol=1e-4)


def test_what_was_not_packed_runs_as_the_reference():
    ops = OneDnnOps()
    w = torch.randn(16, 32)
    x = torch.randn(4, 32)
    assert torch.equal(ops.linear(x, w), F.linear(x, w))  # never warmed: not packed
    qw = QuantizedWeight.from_float(w, "int8")
    torch.testing.assert_close(ops.linear(x, qw), F.linear(x, qw.dequantize()),
                               rtol=1e-5, atol=1e-5)
    layer = Linear(32, 16).to(torch.bfloat16)
    use_ops(layer, ops)
    ops.warm(layer)
    assert id(layer.weight) not in ops._packed


def test_a_float32_cpu_model_packs_every_linear_weight(t5_dir):
    from seq2serve.models.loader import load_model
    from seq2serve.runtime.config.model_config import ModelConfig

    model = load_model(ModelConfig.from_path(t5_dir), "cpu", torch.float32)
    ops = model.lm_head.ops
    assert isinstance(ops, OneDnnOps)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert {id(m.weight) for m in linears} <= set(ops._packed)
