"""The dtype a model is served in: `--dtype`, or with `auto` the device's and family's choice.

A CPU serves float32 (its GEMMs are float32's; oneDNN prepacks them). A GPU serves a float32
checkpoint in bfloat16 where it has bfloat16 (half the bytes every decode step reads), else in
float16 -- except T5/mT5/UMT5, Pegasus and T5Gemma, whose activations overflow float16 (HF
clamps T5's; the checkpoints were trained in bfloat16, Gemma's too): those stay float32 there,
and a float16 checkpoint of theirs is served in bfloat16 where possible.
"""

from __future__ import annotations

from dataclasses import dataclass

_OVERFLOWS_FLOAT16 = frozenset({"T5ForConditionalGeneration", "MT5ForConditionalGeneration",
                                "UMT5ForConditionalGeneration",
                                "PegasusForConditionalGeneration",
                                "T5GemmaForConditionalGeneration"})


@dataclass(frozen=True)
class ServingDtype:
    name: str  # "float32" | "bfloat16" | "float16"
    note: str | None  # the start-up log line when auto chose other than the checkpoint's


def serving_dtype(requested: str, checkpoint: str, architecture: str, device: str,
                  bf16_supported: bool) -> ServingDtype:
    """`bf16_supported`: the GPU's answer (torch.cuda.is_bf16_supported); unused on a CPU."""
    if requested != "auto":
        return ServingDtype(requested, None)
    if not device.startswith("cuda"):
        return ServingDtype("float32", None)
    no_float16 = architecture in _OVERFLOWS_FLOAT16
    if checkpoint == "float16" and not no_float16:
        return ServingDtype("float16", None)
    if bf16_supported:
        name = "bfloat16"
    else:
        name = "float32" if no_float16 else "float16"
    if name == checkpoint:
        return ServingDtype(name, None)
    why = ""
    if not bf16_supported and name == "float16":
        why = " (this GPU has no bfloat16)"
    elif checkpoint == "float16":
        why = " (T5's activations overflow float16)"
    return ServingDtype(name, f"serving {checkpoint} checkpoint in {name}{why}; "
                              f"pass --dtype {checkpoint} to keep it")
