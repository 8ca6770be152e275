"""seq2serve: a serving runtime for encoder-decoder and cross-attention models."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Seq2SeqEngine", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # imported lazily so that `import seq2serve` stays light (no torch until needed)
    if name == "Seq2SeqEngine":
        from seq2serve.runtime.frontend.engine import Seq2SeqEngine

        return Seq2SeqEngine
    if name == "SamplingParams":
        from seq2serve.runtime.config.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'seq2serve' has no attribute {name!r}")
