"""Every Triton kernel launch the runtime makes compiles for Hopper (sm_90) and Ampere (sm_80)
with activations and pools in bfloat16, float16 and float32 -- on the CPU, without a GPU.

The interpreter that runs the CPU suite executes only the branches a launch takes, so a kernel
that cannot compile for a GPU (an atomic handed a bf16 buffer in a branch the CPU never takes)
passes every CPU test and crashes the GPU server. Here a tour drives the runtime's kernels in
each dtype under the interpreter -- T5, Llama, Mllama and T5Gemma (sliding windows, soft-capped
scores) through the scheduler with the Triton backend, the CUDA-only fused ops directly,
decode and beam-group cross-attention decode with and without split-KV, the beam step's page
copies, the sampler's top-p threshold, beam candidates and beam rules -- recording each launch, and
`kernel_launches.compile_launches` compiles every one (every autotuner config, and with
programmatic dependent launch on sm_90) with Triton's GPU compiler.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import defaultdict

import pytest
import torch

from seq2serve.tests.kernel_launches import compile_launches, record_launches

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="records launches from Triton's interpreter (CPU runs)")

DTYPES = ("float32", "bfloat16", "float16")


def _t5_tour(path: str, dtype: str) -> None:
    from seq2serve.tests.helpers import make_scheduler, request, run_to_completion

    sched = make_scheduler(path, attention_backend="triton", dtype=dtype, page_size=4)
    long_source = list(range(100, 240))  # > 128 keys: split-KV cross-attention decode
    sched.add_request(request("long", long_source, max_new_tokens=3, ignore_eos=True))
    sched.add_request(request("prompted", [5, 6, 7, 8, 9], [0, 37, 5, 12, 7, 9],
                              max_new_tokens=3, ignore_eos=True))
    run_to_completion(sched)
    # again: the encoder output and a decoder prefix from the caches, the rest extended
    sched.add_request(request("cached", [5, 6, 7, 8, 9], [0, 37, 5, 12, 7, 9, 4, 11, 3],
                              max_new_tokens=2, ignore_eos=True))
    run_to_completion(sched)


def _llama_tour(path: str, dtype: str) -> None:
    from seq2serve.tests.helpers import make_scheduler, request, run_to_completion

    sched = make_scheduler(path, attention_backend="triton", dtype=dtype, page_size=4)
    sched.add_request(request("a", [], list(range(100, 113)), max_new_tokens=3,
                              ignore_eos=True))
    sched.add_request(request("b", [], list(range(300, 440)), max_new_tokens=2,
                              ignore_eos=True))
    run_to_completion(sched)
    sched.add_request(request("c", [], list(range(100, 113)) + [7, 8], max_new_tokens=2,
                              ignore_eos=True))
    run_to_completion(sched)


def _mllama_tour(path: str, dtype: str) -> None:
    from seq2serve.encoders.encoder_input import cross_spans
    from seq2serve.encoders.image_processor import ImageProcessor
    from seq2serve.runtime.config.sampling_params import SamplingParams
    from seq2serve.runtime.messages.io_struct import TokenizedRequest
    from seq2serve.tests.helpers import make_scheduler, run_to_completion
    from seq2serve.tests.mllama_oracle import random_image

    sched = make_scheduler(path, attention_backend="triton", dtype=dtype)
    arch = sched.model_config.arch
    proc = ImageProcessor(path, "m", arch.vision.num_patches)
    imgs = [proc(str(i).encode(), lambda i=i, s=s: random_image(i, *s))
            for i, s in enumerate([(40, 90), (100, 50)])]
    image = arch.image_token_id
    sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 3, "ignore_eos": True})
    for rid, ids, features in [("text-then-image", [1, 50, 51, image, 52, 53], imgs[:1]),
                               ("two-images", [image, image, 1, 60, 61, 62], imgs),
                               ("text-only", [1, 70, 71, 72], [])]:
        sched.add_request(TokenizedRequest(rid, [], ids, sp, encoder_inputs=features,
                                           cross_spans=cross_spans(
                                               ids, image, [f.num_tokens for f in features])))
    run_to_completion(sched)


def _t5gemma_tour(path: str, dtype: str) -> None:
    """T5Gemma at its released head size (256): sliding windows in the encoder, extend and
    decode kernels, soft-capped scores in those and the cross-attention kernels (2 beams: the
    beam-group kernel too)."""
    from seq2serve.tests.helpers import make_scheduler, request, run_to_completion

    sched = make_scheduler(path, attention_backend="triton", dtype=dtype, page_size=4)
    sched.add_request(request("long", list(range(100, 240)), [2, 7, 8, 9, 10, 11],
                              max_new_tokens=3, ignore_eos=True))
    sched.add_request(request("beams", [5, 6, 7, 8, 9], [2], max_new_tokens=3,
                              ignore_eos=True, num_beams=2))
    run_to_completion(sched)


def _decode_tour(dtype: torch.dtype) -> None:
    """Decode attention as the CUDA graphs launch it: a split count fixed per captured batch
    (1, or several with a merge), with and without the T5 bias and per-request key starts, at
    the head sizes of the real shapes (64: T5; 128 with grouped heads: Llama, Mllama)."""
    from seq2serve.models.mt5.relative_position import RelativePositionBias
    from seq2serve.runtime.kernels.triton_decode import paged_decode_attention

    for heads, kv_heads, dim in [(4, 4, 64), (8, 2, 128)]:
        q = torch.randn(2, heads, dim).to(dtype)
        k, v = (torch.randn(256, kv_heads, dim).to(dtype) for _ in range(2))
        table = torch.randperm(256, dtype=torch.int32).view(2, 128)
        rows, ends = torch.tensor([1, 0], dtype=torch.int32), torch.tensor([7, 100],
                                                                             dtype=torch.int32)
        bias = RelativePositionBias(32, 128, heads, bidirectional=False).to(dtype)
        for splits in (1, 3):
            paged_decode_attention(q, k, v, table, rows, ends, splits, 0.125, bias=bias)
            paged_decode_attention(q, k, v, table, rows, ends, splits, 0.125,
                                   kv_starts=torch.tensor([2, 0], dtype=torch.int32))


def _beam_cross_tour(dtype: torch.dtype) -> None:
    """The beam-group decode cross-attention kernel (the Triton backend's decode
    cross-attention with beam groups, and in every CUDA graph of an encoder-decoder model):
    mT5's 16 heads x 64 in 4-beam groups (a 16-row tile), and 8 beams x GQA 8 at head size 128
    (tiles of 16 x 128), one split and several, with and without per-row key starts."""
    from seq2serve.cross_attention.triton_beam_cross_attention import (
        beam_cross_attention_decode,
    )

    for heads, kv_heads, dim, beams in [(16, 16, 64, [4, 1]), (16, 2, 128, [8, 3])]:
        rows = sum(beams)
        q = torch.randn(rows, heads, dim).to(dtype)
        k, v = (torch.randn(256, kv_heads, dim).to(dtype) for _ in range(2))
        table = torch.randperm(256, dtype=torch.int32).view(2, 128)
        group_rows = torch.tensor([1, 0], dtype=torch.int32)
        group_starts = torch.tensor([0, beams[0], rows], dtype=torch.int32)
        ends = torch.tensor([100] * beams[0] + [7] * beams[1], dtype=torch.int32)
        for splits in (1, 3):
            beam_cross_attention_decode(q, k, v, table, group_rows, group_starts, ends, 0.125,
                                        num_splits=splits)
            beam_cross_attention_decode(q, k, v, table, group_rows, group_starts, ends, 0.125,
                                        kv_starts=torch.full_like(ends, 2), num_splits=splits)


def _beam_copy_tour(dtype: torch.dtype) -> None:
    """The beam step's last-page copies (`move_pages` on CUDA): mT5's 16 KV heads x 64 in
    groups of 4 beams and 1 (a 4 x 1024 tile), and 16 beams (16 x 256, four chunks a row)."""
    from seq2serve.runtime.kernels.triton_beam_copy import beam_copy

    table = torch.arange(64, dtype=torch.int32).view(4, 16)
    for beams in ([4, 1], [16]):
        rows = sum(beams)
        k, v = (torch.randn(2, 64, 16, 64).to(dtype) for _ in range(2))
        starts = torch.tensor([0, *itertools.accumulate(beams)])
        parents = torch.cat([torch.randperm(b) + s for b, s in zip(beams, starts.tolist())])
        beam_copy(k, v, table, torch.arange(rows) % 4, parents, torch.full((rows,), 4),
                  torch.full((rows,), 3), starts, max(beams))


def _fused_ops_tour(dtype: torch.dtype) -> None:
    """The ops the models use only on CUDA (norms, gated activations, the one-row GEMVs, the
    skinny GEMMs, the KV store), at the widths of the real shapes."""
    from seq2serve.runtime.kernels.activations import ACTIVATIONS
    from seq2serve.runtime.kernels.triton_gemv import MAX_M, gated_gemv, gemv, norm_gemv
    from seq2serve.runtime.kernels.triton_kv_store import store_kv
    from seq2serve.runtime.kernels.triton_ops import gated_activation, rmsnorm

    for n in (1024, 2048, 4096):
        x, res, w = (torch.randn(2, n).to(dtype) for _ in range(3))
        rmsnorm(x, w[0], 1e-6)
        rmsnorm(x, w[0], 1e-6, residual=res)
    for act in ACTIVATIONS:
        gated_activation(torch.randn(2, 64).to(dtype), act)
    for heads, dim in [(16, 64), (8, 128)]:
        k, v = (torch.randn(3, heads, dim).to(dtype) for _ in range(2))
        k_buf, v_buf = (torch.zeros(16, heads, dim, dtype=dtype) for _ in range(2))
        store_kv(k_buf, v_buf, torch.tensor([3, 9, 1]), k, v)
    blocks = dict(block_n=8, block_k=64)
    w, b, norm_w = (torch.randn(*shape).to(dtype) for shape in [(32, 64), (32,), (64,)])
    for m in (1, MAX_M):
        gemv(torch.randn(m, 64).to(dtype), w, **blocks)
    x, res = torch.randn(1, 64).to(dtype), torch.randn(1, 64).to(dtype)  # batch 1: fused
    gemv(x, w, b, **blocks)
    norm_gemv(x, norm_w, 1e-6, w, **blocks)
    norm_gemv(x, norm_w, 1e-6, w, None, res, **blocks)
    x, res, norm_w = (torch.randn(*shape).to(dtype) for shape in [(MAX_M, 4096)] * 2 + [(4096,)])
    norm_gemv(x, norm_w, 1e-6, torch.randn(8, 4096).to(dtype), None, res, **blocks)  # whole rows
    from seq2serve.runtime.kernels.triton_skinny import MAX_M as SKINNY_M
    from seq2serve.runtime.kernels.triton_skinny import skinny_gemm

    for m in (2, SKINNY_M):  # batches of 2-16: the tensor-core skinny GEMM
        skinny_gemm(torch.randn(m, 64).to(dtype), w, block_n=16, block_k=32)
        skinny_gemm(torch.randn(m, 64).to(dtype), w, b, block_n=16, block_k=32)
    for act in ("silu", "gelu_new"):
        gated_gemv(torch.randn(1, 128).to(dtype), act, w, **blocks)
    _quantized_tour(dtype)


def _quantized_tour(dtype: torch.dtype) -> None:
    """The GEMV (plain, norm and gated prologues) and the skinny GEMM with int8 and FP8
    weights and their per-channel scales (--quantization)."""
    from seq2serve.models.quantized_weight import quantize_rows
    from seq2serve.runtime.kernels.triton_gemv import gated_gemv, gemv, norm_gemv
    from seq2serve.runtime.kernels.triton_skinny import skinny_gemm

    blocks = dict(block_n=8, block_k=64)
    for method in ("int8", "fp8"):
        q, scale = quantize_rows(torch.randn(32, 64), method)
        x, res, b, norm_w = (torch.randn(*s).to(dtype) for s in [(1, 64), (1, 64), (32,), (64,)])
        gemv(x, q, b, w_scale=scale, **blocks)
        norm_gemv(x, norm_w, 1e-6, q, None, res, w_scale=scale, **blocks)
        gated_gemv(torch.randn(1, 128).to(dtype), "silu", q, w_scale=scale, **blocks)
        skinny_gemm(torch.randn(4, 64).to(dtype), q, b, block_n=16, block_k=32, w_scale=scale)
    from seq2serve.runtime.kernels.triton_fp8_quant import gated_quantize, norm_quantize, quantize

    for n in (1024, 14336):  # activations quantized per token, whole rows (FP8 past 16 rows)
        x, res, norm_w = (torch.randn(*s).to(dtype) for s in [(17, n), (17, n), (n,)])
        quantize(x)
        norm_quantize(x, norm_w, 1e-6)
        norm_quantize(x, norm_w, 1e-6, res)
        gated_quantize(torch.cat([x, res], dim=1), "gelu_new")


def _top_p_tour(dtype: torch.dtype) -> None:
    """The sampler's top-p / top-k / min-p threshold (CUDA's filter where some filtering row
    has no top_k), with each set of rules: float32 probabilities in the sampler, each dtype
    here (the kernel reads them as float32)."""
    from seq2serve.runtime.kernels.triton_top_p import top_p_threshold

    probs = torch.softmax(torch.randn(3, 3000), -1).to(dtype)
    top_ps, min_ps = torch.tensor([0.9, 1.0, 0.5]), torch.tensor([0.0, 0.1, 0.05])
    top_p_threshold(probs, top_ps)
    top_p_threshold(probs, top_ps, torch.tensor([3000, 20, 3000]), min_ps)
    top_p_threshold(probs, None, None, min_ps)


def _race_tour(dtype: torch.dtype) -> None:
    """The sampler's race on CUDA (every sampled batch), on Llama 3's vocabulary's blocks:
    float32 probabilities in the sampler, each dtype here (the kernel reads them as
    float32)."""
    from seq2serve.runtime.executor.seeded_race import block_size
    from seq2serve.runtime.kernels.triton_race import race_kernel

    probs = torch.softmax(torch.randn(2, 3000), -1).to(dtype)
    race_kernel(probs, torch.tensor([5, 1 << 31]), block_size(128256))


def _beam_topk_tour(dtype: torch.dtype) -> None:
    """The beam candidates from the logits (the CUDA sampler's beam rows): mT5's chunk of
    8,192 tokens over a vocabulary that ends in a partial chunk, with and without suppressed
    tokens, keep 8 (4 beams) and 16."""
    from seq2serve.runtime.kernels.triton_beam_topk import beam_topk

    logits, scores = torch.randn(5, 9000).to(dtype), torch.randn(5, 1)
    beam_topk(logits, scores, [(1, 1, 8), (1, 4, 8)], argmax=True)
    beam_topk(logits, scores, [(1, 5, 16)], torch.tensor([0, 3]))


def _beam_rules_tour(dtype: torch.dtype) -> None:
    """HF's beam rules a bucket at a launch (the CUDA sampler's beam steps): 4 beams with one
    stop id (keep 8), writing the rows' next step, and 16 beams with three (keep 64) at a
    group's first step; candidates in the tour's dtype (float32 in the runtime)."""
    from seq2serve.runtime.executor.beam_rules import new_state
    from seq2serve.runtime.kernels.triton_beam_rules import beam_rules_step

    for k, stops, rows in ((4, (2,), True), (16, (2, 5, 9), False)):
        keep = max(2, 1 + len(stops)) * k
        state = new_state(k, [0, 1], [5, 9], [True, "never"], [1.0, 0.5], [stops] * 2,
                          [keep] * 2)
        values = torch.randn(2, keep).sort(1, descending=True).values.to(dtype)
        ids = torch.randint(0, 100 * k, (2, keep))
        ints, floats = torch.empty(3, 2 * k, dtype=torch.int64), torch.empty(2, 2 * k)
        done = torch.empty(2, dtype=torch.bool)
        out = (torch.empty(2 * k, dtype=torch.int64), torch.empty(2 * k, dtype=torch.int64),
               torch.empty(2 * k), 0) if rows else None
        beam_rules_step(state, torch.tensor([1, 0]), values, ids, 100, ints, floats, done, 0,
                        0, out)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    from seq2serve.runtime.tools.demo_checkpoint import (
        write_llama_checkpoint,
        write_mllama_checkpoint,
        write_t5_checkpoint,
        write_t5gemma_checkpoint,
    )

    root = tmp_path_factory.mktemp("tour")
    # head sizes of the served shapes: 64 (mT5, Flan-T5), 128 with grouped KV heads (Llama 3)
    return {
        "t5": str(write_t5_checkpoint(root / "t5", mt5=True, d_model=128, d_kv=64,
                                      num_heads=2, d_ff=128, num_layers=1,
                                      num_decoder_layers=1)),
        "llama": str(write_llama_checkpoint(root / "llama", hidden_size=256,
                                            intermediate_size=256, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1)),
        "mllama": str(write_mllama_checkpoint(root / "mllama", text=dict(
            hidden_size=256, intermediate_size=256, num_attention_heads=2,
            num_key_value_heads=1))),
        "t5gemma": str(write_t5gemma_checkpoint(root / "t5gemma", **{stack: dict(
            hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=256, sliding_window=4)
            for stack in ("encoder", "decoder")})),
    }


@pytest.fixture(scope="module")
def launches(checkpoints) -> list[dict]:
    with record_launches() as recorded:
        for dtype in DTYPES:
            _t5_tour(checkpoints["t5"], dtype)
            _llama_tour(checkpoints["llama"], dtype)
            _mllama_tour(checkpoints["mllama"], dtype)
            _t5gemma_tour(checkpoints["t5gemma"], dtype)
            _decode_tour(getattr(torch, dtype))
            _beam_cross_tour(getattr(torch, dtype))
            _beam_copy_tour(getattr(torch, dtype))
            _fused_ops_tour(getattr(torch, dtype))
            _top_p_tour(getattr(torch, dtype))
            _race_tour(getattr(torch, dtype))
            _beam_topk_tour(getattr(torch, dtype))
            _beam_rules_tour(getattr(torch, dtype))
    return recorded


def _counters_in_bf16(launches: list[dict]) -> dict:
    """The bug this file exists for (found on an H100, 2026-11-23): a one-split decode launch
    handed the bf16 output as its atomic counters."""
    for launch in launches:
        kernel = launch["kernel"]
        if kernel.endswith(":_decode_split_kernel") and \
                launch["kwargs"]["NUM_SPLITS"]["value"] == 1 and \
                launch["args"][0].get("tensor") == "bfloat16":
            bad = json.loads(json.dumps(launch))
            bad["args"][6] = {"tensor": "bfloat16", "aligned": True}  # counters
            return bad
    raise AssertionError("the tour made no one-split bf16 decode launch")


@pytest.fixture(scope="module")
def compiled(launches) -> dict:
    return compile_launches(launches + [_counters_in_bf16(launches)])


def _fp8(launch: dict) -> bool:
    return any(a.get("tensor") == "float8_e4m3fn" for a in launch["args"])


def test_every_launch_compiles_for_sm90_and_sm80(launches, compiled):
    """(FP8 launches for sm_90 only: Ampere has no E4M3, and --quantization fp8 is refused
    there, models/quantization.py.)"""
    failures = [r for r in compiled["results"] if r["error"] and r["launch"] < len(launches)
                and not (r["target"] == "sm_80" and _fp8(launches[r["launch"]]))]
    report = "\n\n".join(
        f"{r['kernel']} for {r['target']} ({r['variant']}), arguments "
        f"{[a.get('tensor', a.get('value')) for a in launches[r['launch']]['args']]}:\n"
        f"{r['error'][:1500]}" for r in failures[:5])
    assert not failures, f"{len(failures)} kernel launches do not compile:\n{report}"
    targets = {r["target"] for r in compiled["results"]}
    assert targets == {"sm_90", "sm_80"}
    assert compiled["compiled"] > 0


def test_fp8_weights_compile_for_hopper_only(launches, compiled):
    """Every FP8 launch (GEMV, skinny GEMM, per-token quantization) compiles for sm_90; on sm_80 Triton has
    no E4M3 type, which is why the runtime refuses fp8 below sm_89 with its own message."""
    fp8 = {i for i, launch in enumerate(launches) if _fp8(launch)}
    kernels = {launches[i]["kernel"].split(":")[1] for i in fp8}
    assert {"_gemv_kernel", "_skinny_kernel", "_quantize_kernel"} <= kernels
    by_target = defaultdict(list)
    for r in compiled["results"]:
        if r["launch"] in fp8:
            by_target[r["target"]].append(r["error"])
    assert by_target["sm_90"] and not any(by_target["sm_90"])
    assert by_target["sm_80"] and all(by_target["sm_80"])


def test_a_bf16_atomic_buffer_is_caught(launches, compiled):
    """Reintroduce the bug: the compile fails for both targets, naming the atomic."""
    bad = [r for r in compiled["results"] if r["launch"] == len(launches)]
    assert {r["target"] for r in bad} == {"sm_90", "sm_80"}
    for r in bad:
        assert r["error"] and "atomic" in r["error"], r


def test_every_kernel_is_launched_in_every_dtype(launches, compiled):
    """Each jit function of the package is launched by the tour in all three dtypes, or
    called from one that is: a new kernel cannot go uncompiled."""
    dtypes = defaultdict(set)
    for launch in launches:
        for a in launch["args"]:
            if a.get("tensor") in DTYPES:
                dtypes[launch["kernel"]].add(a["tensor"])
    callees = compiled["kernels"]
    for name, got in dtypes.items():
        assert got == set(DTYPES), f"{name} launched only with {sorted(got)}"
    covered, todo = set(), [k for k in dtypes]
    while todo:
        name = todo.pop()
        if name not in covered:
            covered.add(name)
            todo += callees.get(name, [])
    missing = sorted(set(callees) - covered)
    assert not missing, f"jit functions neither launched by the tour nor called: {missing}"
