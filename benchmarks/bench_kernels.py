"""Decode attention kernels: time, achieved memory bandwidth, and its share of what the card
can copy. Run `python benchmarks/bench_kernels.py` on a CUDA machine (bf16), or
`python benchmarks/bench_kernels.py --cpu-smoke` for a correctness-only pass on tiny sizes in
Triton's interpreter.

Each case is first checked against the torch_native backend in float32 on the same (bf16)
inputs. Decode reads every K/V byte once, so bandwidth is the measure: bytes moved are K + V +
q + out + the slot-table entries read. K/V working sets exceed L2 (and do_bench flushes L2
before each run); each case also rotates over several input sets.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from dataclasses import dataclass, replace

if "--cpu-smoke" in sys.argv:  # Triton reads this on import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from seq2serve.cross_attention.cross_kv_pool import CrossKVPool  # noqa: E402
from seq2serve.models.attention import Attention  # noqa: E402
from seq2serve.models.mt5.relative_position import RelativePositionBias  # noqa: E402
from seq2serve.runtime.attention.base import AttentionKind  # noqa: E402
from seq2serve.runtime.attention.forward_batch import DecoderInputs, ForwardBatch, ForwardMode  # noqa: E402,E501
from seq2serve.runtime.attention.torch_native import TorchNativeBackend  # noqa: E402
from seq2serve.runtime.attention.triton_backend import TritonBackend  # noqa: E402
from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool  # noqa: E402
from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool  # noqa: E402

L2_BYTES = 50 * 2**20


@dataclass(frozen=True)
class Case:
    name: str
    kind: AttentionKind  # SELF (with the T5 bias) or CROSS
    batch: int
    kv_len: int  # context (SELF) or encoder length (CROSS) of every request
    num_heads: int
    head_dim: int
    page_size: int

    def bytes_moved(self, itemsize: int) -> int:
        kv = 2 * self.batch * self.kv_len * self.num_heads * self.head_dim * itemsize
        q_out = 2 * self.batch * self.num_heads * self.head_dim * itemsize
        return kv + q_out + self.batch * self.kv_len * 4  # + int32 slot-table entries


CASES = [
    Case("decode cross-attention", AttentionKind.CROSS, 64, 512, 16, 64, 16),
    Case("decode self-attention + T5 bias", AttentionKind.SELF, 64, 1024, 16, 64, 16),
]
SMOKE_CASES = [
    Case("decode cross-attention", AttentionKind.CROSS, 3, 40, 4, 16, 16),
    Case("decode self-attention + T5 bias", AttentionKind.SELF, 3, 150, 4, 16, 16),
]


def build(case: Case, dtype: torch.dtype, device: str, seed: int) -> ForwardBatch:
    """One decode batch on fresh pools, each request on shuffled pages of random K/V."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_req = -(-case.kv_len // case.page_size)
    num_pages = case.batch * pages_per_req
    pool_cls = TokenToKVPool if case.kind is AttentionKind.SELF else CrossKVPool
    pool = pool_cls(num_pages, case.page_size, 1, case.num_heads, case.head_dim, dtype, device)
    for buf in pool.k_buffers + pool.v_buffers:
        buf.copy_(torch.randn(buf.shape, generator=gen))
    req = ReqToTokenPool(case.batch, case.kv_len, case.kv_len, device)
    table = req.req_to_token if case.kind is AttentionKind.SELF else req.req_to_cross
    pages = (torch.randperm(num_pages, generator=gen) + 1).view(case.batch, pages_per_req)
    for row in range(case.batch):
        table[row] = pool.slots(pages[row].tolist(), 0, case.kv_len).to(device)
    lens = torch.full((case.batch,), case.kv_len, dtype=torch.int32, device=device)
    ones = torch.ones(case.batch, dtype=torch.int32, device=device)
    rows = list(range(case.batch))
    is_self = case.kind is AttentionKind.SELF
    host = DecoderInputs(req_pool_indices=rows,
                         seq_lens=[case.kv_len if is_self else 1] * case.batch,
                         extend_lens=[1] * case.batch,
                         encoder_lens=[1 if is_self else case.kv_len] * case.batch)
    # the inputs this benchmark does not use (token ids, cross ranges...) stay None
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE, host=host, positions=(lens - 1).long(),
        req_pool_indices=torch.arange(case.batch, device=device),
        seq_lens=lens if is_self else ones, extend_lens=ones,
        encoder_lens=ones if is_self else lens, req_to_token_pool=req,
        token_to_kv_pool=pool if is_self else None, cross_kv_pool=None if is_self else pool)


def float32_twin(fb: ForwardBatch) -> ForwardBatch:
    """The same batch with float32 copies of the K/V pool, for the reference."""
    pool = fb.token_to_kv_pool or fb.cross_kv_pool
    twin = type(pool).__new__(type(pool))
    twin.__dict__.update(pool.__dict__)
    twin.k_buffers = [b.float() for b in pool.k_buffers]
    twin.v_buffers = [b.float() for b in pool.v_buffers]
    is_self = fb.token_to_kv_pool is not None
    return replace(fb, token_to_kv_pool=twin if is_self else None,
                   cross_kv_pool=None if is_self else twin)


