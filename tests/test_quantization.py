"""8-bit weights: quantize/dequantize error bounds, the int8 and FP8 products against float
references (PyTorch ops, the Triton kernels under the interpreter), which layers a model
quantizes, refusals, and int8 serving against HF on the same (dequantized) weights."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from seq2serve.models.quantization import check_supported, quantize_model
from seq2serve.models.quantized_weight import QuantizedWeight, dequantize_rows, quantize_rows
from seq2serve.runtime.kernels.fp8_gemm import fp8_linear, quantize_tokens

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn


def _weights(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 3
    w[0, 0] = 40.0  # an outlier row
    w[1] = 0.0  # an all-zero row (no division by zero)
    return w


def _fp8_bound(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """E4M3 rounding: half a step of its 3 mantissa bits (2**-4 of the magnitude), or half
    the subnormal step (2**-10 of the scale) below the normal range."""
    return torch.maximum(w.abs() * 2**-4, scale[:, None] * 2**-10) * (1 + 1e-6)


def test_int8_round_trip_is_within_half_a_step():
    w = _weights(37, 64, 0)
    q, scale = quantize_rows(w, "int8")
    assert q.dtype == torch.int8 and scale.shape == (37,)
    assert q.abs().max() == 127 and q[1].abs().max() == 0
    err = (dequantize_rows(q, scale, torch.float32) - w).abs()
    assert (err <= scale[:, None] / 2 * (1 + 1e-6)).all()
    assert err.max() > 0  # really rounded


def test_fp8_round_trip_is_within_e4m3_rounding():
    w = _weights(48, 80, 1)
    q, scale = quantize_rows(w, "fp8")
    assert q.dtype == FP8
    torch.testing.assert_close(q.float().abs().amax(1)[2:], torch.full((46,), 448.0))
    err = (dequantize_rows(q, scale, torch.float32) - w).abs()
    assert (err <= _fp8_bound(w, scale)).all()
    assert err.max() > 0


def test_per_token_fp8_activations_are_within_e4m3_rounding():
    x = _weights(6, 64, 2).to(torch.bfloat16)
    xq, scale = quantize_tokens(x)
    assert xq.dtype == FP8 and scale.shape == (6, 1)
    err = (xq.float() * scale - x.float()).abs()
    assert (err <= _fp8_bound(x.float(), scale[:, 0])).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_linear_is_the_dequantized_product(dtype, with_bias):
    from seq2serve.models.ops import REFERENCE

    w = _weights(40, 96, 3).to(dtype)
    qw = QuantizedWeight.from_float(w, "int8")
    x = torch.randn(2, 5, 96).to(dtype)
    b = torch.randn(40).to(dtype) if with_bias else None
    ref = F.linear(x.float(), qw.dequantize().float(), None if b is None else b.float())
    # bf16: the product's rounding (outputs ~ 20: steps of 0.06 to 0.125) and the scale's
    atol, rtol = (1e-4, 1e-4) if dtype == torch.float32 else (0.15, 1e-2)
    torch.testing.assert_close(REFERENCE.linear(x, qw, b).float(), ref, atol=atol, rtol=rtol)


def test_fp8_linear_is_the_product_of_the_quantized_operands():
    """(torch._scaled_mm: on the CPU here, CUTLASS's row-wise kernel on an sm_89+ GPU.)"""
    w = _weights(32, 64, 4).to(DEVICE)
    q, scale = quantize_rows(w, "fp8")
    x = torch.randn(7, 64, dtype=torch.bfloat16).to(DEVICE) * 5
    b = torch.randn(32, dtype=torch.bfloat16).to(DEVICE)
    xq, xs = quantize_tokens(x)
    ref = (xq.float() * xs) @ (q.float() * scale[:, None]).T + b.float()
    out = fp8_linear(x, q, scale, b)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=1e-2)
    # and close to the float product: the error FP8 costs, not a wrong result
    rel = (out.float() - F.linear(x.float(), w, b.float())).norm() / ref.norm()
    assert rel < 0.05


