"""Architecture name (config.json "architectures") -> model class, imported lazily."""

from __future__ import annotations

import importlib

from seq2serve.models.family import ModelFamily

_MODELS: dict[str, tuple[str, str]] = {
    "T5ForConditionalGeneration": ("seq2serve.models.mt5.model", "T5ForConditionalGeneration"),
    "MT5ForConditionalGeneration": ("seq2serve.models.mt5.model", "T5ForConditionalGeneration"),
    "UMT5ForConditionalGeneration": ("seq2serve.models.mt5.model", "T5ForConditionalGeneration"),
    "LlamaForCausalLM": ("seq2serve.models.llama.model", "LlamaForCausalLM"),
    "MllamaForConditionalGeneration": ("seq2serve.models.mllama.model",
                                       "MllamaForConditionalGeneration"),
    "BartForConditionalGeneration": ("seq2serve.models.bart.model",
                                     "BartForConditionalGeneration"),
    "MarianMTModel": ("seq2serve.models.bart.model", "BartForConditionalGeneration"),
    "M2M100ForConditionalGeneration": ("seq2serve.models.bart.model",
                                       "BartForConditionalGeneration"),
    "MBartForConditionalGeneration": ("seq2serve.models.bart.model",
                                      "BartForConditionalGeneration"),
    "PegasusForConditionalGeneration": ("seq2serve.models.bart.model",
                                        "BartForConditionalGeneration"),
    "WhisperForConditionalGeneration": ("seq2serve.models.whisper.model",
                                        "WhisperForConditionalGeneration"),
    "T5GemmaForConditionalGeneration": ("seq2serve.models.t5gemma.model",
                                        "T5GemmaForConditionalGeneration"),
    "Florence2ForConditionalGeneration": ("seq2serve.models.florence2.model",
                                          "Florence2ForConditionalGeneration"),
}

# model_type -> architecture, for configs written without "architectures"
_MODEL_TYPES = {"t5": "T5ForConditionalGeneration", "mt5": "MT5ForConditionalGeneration",
                "umt5": "UMT5ForConditionalGeneration",
                "llama": "LlamaForCausalLM", "mllama": "MllamaForConditionalGeneration",
                "bart": "BartForConditionalGeneration", "marian": "MarianMTModel",
                "m2m_100": "M2M100ForConditionalGeneration",
                "mbart": "MBartForConditionalGeneration",
                "pegasus": "PegasusForConditionalGeneration",
                "whisper": "WhisperForConditionalGeneration",
                "t5gemma": "T5GemmaForConditionalGeneration",
                "florence2": "Florence2ForConditionalGeneration"}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def architecture_of(hf_config: dict) -> str:
    archs = hf_config.get("architectures") or []
    for arch in archs:
        if arch in _MODELS:
            return arch
    model_type = hf_config.get("model_type")
    if not archs and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    raise ValueError(
        f"unsupported architecture {archs or model_type!r}; "
        f"supported: {', '.join(supported_architectures())}"
    )


def model_class(architecture: str) -> type[ModelFamily]:
    module_name, class_name = _MODELS[architecture]
    cls = getattr(importlib.import_module(module_name), class_name)
    if not issubclass(cls, ModelFamily):
        raise TypeError(f"{module_name}.{class_name} is not a ModelFamily (models/family.py)")
    return cls
