"""Attention backends, created by name with lazy imports."""

from __future__ import annotations

import importlib

from seq2serve.runtime.attention.base import AttentionBackend, AttentionKind

_BACKENDS = {
    "torch_native": ("seq2serve.runtime.attention.torch_native", "TorchNativeBackend"),
    "torch_batched": ("seq2serve.runtime.attention.torch_batched", "TorchBatchedBackend"),
    "triton": ("seq2serve.runtime.attention.triton_backend", "TritonBackend"),
}


def create_backend(name: str, **kwargs) -> AttentionBackend:
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {sorted(_BACKENDS)}")
    module_name, class_name = _BACKENDS[name]
    return getattr(importlib.import_module(module_name), class_name)(**kwargs)


__all__ = ["AttentionBackend", "AttentionKind", "create_backend"]