@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("m, n, k, block_n, block_k", [(1, 37, 64, 8, 32), (3, 48, 100, 16, 64)])
def test_gemv_reads_8bit_weights(method, m, n, k, block_n, block_k):
    from seq2serve.models.norm import RMSNorm
    from seq2serve.runtime.kernels.triton_gemv import gated_gemv, gemv, norm_gemv

    w = _weights(n, k, m * n)
    q, scale = quantize_rows(w, method)
    deq = dequantize_rows(q, scale, torch.float32)
    q, scale = q.to(DEVICE), scale.to(DEVICE)
    g = torch.Generator().manual_seed(k)
    x, res = (torch.randn(m, k, generator=g).to(DEVICE) for _ in range(2))
    b = torch.randn(n, generator=g).to(DEVICE)
    blocks = dict(block_n=block_n, block_k=block_k, w_scale=scale)
    deq = deq.to(DEVICE)
    torch.testing.assert_close(gemv(x, q, b, **blocks), F.linear(x, deq, b), atol=1e-3,
                               rtol=1e-4)
    norm = RMSNorm(k, 1e-6).to(DEVICE)
    norm.weight.data = torch.rand(k, generator=g).to(DEVICE) + 0.5
    out, summed = norm_gemv(x, norm.weight, norm.eps, q, None, res, **blocks)
    torch.testing.assert_close(summed, x + res)
    torch.testing.assert_close(out, F.linear(norm(x + res), deq), atol=1e-3, rtol=1e-4)
    gate_up = torch.randn(m, 2 * k, generator=g).to(DEVICE)
    act = F.silu(gate_up[:, :k]) * gate_up[:, k:]
    torch.testing.assert_close(gated_gemv(gate_up, "silu", q, **blocks), F.linear(act, deq),
                               atol=1e-3, rtol=1e-4)


# (bfloat16 on a GPU only: the interpreter's tl.dot gets bf16 wrong, with or without 8 bits)
@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16] + (
    [torch.bfloat16] if DEVICE == "cuda" else []))
def test_skinny_gemm_reads_8bit_weights(method, dtype):
    from seq2serve.runtime.kernels.triton_skinny import skinny_gemm

    w = _weights(48, 64, 9)
    q, scale = quantize_rows(w, method)
    deq = dequantize_rows(q, scale, torch.float32).to(DEVICE)
    x = torch.randn(5, 64).to(dtype).to(DEVICE)
    b = torch.randn(48).to(dtype).to(DEVICE)
    out = skinny_gemm(x, q.to(DEVICE), b, block_n=16, block_k=32, w_scale=scale.to(DEVICE))
    ref = F.linear(x.float(), deq, b.float())
    atol, rtol = (1e-4, 1e-4) if dtype == torch.float32 else (0.15, 1e-2)
    torch.testing.assert_close(out.float(), ref, atol=atol, rtol=rtol)


def test_triton_ops_route_8bit_weights_like_the_reference():
    """A quantized Llama layer's products through TritonOps (GEMV at 1 row, skinny GEMM at
    2-16) equal the reference ops' on the same QuantizedWeight."""
    from seq2serve.models.ops import REFERENCE, TritonOps

    ops = TritonOps(gemv_blocks=(8, 32))
    for method in ("int8", "fp8"):
        qw = QuantizedWeight.from_float(_weights(32, 64, 5), method)
        for rows in (1, 4, 20):
            x = torch.randn(rows, 64)
            ref = F.linear(x, qw.dequantize())
            got = ops.linear(x, qw)
            if method == "fp8" and rows > 16:  # activations quantized too: FP8's error (and
                # the interpreter's E4M3 cast's, tests/test_fp8_quant_kernel.py; compiled:
                # tests/test_gpu_quantization.py's bound)
                assert (got - ref).norm() / ref.norm() < 0.1
            else:
                torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-4)
        normed = torch.randn(1, 64)
        torch.testing.assert_close(
            ops.norm_linear(normed, torch.ones(64), 1e-6, qw)[0],
            REFERENCE.linear(REFERENCE.rms_norm(normed, torch.ones(64), 1e-6),
                             qw.dequantize()), atol=1e-3, rtol=1e-4)


