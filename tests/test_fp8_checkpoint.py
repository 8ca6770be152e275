"""FP8 checkpoints (compressed-tensors, fbgemm_fp8 layouts) written here from a tiny Llama:
the loader keeps their FP8 bytes and scales as stored, serves them dequantized where the
device has no FP8 (token for token what HF computes from the dequantized weights), and
refuses layouts it cannot read by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from seq2serve.models.quantized_weight import QuantizedWeight

FP8 = torch.float8_e4m3fn
PER_TENSOR = "model.layers.0.self_attn.o_proj.weight"  # one layer with a per-tensor scale

COMPRESSED = {"quant_method": "compressed-tensors", "format": "float-quantized",
              "config_groups": {"group_0": {
                  "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                              "symmetric": True, "dynamic": False},
                  "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                        "dynamic": True},
                  "targets": ["Linear"]}},
              "ignore": ["lm_head"]}
FBGEMM = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
          "modules_to_not_convert": ["lm_head"]}


def _fp8(w: torch.Tensor, per_tensor: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What the publishers' tools store: w / scale in E4M3, scale = max |w| / 448 (per row,
    or over the whole tensor)."""
    amax = w.abs().max() if per_tensor else w.abs().amax(dim=1, keepdim=True)
    scale = (amax / 448.0).float()
    return (w / scale).clamp(-448, 448).to(FP8), scale.reshape(1) if per_tensor else scale


def _write(src, out, qc: dict, extra: dict | None = None):
    """(the FP8 checkpoint, its dequantized float32 twin for HF)."""
    out.mkdir()
    deq_dir = out.parent / (out.name + "-dequantized")
    shutil.copytree(src, deq_dir)
    state = load_file(str(src / "model.safetensors"))
    fp8_state, deq_state = {}, {}
    for name, t in state.items():
        if t.dim() == 2 and "proj" in name:
            q, s = _fp8(t, per_tensor=name == PER_TENSOR)
            base = name.removesuffix(".weight")
            fp8_state[name], fp8_state[base + ".weight_scale"] = q, s
            fp8_state[base + ".input_scale"] = torch.ones(1)  # static: unused (dynamic here)
            deq_state[name] = q.float() * s
        else:
            fp8_state[name] = deq_state[name] = t
    fp8_state.update(extra or {})
    save_file(fp8_state, str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file(deq_state, str(deq_dir / "model.safetensors"), metadata={"format": "pt"})
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, out / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(cfg))
    return out, deq_dir


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

    return write_llama_checkpoint(tmp_path_factory.mktemp("fp8") / "src", seed=5,
                                  init_scale=10.0)


def _build(path: str):
    from seq2serve.models import registry
    from seq2serve.runtime.config.model_config import ModelConfig

    mc = ModelConfig.from_path(path)
    with torch.device("meta"):
        model = registry.model_class(mc.architecture)(mc.arch)
    return model.to_empty(device="cpu")


@pytest.mark.parametrize("qc", [COMPRESSED, FBGEMM], ids=["compressed-tensors", "fbgemm_fp8"])
def test_fp8_layers_load_as_stored(llama, tmp_path, qc):
    from seq2serve.models import fp8_checkpoint
    from seq2serve.models.loader import checkpoint_files, load_weights

    path, _ = _write(llama, tmp_path / "ckpt", qc)
    assert fp8_checkpoint.check_config(str(path)) == qc["quant_method"]
    files = checkpoint_files(str(path))
    model = _build(str(path))
    assert fp8_checkpoint.prepare(model, fp8_checkpoint.fp8_weights(files),
                                  torch.bfloat16) == 2 * 4  # qkv, o, gate_up, down per layer
    load_weights(model, files)
    stored = load_file(str(path / "model.safetensors"))
    qkv = model.layers[0].self_attn.qkv_proj.weight
    assert isinstance(qkv, QuantizedWeight) and qkv.qweight.dtype == FP8
    names = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    assert torch.equal(qkv.qweight.view(torch.uint8), torch.cat(
        [stored[n + ".weight"] for n in names]).view(torch.uint8))  # the bytes as stored
    assert torch.equal(qkv.scale, torch.cat([stored[n + ".weight_scale"].reshape(-1)
                                             for n in names]))
    o = model.layers[0].self_attn.o_proj.weight  # a per-tensor scale, one per row now
    assert torch.equal(o.scale, stored[PER_TENSOR + "_scale"].expand(o.shape[0]))
    assert not isinstance(model.lm_head.weight, QuantizedWeight)


def test_fp8_checkpoint_on_the_cpu_is_served_dequantized(llama, tmp_path):
    from transformers import AutoModelForCausalLM

    from seq2serve import Seq2SeqEngine

    path, deq = _write(llama, tmp_path / "ckpt", COMPRESSED)
    prompts = [[128000, 5, 900, 31, 7], [128000, 77, 12, 4000]]
    with Seq2SeqEngine(model_path=str(path), device="cpu") as engine:
        outs = engine.generate(input_ids=prompts, sampling_params={
            "max_new_tokens": 10, "temperature": 0, "ignore_eos": True})
    hf = AutoModelForCausalLM.from_pretrained(str(deq), dtype=torch.float32).eval()
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=10, min_new_tokens=10,
                              do_sample=False)[0, len(ids):].tolist()
        assert out["output_ids"] == ref


@pytest.mark.parametrize("case, message", [
    ("gptq", "quant_method 'gptq' is not supported"),
    ("int_weights", "only FP8 weights"),
    ("block_scales", "not block-wise"),
    ("mixed_fused", "mixed precision in one fused layer"),
])
def test_unreadable_checkpoints_are_refused_by_name(llama, tmp_path, case, message):
    from seq2serve.models.loader import load_model
    from seq2serve.runtime.config.model_config import ModelConfig

    qc = json.loads(json.dumps(COMPRESSED))
    if case == "gptq":
        qc = {"quant_method": "gptq", "bits": 4}
    elif case == "int_weights":
        qc["config_groups"]["group_0"]["weights"].update(type="int", num_bits=4)
    path, _ = _write(llama, tmp_path / "ckpt", qc)
    state = load_file(str(path / "model.safetensors"))
    if case == "block_scales":
        state["model.layers.0.mlp.down_proj.weight_scale"] = torch.ones(2, 2)
    elif case == "mixed_fused":
        state["model.layers.1.self_attn.k_proj.weight"] = state[
            "model.layers.1.self_attn.k_proj.weight"].float()
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=message):
        load_model(ModelConfig.from_path(str(path)), "cpu", torch.float32)
