"""Build a model on the meta device and fill it from a local Hugging Face safetensors directory
(single file or sharded with model.safetensors.index.json). Every parameter must be filled and
every tensor must be known: either mismatch is an error naming the tensor. Linear weights may
be quantized after loading (models/quantization.py) or come quantized (FP8 checkpoints,
models/fp8_checkpoint.py)."""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from seq2serve.models import fp8_checkpoint, parallel_state, registry
from seq2serve.models.cpu_ops import OneDnnOps, onednn_available
from seq2serve.models.family import ModelFamily
from seq2serve.models.ops import REFERENCE, TorchOps, TritonOps, use_ops
from seq2serve.models.quantization import check_supported, dequantize_model, quantize_model

logger = logging.getLogger(__name__)


def checkpoint_files(model_dir: str) -> list[str]:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted(set(weight_map.values()))
        if not files:
            raise ValueError(f"{index} has an empty weight_map")
        for name in files:
            if not os.path.isfile(os.path.join(model_dir, name)):
                raise ValueError(f"{index} names shard {name!r}, which is not in {model_dir}")
        return [os.path.join(model_dir, name) for name in files]
    if os.path.isfile(single):
        return [single]
    hint = " (only safetensors checkpoints are supported)" if any(
        f.endswith((".bin", ".pt", ".gguf")) for f in os.listdir(model_dir)) else ""
    raise ValueError(
        f"no model weights in {model_dir}: expected model.safetensors or "
        f"model.safetensors.index.json{hint}"
    )


_INITS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_",
          "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_")


