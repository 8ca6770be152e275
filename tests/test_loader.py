"""Loading HF checkpoints: sharded and single files, dtypes, and errors that name the tensor."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from seq2serve.models.loader import load_model
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.tests.helpers import hf_model


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _load(path, dtype=torch.float32):
    return load_model(ModelConfig.from_path(str(path)), "cpu", dtype)


def _edit_weights(path, fn):
    state = load_file(str(path / "model.safetensors"))
    fn(state)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_weights_equal_hf_parameters(t5_dir):
    ours = _load(t5_dir)
    hf = hf_model(t5_dir)
    torch.testing.assert_close(ours.shared.weight, hf.shared.weight, rtol=0, atol=0)
    torch.testing.assert_close(ours.lm_head.weight, hf.lm_head.weight, rtol=0, atol=0)
    attn = hf.decoder.block[1].layer[0].SelfAttention
    qkv = torch.cat([attn.q.weight, attn.k.weight, attn.v.weight])
    torch.testing.assert_close(ours.decoder_layers[1].self_attn.qkv.weight, qkv, rtol=0, atol=0)


def test_sharded_checkpoint_loads_the_same(t5_dir, tmp_path):
    path = _copy(t5_dir, tmp_path / "sharded")
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(path / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in keys})
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    a, b = _load(t5_dir), _load(path)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoints_convert(t5_dir, tmp_path, dtype):
    path = _copy(t5_dir, tmp_path / str(dtype))
    _edit_weights(path, lambda s: s.update({k: v.to(dtype) for k, v in s.items()}))
    model32 = _load(t5_dir)
    loaded = _load(path, torch.float32)  # stored in half precision, served in float32
    served_half = _load(t5_dir, dtype)  # stored in float32, served in half precision
    assert loaded.shared.weight.dtype == torch.float32
    assert served_half.shared.weight.dtype == dtype
    torch.testing.assert_close(loaded.shared.weight, model32.shared.weight.to(dtype).float())


def test_missing_tensor_is_named(t5_dir, tmp_path):
    path = _copy(t5_dir, tmp_path / "missing")
    name = "decoder.block.1.layer.0.SelfAttention.v.weight"
    _edit_weights(path, lambda s: s.pop(name))
    with pytest.raises(ValueError, match="missing.*" + name.replace(".", r"\.")):
        _load(path)


def test_untied_head_is_required(t5_dir, tmp_path):
    path = _copy(t5_dir, tmp_path / "nohead")
    _edit_weights(path, lambda s: s.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=r"lm_head\.weight"):
        _load(path)


def test_unexpected_tensor_is_named(t5_dir, tmp_path):
    path = _copy(t5_dir, tmp_path / "extra")
    _edit_weights(path, lambda s: s.update({"decoder.block.9.layer.0.SelfAttention.q.weight":
                                            torch.zeros(36, 48),
                                            "encoder.some_adapter.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match=r"unexpected tensor"):
        _load(path)


def test_shape_mismatch_is_named(t5_dir, tmp_path):
    path = _copy(t5_dir, tmp_path / "shape")
    name = "encoder.block.0.layer.1.DenseReluDense.wo.weight"
    _edit_weights(path, lambda s: s.update({name: torch.zeros(3, 3)}))
    with pytest.raises(ValueError, match=name.replace(".", r"\.") + ".*shape"):
        _load(path)


def test_directory_without_weights(t5_dir, tmp_path):
    path = _copy(t5_dir, tmp_path / "noweights")
    (path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no model weights"):
        _load(path)


def test_bad_model_directories(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        ModelConfig.from_path(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="no config.json"):
        ModelConfig.from_path(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported architecture"):
        ModelConfig.from_path(str(tmp_path))


def test_building_a_model_does_not_import_dynamo(tmp_path):
    """The meta-device build skips torch.nn.init (the weights come after): `normal_` on a meta
    tensor imports torch._dynamo, 1.5 s (2-8 s under load) of every CPU scheduler's start.
    Mllama too (its vision tower's nn.Embedding and nn.Conv2d), in a fresh interpreter."""
    from seq2serve.runtime.tools.demo_checkpoint import write_mllama_checkpoint

    path = write_mllama_checkpoint(tmp_path / "m")
    code = ("import sys, torch\n"
            "from seq2serve.models.loader import load_model\n"
            "from seq2serve.runtime.config.model_config import ModelConfig\n"
            f"model = load_model(ModelConfig.from_path({str(path)!r}), 'cpu', torch.float32)\n"
            "print('torch._dynamo' in sys.modules, torch.nn.init.normal_.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["False", "normal_"]  # (and torch.nn.init is itself again)
