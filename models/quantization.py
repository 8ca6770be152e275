"""Which layers of a loaded model get 8-bit weights, and on which devices each method runs.

Applied after loading, on the finished model (the model code knows nothing of it, except T5's
one declared exception): every `Linear` but the LM head (unless `quantize_lm_head`) gets a
`QuantizedWeight` with one scale per output channel. Embeddings, norms, the T5 relative
bias, Mllama's vision patch embedding (a convolution) and the gates stay in the model's dtype.

- `int8`: weight-only. Activations are never quantized, so no layer needs an exception. Runs
  on the CPU (PyTorch's int8-weight matmul) and on any CUDA GPU (the GEMV and the skinny GEMM
  read int8 weights; larger batches multiply the dequantized weight).
- `fp8`: E4M3 weights; GEMMs of many rows also quantize each activation row (token) with its
  own scale. T5's activations are the hard case: the input of the feed-forward output
  projection (HF's `wo`, kept in float32 by HF's `_keep_in_fp32_modules`) has outliers orders
  of magnitude above the rest of its row, which a per-token FP8 scale would flush to
  subnormals; a model lists such layers in `keep_in_model_dtype` and they stay unquantized
  with fp8. Needs compute capability 8.9+ (Ada, Hopper: FP8 tensor cores); layers whose
  sizes are not multiples of 16 (cuBLASLt's FP8 layouts) stay unquantized.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from seq2serve.models import parallel_state
from seq2serve.models.family import ModelFamily
from seq2serve.models.linear import Linear
from seq2serve.models.quantized_weight import QuantizedWeight, row_amax

logger = logging.getLogger(__name__)

METHODS = ("int8", "fp8")
FP8_MIN_CAPABILITY = (8, 9)


def check_supported(method: str | None, device: str,
                    capability: tuple[int, int] | None = None) -> None:
    """Raise ValueError naming the problem if `method` cannot run on `device` (a CUDA
    device's compute `capability` is asked for when not given)."""
    if method is None:
        return
    if method not in METHODS:
        raise ValueError(f"quantization must be one of {METHODS}, got {method!r}")
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"{method} quantization runs on cpu or cuda, not {device!r}")
    if method == "fp8":
        if kind != "cuda":
            raise ValueError("fp8 quantization needs an NVIDIA GPU of compute capability 8.9 "
                             "or newer (Ada, Hopper); on the CPU use --quantization int8")
        if capability is None:
            capability = torch.cuda.get_device_capability(torch.device(device))
        if tuple(capability) < FP8_MIN_CAPABILITY:
            raise ValueError(
                f"fp8 quantization needs compute capability 8.9 or newer (FP8 tensor cores: "
                f"Ada, Hopper); this GPU is sm_{capability[0]}{capability[1]}: use "
                f"--quantization int8 (weight-only) instead")


def quantizable(name: str, layer: Linear, method: str, quantize_lm_head: bool,
                keep: tuple[str, ...]) -> bool:
    """Whether the Linear at `name` gets an 8-bit weight."""
    if isinstance(layer.weight, QuantizedWeight):
        return False  # already (an FP8 checkpoint's)
    if name == "lm_head" or name.endswith(".lm_head"):
        if not quantize_lm_head:
            return False
    elif method == "fp8" and any(name.endswith(k) for k in keep):
        return False
    if method == "fp8":
        n, k = layer.weight.shape
        if n % 16 or k % 16:
            logger.info("%s [%d, %d] stays unquantized (fp8 needs multiples of 16)", name, n, k)
            return False
    return True


@torch.no_grad()
def quantize_model(model: ModelFamily, method: str, quantize_lm_head: bool = False) -> int:
    """Replace the weights of `model`'s Linear layers with 8-bit ones, in place, one layer at
    a time (the float weight is freed as each is replaced). Returns how many were."""
    if method not in METHODS:
        raise ValueError(f"quantization must be one of {METHODS}, got {method!r}")
    keep = model.keep_in_model_dtype
    count = 0
    for name, layer in list(model.named_modules()):
        if not isinstance(layer, Linear) or not quantizable(name, layer, method,
                                                            quantize_lm_head, keep):
            continue
        amax = None
        if layer.tp_dims.get("weight") == 1:  # a row-parallel shard: the whole rows' scales
            amax = parallel_state.all_reduce_max(row_amax(layer.weight.data))
        quantized = QuantizedWeight.from_float(layer.weight.data, method, layer.shard_sizes,
                                               amax)
        del layer.weight  # a tied weight stays the embedding's
        layer.weight = quantized
        count += 1
    logger.info("%s: %d linear layers quantized", method, count)
    return count


def dequantize_model(model: nn.Module) -> int:
    """Every QuantizedWeight back to a float weight in the model's dtype (an FP8 checkpoint
    served unquantized, or as int8). Returns how many were."""
    count = 0
    for layer in model.modules():
        if isinstance(layer, Linear) and isinstance(layer.weight, QuantizedWeight):
            w = layer.weight.dequantize()
            del layer.weight
            layer.weight = nn.Parameter(w, requires_grad=False)
            count += 1
    return count
