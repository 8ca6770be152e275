"""The ops front end (models/ops.py): chosen once per model at load, and the Triton ops (here
interpreted on the CPU) decode as the PyTorch reference does: batch 1 through the GEMVs with
the norm or the gated activation in their prologue, larger batches through the norm and
activation kernels and a GEMM."""

from __future__ import annotations

import pytest
import torch

from seq2serve.models.cpu_ops import OneDnnOps
from seq2serve.models.loader import load_model
from seq2serve.models.ops import REFERENCE, TorchOps, TritonOps, use_ops
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.tests.helpers import make_scheduler, request, run_to_completion

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (CPU)")


def _ops_of(model) -> set:
    return {m.ops for m in model.modules() if isinstance(getattr(type(m), "ops", None), TorchOps)}


def test_load_model_sets_the_ops_of_every_layer_once(t5_dir):
    config = ModelConfig.from_path(t5_dir)
    cpu = _ops_of(load_model(config, "cpu", torch.float32))
    assert len(cpu) == 1 and type(next(iter(cpu))) is OneDnnOps  # float32 on a CPU
    assert _ops_of(load_model(config, "cpu", torch.bfloat16)) == {REFERENCE}
    triton = TritonOps(gemv_max_m=2)
    model = load_model(config, "cpu", torch.float32, ops=triton)
    assert _ops_of(model) == {triton}
    # norms, projections, the gated MLPs and the LM head alike
    assert {type(m).__name__ for m in model.modules() if getattr(m, "ops", None) is triton} \
        >= {"RMSNorm", "LMHead", "GatedMLP"}


def test_loading_warms_the_small_row_kernels_for_every_weight_shape(t5_dir, monkeypatch):
    """A new shape's autotuning takes a second on a GPU: done at load, not at a request."""
    from seq2serve.runtime.kernels import triton_gemv, triton_skinny

    calls = []
    for module, name in [(triton_gemv, "gemv"), (triton_skinny, "skinny_gemm")]:
        # recorded, not run (the interpreted kernels took a minute; their results are
        # checked against the reference in the tests above)
        monkeypatch.setattr(module, name, lambda x, w, *a, **k: (
            calls.append((x.shape[0], tuple(w.shape))), x.new_zeros(x.shape[0], w.shape[0]))[1])
    config = ModelConfig.from_path(t5_dir)
    model = load_model(config, "cpu", torch.float32, ops=TritonOps(gemv_blocks=(16, 16)))
    from seq2serve.models.linear import Linear

    shapes = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, Linear)}
    assert {s for rows, s in calls if rows == 1} == shapes  # the GEMV
    assert {s for rows, s in calls if rows == 2} == shapes  # the skinny GEMM
    assert len(calls) == 2 * len(shapes)  # each shape once


def test_gemv_rows_follow_the_environment(monkeypatch):
    monkeypatch.setenv("SEQ2SERVE_GEMV_MAX_M", "0")
    assert TritonOps().gemv_max_m == 0
    monkeypatch.setenv("SEQ2SERVE_GEMV_MAX_M", "3")
    assert TritonOps().gemv_max_m == 3
    monkeypatch.setenv("SEQ2SERVE_SKINNY_MAX_M", "0")
    assert TritonOps().skinny_max_m == 0
    monkeypatch.setenv("SEQ2SERVE_SKINNY_MAX_M", "64")  # no more than the kernel takes
    assert TritonOps().skinny_max_m == 16


def _greedy(path: str, ops: TorchOps | None, prompts: list[tuple[list[int], list[int]]]):
    sched = make_scheduler(path, attention_backend="triton")
    if ops is not None:
        use_ops(sched.worker.model_runner.model, ops)
    for i, (enc, dec) in enumerate(prompts):  # together: batched decode
        sched.add_request(request(f"b{i}", enc, dec, max_new_tokens=4, ignore_eos=True))
    out = run_to_completion(sched)
    sched.add_request(request("alone", *prompts[0], max_new_tokens=4, ignore_eos=True))
    return {**out, **run_to_completion(sched)}  # batch 1: the GEMVs


@pytest.mark.parametrize("family", ["t5", "llama", "marian"])
def test_triton_ops_decode_as_the_reference(t5_dir, tmp_path, family):
    if family == "t5":
        path, prompts = t5_dir, [([5, 6, 7, 8], [0]), ([9, 10, 11], [0, 4])]
    elif family == "marian":  # biased linears (GEMV and skinny GEMM), LayerNorm, post-norm
        from seq2serve.tests.bart_checkpoints import write_bart_checkpoint

        path = str(write_bart_checkpoint("marian", tmp_path / "marian"))
        pad = ModelConfig.from_path(path).arch.pad_token_id
        prompts = [([5, 6, 7, 8, 0], [pad]), ([9, 10, 11, 0], [pad, 4])]
    else:
        from seq2serve.runtime.tools.demo_checkpoint import write_llama_checkpoint

        path = str(write_llama_checkpoint(tmp_path / "llama", init_scale=10.0, seed=1))
        prompts = [([], [1, 50, 51, 52]), ([], [1, 60, 61])]
    triton = _greedy(path, TritonOps(gemv_blocks=(1024, 64)), prompts)
    assert triton == _greedy(path, None, prompts)