# --- which layers --------------------------------------------------------------------------
def _model(path: str):
    from seq2serve.models.loader import load_model
    from seq2serve.runtime.config.model_config import ModelConfig

    return load_model(ModelConfig.from_path(path), "cpu", torch.float32)


def _quantized_names(model) -> set[str]:
    return {n.removesuffix(".weight") for n, m in model.named_modules()
            if isinstance(m, QuantizedWeight)}


def test_t5_keeps_wo_unquantized_with_fp8_only(tmp_path):
    from seq2serve.runtime.tools.demo_checkpoint import write_t5_checkpoint

    path = str(write_t5_checkpoint(tmp_path / "t5", mt5=True, d_model=32, d_kv=16,
                                   num_heads=2, d_ff=64, num_layers=1, num_decoder_layers=1))
    fp8 = _model(path)
    quantize_model(fp8, "fp8")
    names = _quantized_names(fp8)
    assert "decoder_layers.0.cross_attn.kv" in names and "encoder_layers.0.ff.gate_up" in names
    assert not any(n.endswith("ff.down") for n in names)
    assert "lm_head" not in names
    int8 = _model(path)
    quantize_model(int8, "int8", quantize_lm_head=True)
    assert {"decoder_layers.0.ff.down", "lm_head"} <= _quantized_names(int8)


def test_a_tied_lm_head_quantizes_without_touching_the_embedding(tmp_path):
    from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

    path = str(write_llama_checkpoint(tmp_path / "l", tie_word_embeddings=True,
                                      vocab_size=128256))
    model = _model(path)
    embedding = model.embed_tokens.weight.clone()
    quantize_model(model, "int8", quantize_lm_head=True)
    assert isinstance(model.lm_head.weight, QuantizedWeight)
    assert torch.equal(model.embed_tokens.weight, embedding)
    assert model.embed_tokens.weight.dtype == torch.float32


def test_fp8_keeps_layers_that_are_not_multiples_of_16(tmp_path):
    from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

    path = str(write_llama_checkpoint(tmp_path / "l", hidden_size=64, intermediate_size=72))
    model = _model(path)
    quantize_model(model, "fp8")
    names = _quantized_names(model)
    assert "layers.0.self_attn.qkv_proj" in names
    assert "layers.0.mlp.down" not in names  # K = 72
    assert "layers.0.mlp.gate_up" in names  # N = 144, K = 64


def test_fp8_keeps_an_lm_head_whose_vocabulary_is_not_a_multiple_of_16(tmp_path):
    """OPUS-MT's vocabulary (58,101 in en-de) with --quantize-lm-head: the head stays in the
    model's dtype (cuBLASLt refused it at start-up before), the other layers quantize."""
    from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

    for vocab, quantized in ((1003, False), (1008, True)):
        path = str(write_llama_checkpoint(tmp_path / str(vocab), hidden_size=64,
                                          intermediate_size=128, vocab_size=vocab))
        model = _model(path)
        quantize_model(model, "fp8", quantize_lm_head=True)
        names = _quantized_names(model)
        assert ("lm_head" in names) == quantized
        assert "layers.0.mlp.down" in names


# --- refusals -------------------------------------------------------------------------------
def test_refusals_name_the_problem():
    from seq2serve.runtime.config.server_args import ServerArgs

    with pytest.raises(ValueError, match="on the CPU use --quantization int8"):
        check_supported("fp8", "cpu")
    with pytest.raises(ValueError, match="this GPU is sm_80: use --quantization int8"):
        check_supported("fp8", "cuda:0", capability=(8, 0))
    check_supported("fp8", "cuda:0", capability=(9, 0))
    check_supported("fp8", "cuda:0", capability=(8, 9))
    check_supported("int8", "cpu")
    check_supported("int8", "cuda:0", capability=(7, 5))
    with pytest.raises(ValueError, match="quantization must be one of"):
        check_supported("int4", "cpu")
    with pytest.raises(ValueError, match="quantization must be one of"):
        ServerArgs(quantization="awq")