def attend(backend, fb: ForwardBatch, case: Case, q: torch.Tensor, bias):
    layer = Attention(case.kind, 0, case.num_heads, case.num_heads, case.head_dim, 1.0)
    if case.kind is AttentionKind.SELF:
        return backend.forward_self(q, layer, fb, bias)
    return backend.forward_cross(q, layer, fb)


def copy_bandwidth() -> float:
    """Device-to-device copy of a 1 GiB tensor; read + write bytes per second."""
    import triton.testing

    src = torch.empty(2**29, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300,
                                 return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def run_case(case: Case, dtype: torch.dtype, device: str, timed: bool) -> dict:
    itemsize = torch.finfo(dtype).bits // 8
    # enough independent input sets that together they are several times the size of L2
    num_sets = max(1, -(-4 * L2_BYTES // case.bytes_moved(itemsize))) if timed else 1
    backend = TritonBackend(device=device)
    gen = torch.Generator().manual_seed(0)
    bias = None
    if case.kind is AttentionKind.SELF:
        bias = RelativePositionBias(32, 128, case.num_heads, bidirectional=False)
        bias.weight.data = torch.randn(32, case.num_heads, generator=gen).to(device, dtype)
    sets = []
    for seed in range(num_sets):
        fb = replace(build(case, dtype, device, seed), attn_backend=backend)
        backend.init_forward_metadata(fb)
        q = torch.randn(case.batch, case.num_heads, case.head_dim, generator=gen)
        sets.append((fb, q.to(device, dtype)))

    fb, q = sets[0]
    ref_fb = replace(float32_twin(fb), attn_backend=TorchNativeBackend())
    ref_fb.attn_backend.init_forward_metadata(ref_fb)
    ref_bias = None
    if bias is not None:
        ref_bias = RelativePositionBias(32, 128, case.num_heads, bidirectional=False).to(device)
        ref_bias.weight.data = bias.weight.float()
    expected = attend(ref_fb.attn_backend, ref_fb, case, q.float(), ref_bias)
    out = attend(backend, fb, case, q, bias).float()
    err = (out - expected).abs().max().item()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    ok = err <= tol and not out.isnan().any().item()
    md = fb.attn_metadata
    row = dict(case=case.name, ok=ok, max_err=err, num_sets=num_sets,
               splits=md.self_splits if case.kind is AttentionKind.SELF else md.cross_splits)
    print(f"{case.name}: max |triton - torch_native float32| = {err:.2e} "
          f"({'ok' if ok else 'FAIL'}, tolerance {tol:g})")
    if timed:
        import triton.testing

        cycle = itertools.cycle(sets)

        def step():
            fb_i, q_i = next(cycle)
            attend(backend, fb_i, case, q_i, bias)

        ms = triton.testing.do_bench(step, warmup=100, rep=500, return_mode="median")
        row.update(us=ms * 1e3, bytes=case.bytes_moved(itemsize),
                   gbps=case.bytes_moved(itemsize) / (ms * 1e-3) / 1e9)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny sizes, float32, Triton interpreter, correctness only")
    args = parser.parse_args()
    if args.cpu_smoke:
        rows = [run_case(c, torch.float32, "cpu", timed=False) for c in SMOKE_CASES]
        print("\n| case | max err | splits | ok |\n|---|---|---|---|")
        for r in rows:
            print(f"| {r['case']} | {r['max_err']:.1e} | {r['splits']} | {r['ok']} |")
    else:
        if not torch.cuda.is_available():
            sys.exit("needs CUDA (or pass --cpu-smoke)")
        print(f"device: {torch.cuda.get_device_name()}")
        copy_bw = copy_bandwidth()
        print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write)")
        rows = [run_case(c, torch.bfloat16, "cuda", timed=True) for c in CASES]
        print(f"\n| case (bf16, {CASES[0].num_heads} heads x {CASES[0].head_dim}) | batch x "
              "keys | splits | time (us) | MB moved | GB/s | % of copy BW | correct |")
        print("|---|---|---|---|---|---|---|---|")
        for c, r in zip(CASES, rows):
            share = 100 * r["gbps"] * 1e9 / copy_bw
            print(f"| {r['case']} | {c.batch} x {c.kv_len} | {r['splits']} | {r['us']:.1f} | "
                  f"{r['bytes'] / 1e6:.1f} | {r['gbps']:.0f} | {share:.0f}% "
                  f"{'(target >= 60%)' if share < 60 else ''} | {r['ok']} |")
    if not all(r["ok"] for r in rows):
        sys.exit("correctness check failed")


if __name__ == "__main__":
    main()