@contextmanager
def meta_device():
    """`torch.device("meta")` with torch.nn.init's functions skipped: the weights are loaded
    (or made random) after, and `normal_` on a meta tensor imports torch._dynamo, which took
    2-8 s at every CPU process's start (nn.Embedding, nn.Conv2d initialize themselves)."""
    saved = {name: getattr(nn.init, name) for name in _INITS}
    try:
        for name in _INITS:
            setattr(nn.init, name, _unchanged)
        with torch.device("meta"):
            yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _unchanged(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return tensor


def check_tensor_parallel(model_config, size: int) -> None:
    """A ValueError naming the problem if the model cannot be split over `size` ranks: its
    family has no parallel layers, or `size` does not divide a count it splits (heads,
    key/value heads, feed-forward channels). The layers themselves say: the model is built on
    the meta device as rank 0 would build it."""
    if size == 1:
        return
    cls = registry.model_class(model_config.architecture)
    if not cls.tensor_parallel:
        raise ValueError(f"tp_size {size}: tensor parallelism is not built for "
                         f"{model_config.architecture} (T5/mT5, Llama, Mllama, Whisper, "
                         "T5Gemma, the BART family and Florence-2 have it)")
    if fp8_checkpoint.check_config(model_config.model_path):
        raise ValueError(f"tp_size {size}: FP8 checkpoints are served on one rank only "
                         "(--quantization fp8 quantizes each rank's shard of a 16-bit one)")
    before = parallel_state.tensor_parallel()
    parallel_state.set_tensor_parallel(0, size)
    try:
        with meta_device():
            cls(model_config.arch)
    finally:
        parallel_state.set_tensor_parallel(before.rank, before.size, before.group,
                                           before.cpu_group)


def ops_for(device: str | torch.device, dtype: torch.dtype,
            int8_activations: bool = False) -> TorchOps:
    """The Triton kernels on CUDA; on a CPU in float32, PyTorch with the weights prepacked for
    oneDNN (SEQ2SERVE_CPU_ONEDNN=0: the plain reference, for measuring); PyTorch elsewhere.
    `int8_activations` (int8 weights' products in int8, CPU float32 only) or a ValueError."""
    kind = torch.device(device).type
    onednn = (kind == "cpu" and dtype == torch.float32 and onednn_available()
              and os.environ.get("SEQ2SERVE_CPU_ONEDNN", "1") != "0")
    if int8_activations and not onednn:
        raise ValueError(f"int8 activations run on the CPU in float32 (with oneDNN), not on "
                         f"{device} in {dtype}; drop --int8-activations")
    if kind == "cuda":
        return TritonOps()
    return OneDnnOps(int8_activations) if onednn else REFERENCE


def load_model(model_config, device: str, dtype: torch.dtype,
               load_format: str = "safetensors", ops: TorchOps | None = None,
               quantization: str | None = None, quantize_lm_head: bool = False,
               int8_activations: bool = False) -> ModelFamily:
    """Build the model and fill it: from the checkpoint, or with random values of sane scale
    (load_format "dummy": benchmarks of real shapes without weights on disk). Its layers
    compute through `ops` (models/ops.py), by default the device's: chosen here, once, and
    warmed for the model's weight shapes. `quantization` ("int8", "fp8") turns the linear
    layers' weights 8-bit after loading (ValueError where the device cannot run it). An FP8
    checkpoint stays FP8 where the device runs fp8 (unless int8 is asked for), else is
    dequantized to `dtype`. `int8_activations`: int8 weights multiply int8 activations (one
    scale per token) on the CPU (models/cpu_ops.py)."""
    check_supported(quantization, device)
    if int8_activations and quantization != "int8":
        raise ValueError("int8 activations go with --quantization int8")
    cls = registry.model_class(model_config.architecture)
    if load_format == "safetensors":
        files = checkpoint_files(model_config.model_path)  # fail before allocating anything
    elif load_format != "dummy":
        raise ValueError(f"load_format must be 'safetensors' or 'dummy', got {load_format!r}")
    with meta_device():
        model = cls(model_config.arch)
    model = model.to(dtype=dtype).to_empty(device=device)
    if load_format == "dummy":
        _random_weights(model)
    else:
        quantization = _load_checkpoint(model, model_config.model_path, files, device, dtype,
                                        quantization)
    if quantization is not None:
        quantize_model(model, quantization, quantize_lm_head)
    model.init_buffers()  # buffers derived from the config, not the checkpoint
    ops = ops if ops is not None else ops_for(device, dtype, int8_activations)
    use_ops(model, ops)
    # kernels tuned for its weight shapes now, not at a request
    ops.warm(model, model.keep_in_model_dtype)
    return model.eval()


def _load_checkpoint(model: nn.Module, model_dir: str, files: list[str], device: str,
                     dtype: torch.dtype, quantization: str | None) -> str | None:
    """Fill `model` from `files`, FP8 layers as they are stored; returns the quantization
    still to apply."""
    fp8_format = fp8_checkpoint.check_config(model_dir)
    if fp8_format:
        layers = fp8_checkpoint.prepare(model, fp8_checkpoint.fp8_weights(files), dtype)
        logger.info("%s checkpoint: %d FP8 linear layers", fp8_format, layers)
    load_weights(model, files)
    if fp8_format and quantization != "fp8":
        try:
            check_supported("fp8", device)
            if quantization is None:
                return None  # served as stored, nothing else quantized
        except ValueError as e:
            if quantization is None:
                logger.warning("FP8 checkpoint dequantized to %s: %s", dtype, e)
        dequantize_model(model)
    return quantization


def load_weights(model: ModelFamily, files: list[str]) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    shard_sizes = {name: _shard_sizes(model, name) for name in params}
    tp_dims = {name: _tp_dim(model, name) for name in params}
    expected = {(name, s) for name in params
                for s in (range(len(shard_sizes[name])) if shard_sizes[name] else [None])}
    # parts no checkpoint has, which the model fills itself (Whisper: its fused attention
    # biases' key part, zero in `init_buffers`)
    expected -= set(model.absent_shards())
    loaded: set[tuple[str, int | None]] = set()
    source: dict[tuple[str, int | None], str] = {}
    for path in files:
        with safe_open(path, framework="pt", device="cpu") as f:
            # a model may need some tensors loaded before others (a fallback the more
            # specific tensors overwrite)
            names = sorted(f.keys(), key=model.load_priority)
            for name in tqdm(names, desc=f"Loading {os.path.basename(path)}", unit="tensor",
                             leave=False, disable=None):
                targets = fp8_checkpoint.targets(model, name, params)
                if targets is None:
                    raise ValueError(f"unexpected tensor {name!r} in {path}")
                tensor = model.convert_tensor(name, f.get_tensor(name))
                for pname, shard in targets:
                    if pname not in params:
                        raise ValueError(
                            f"unexpected tensor {name!r} in {path}: this configuration has no "
                            f"such layer (config.json and weights disagree?)"
                        )
                    _copy(params[pname], shard_sizes[pname], tensor, shard, name,
                          tp_dims[pname])
                    loaded.add((pname, shard))
                    source[(pname, shard)] = name
    missing = expected - loaded
    still = model.tie_missing({pname for pname, _ in missing})
    missing = {pair for pair in missing if pair[0] in still}
    if missing:
        names = _checkpoint_names_for(model, missing)
        raise ValueError(f"checkpoint is missing tensor(s): {', '.join(sorted(names)[:10])}"
                         + (" ..." if len(names) > 10 else ""))
    logger.info("loaded %d tensors from %d file(s)", len(source), len(files))


@torch.no_grad()
def _random_weights(model: nn.Module, seed: int = 0) -> None:
    """Norm weights 1, biases 0, gates 0.5, matrices ~ N(0, 1/fan_in): bounded activations."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if "norm" in name and leaf == "weight" and p.dim() == 1:
            p.fill_(1.0)
        elif leaf == "bias":
            p.zero_()
        elif "gate" in leaf and p.numel() == 1:
            p.fill_(0.5)
        else:
            fan_in = p[0].numel() if p.dim() > 1 else p.numel()
            p.normal_(0.0, fan_in**-0.5, generator=g)


def _shard_sizes(model: nn.Module, param_name: str) -> list[int] | None:
    """Row counts of the checkpoint tensors fused into this parameter (None: just one)."""
    module_name = param_name.rpartition(".")[0]
    return getattr(model.get_submodule(module_name), "shard_sizes", None)


def _tp_dim(model: nn.Module, param_name: str) -> int | None:
    """The dimension of this parameter that is this rank's slice of the checkpoint tensor
    (tensor parallelism, models/linear.py), or None: the whole tensor."""
    module_name, _, leaf = param_name.rpartition(".")
    return getattr(model.get_submodule(module_name), "tp_dims", {}).get(leaf)


def _copy(param: torch.Tensor, sizes: list[int] | None, tensor: torch.Tensor,
          shard: int | None, name: str, tp_dim: int | None = None) -> None:
    if shard is None:
        dst = param.data
    else:
        dst = param.data.narrow(0, sum(sizes[:shard]), sizes[shard])
    if tp_dim is not None:  # this rank's slice; past the tensor's end (a padded vocabulary): 0
        per_rank = dst.shape[tp_dim]
        start = parallel_state.tensor_parallel().rank * per_rank
        have = max(0, min(per_rank, tensor.shape[tp_dim] - start))
        if have < per_rank:
            dst.zero_()
            dst = dst.narrow(tp_dim, 0, have)
        tensor = tensor.narrow(tp_dim, min(start, tensor.shape[tp_dim]), have)
    if name.endswith(fp8_checkpoint.SCALE):  # one per row, or one per tensor repeated
        tensor = fp8_checkpoint.fit_scale(tensor, dst.shape[0])
    if tuple(tensor.shape) != tuple(dst.shape):
        raise ValueError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}, the model expects "
            f"{tuple(dst.shape)} (does config.json match the weights?)"
        )
    dst.copy_(tensor)


def _checkpoint_names_for(model: nn.Module, missing: set[tuple[str, int | None]]) -> list[str]:
    """The checkpoint tensor names that would fill the `missing` (param, shard) pairs."""
    from importlib import import_module

    weights = import_module(type(model).__module__.rsplit(".", 1)[0] + ".weights")
    names = []
    for name in weights.checkpoint_names(model.cfg):
        if any(pair in missing for pair in (model.weight_map(name) or [])):
            names.append(name)
    return names or sorted(f"{p}[{s}]" for p, s in missing)