def test_engine_refuses_fp8_on_the_cpu(tmp_path):
    from seq2serve import Seq2SeqEngine
    from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

    path = write_llama_checkpoint(tmp_path / "l")
    with pytest.raises(Exception, match="fp8 quantization needs an NVIDIA GPU"):
        Seq2SeqEngine(model_path=str(path), device="cpu", quantization="fp8")


def test_cli_has_the_flags():
    import argparse

    from seq2serve.runtime.cli import add_server_args, server_args_from

    p = argparse.ArgumentParser()
    add_server_args(p)
    ns = p.parse_args(["--quantization", "int8", "--quantize-lm-head"])
    args = server_args_from(ns)
    assert args["quantization"] == "int8" and args["quantize_lm_head"] is True


# --- serving int8 against HF on the dequantized weights -------------------------------------
def _dequantized_copy(src, dst, method: str):
    """The checkpoint with every linear weight but the LM head replaced by its per-row
    quantize/dequantize round trip (what the quantized model multiplies by)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    state = load_file(str(src / "model.safetensors"))
    for name, t in state.items():
        if t.dim() == 2 and "proj" in name:
            q, s = quantize_rows(t, method)
            state[name] = dequantize_rows(q, s, t.dtype)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_int8_llama_greedy_matches_hf_on_dequantized_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    from seq2serve import Seq2SeqEngine
    from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

    src = write_llama_checkpoint(tmp_path / "l", seed=2, init_scale=10.0)
    deq = _dequantized_copy(src, tmp_path / "deq", "int8")
    prompts = [[128000, 5, 900, 31, 7], [128000, 77, 12, 4000]]
    with Seq2SeqEngine(model_path=str(src), device="cpu", quantization="int8") as engine:
        outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 12,
                                                                   "temperature": 0,
                                                                   "ignore_eos": True})
        engine.check_integrity()
    hf = AutoModelForCausalLM.from_pretrained(str(deq), dtype=torch.float32).eval()
    plain = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    differs = False
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                              min_new_tokens=12)[0, len(ids):].tolist()
            unq = plain(torch.tensor([ids])).logits[0, -1]
            q = hf(torch.tensor([ids])).logits[0, -1]
        assert out["output_ids"] == ref
        differs |= not torch.equal(unq, q)
    assert differs  # the round trip changed the weights: the test is not of float32


def test_quality_compare_counts_agreement():
    from seq2serve.runtime.bench.quality import compare, prompts

    r = compare([[1, 2, 3], [4, 5, 6], [7, 8], [9]], [[1, 2, 3], [4, 0, 6], [0, 8], [9]])
    assert r == {"prompts": 4, "next_token_agreement": 0.75, "greedy_sequence_match": 0.5,
                 "mean_prefix_kept": (1 + 1 / 3 + 0 + 1) / 4}
    assert len(set(prompts(200))) == 200
    with pytest.raises(ValueError):
        prompts(201)


@pytest.mark.long  # (~35 s: the CLI end to end)
def test_bench_quality_cli_reports(tmp_path, capsys):
    from seq2serve.runtime.cli import main
    from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

    path = write_llama_checkpoint(tmp_path / "l", seed=1, init_scale=10.0)
    out = tmp_path / "q.json"
    assert main(["bench", "quality", "--model-path", str(path), "--num-prompts", "6",
                 "--max-new-tokens", "3", "--device", "cpu", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["prompts"] == 6 and 0.0 <= r["next_token_agreement"] <= 1.0
    assert "next-token agreement" in capsys.readouterr().out
    # the control: unquantized against the same dtype agrees everywhere (no quantization)
    assert main(["bench", "quality", "--model-path", str(path), "--num-prompts", "6",
                 "--max-new-tokens", "3", "--device", "cpu", "--quantization", "none",
                 "--reference-dtype", "float32", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["quantization"] == "none" and r["greedy_sequence_match"] == 1.0
    assert "unquantized auto vs unquantized (float32)" in capsys.readouterr().out
