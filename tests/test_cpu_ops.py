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


def test_cached_shapes_count_the_products_onednn_keeps():
    """oneDNN keeps a primitive (about 0.55 MB of host heap) per product shape it is given:
    rows by weight shape, whatever the layer; /debug/stats reports the count."""
    a, b, c = Linear(32, 16), Linear(32, 16), Linear(32, 8)
    ops = OneDnnOps()
    for layer in (a, b, c):
        use_ops(layer, ops)
        ops.warm(layer)
    with torch.inference_mode():
        for rows in (1, 2, 3, 2, 1):
            a(torch.randn(rows, 32))
            b(torch.randn(1, rows, 32))  # the same shapes: a's primitives
        c(torch.randn(5, 32))
    assert ops.cached_shapes == 4  # 1, 2 and 3 rows of 32 -> 16; 5 rows of 32 -> 8


def test_a_float32_cpu_model_packs_every_linear_weight(t5_dir):
    from seq2serve.models.loader import load_model
    from seq2serve.runtime.config.model_config import ModelConfig

    model = load_model(ModelConfig.from_path(t5_dir), "cpu", torch.float32)
    ops = model.lm_head.ops
    assert isinstance(ops, OneDnnOps)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert {id(m.weight) for m in linears} <= set(ops._packed)


def test_int8_activations_are_scaled_per_token():
    """Rows of very different magnitudes keep the same relative error: one scale per row (a
    per-tensor scale would flush the small rows to zero)."""
    from seq2serve.models.cpu_ops import _prepack_int8, int8_activations_available, int8_linear

    if not int8_activations_available():
        pytest.skip("no fbgemm int8 kernels in this build")
    torch.manual_seed(0)
    qw = QuantizedWeight.from_float(torch.randn(300, 128), "int8")
    x = torch.randn(5, 128) * torch.tensor([1.0, 1e3, 1e-3, 30.0, 1.0])[:, None]
    bias = torch.randn(300)
    ref = F.linear(x, qw.dequantize(), bias)
    out = int8_linear(x, _prepack_int8(qw), bias)
    err = ((out - bias) - (ref - bias)).norm(dim=1) / (ref - bias).norm(dim=1)
    assert (err < 0.03).all(), err
    x3 = torch.randn(2, 3, 128)
    assert int8_linear(x3, _prepack_int8(qw)).shape == (2, 3, 300)


def test_int8_activations_leave_the_models_kept_layers_weight_only(t5_dir):
    from seq2serve.models.cpu_ops import int8_activations_available
    from seq2serve.models.loader import load_model
    from seq2serve.runtime.config.model_config import ModelConfig

    if not int8_activations_available():
        pytest.skip("no fbgemm int8 kernels in this build")
    model = load_model(ModelConfig.from_path(t5_dir), "cpu", torch.float32,
                       quantization="int8", int8_activations=True)
    ops = model.lm_head.ops
    for name, m in model.named_modules():
        if isinstance(m, Linear) and isinstance(m.weight, QuantizedWeight):
            kept = name.endswith("ff.down")  # T5's wo: outliers within a row
            assert (id(m.weight) in ops._packed) == kept, name
            assert (id(m.weight) in ops._int8) != kept, name


def test_int8_activations_are_refused_where_they_cannot_run():
    from seq2serve.models.loader import ops_for
    from seq2serve.runtime.config.server_args import ServerArgs

    with pytest.raises(ValueError, match="quantization='int8'"):
        ServerArgs(model_path="m", int8_activations=True)
    with pytest.raises(ValueError, match="on the CPU in float32"):
        ops_for("cuda", torch.bfloat16, int8_activations=True)
    with pytest.raises(ValueError, match="on the CPU in float32"):
        ops_for("cpu", torch.bfloat16, int8_activations=True)


def test_demo_model_with_int8_activations_agrees_with_float32():
    """The trained demo model, int8 weights and activations against float32: the first
    greedy token of 100 numbers (docs/benchmarks.md has the quality bench's 200-prompt run)."""
    from seq2serve.models.cpu_ops import int8_activations_available
    from seq2serve.runtime.config.tokenizer import load_tokenizer
    from seq2serve.runtime.tools.demo_checkpoint import default_demo_path
    from seq2serve.tests.helpers import make_scheduler, request, run_to_completion

    if not int8_activations_available():
        pytest.skip("no fbgemm int8 kernels in this build")
    path = str(default_demo_path())
    tok = load_tokenizer(path)
    sources = [tok(f"translate digits to English: {n * 7919 % 100000}").input_ids
               for n in range(100)]

    def first_tokens(**kwargs) -> dict[str, list[int]]:
        sched = make_scheduler(path, max_running_requests=100, **kwargs)
        for i, ids in enumerate(sources):
            sched.add_request(request(str(i), ids, max_new_tokens=1, ignore_eos=True))
        return run_to_completion(sched)

    ref = first_tokens()
    quant = first_tokens(quantization="int8", int8_activations=True)
    same = sum(ref[k][0] == quant[k][0] for k in ref)
    print(f"first tokens equal: {same}/100")
    assert same >= 95, same
