"""The Triton kernels against the torch_native reference, through the backend API on real pools
(paged, shuffled pages) and by direct calls. Without a GPU they run on the CPU in Triton's
interpreter (see conftest.py), so sizes stay small; with one, the same float32 cases run on
CUDA, and the `gpu` tests add bf16 at realistic sizes."""

from __future__ import annotations

import dataclasses
import itertools
import os

import pytest
import torch
import triton
import triton.language as tl

from seq2serve.cross_attention.cross_kv_pool import CrossKVPool
from seq2serve.models.attention import Attention
from seq2serve.models.mt5.relative_position import RelativePositionBias, relative_position_bucket
from seq2serve.runtime.attention.base import AttentionKind
from seq2serve.runtime.attention.forward_batch import (
    DecoderInputs,
    EncodeForwardBatch,
    ForwardBatch,
    ForwardMode,
)
from seq2serve.runtime.attention.torch_native import TorchNativeBackend
from seq2serve.runtime.attention.triton_backend import TritonBackend
from seq2serve.runtime.kernels.triton_bias import bias_constexprs, t5_bucket
from seq2serve.runtime.kernels.triton_decode import _split_counters, paged_decode_attention
from seq2serve.runtime.memory.req_to_token_pool import ReqToTokenPool
from seq2serve.runtime.memory.token_to_kv_pool import TokenToKVPool

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
_F32 = dict(atol=1e-5, rtol=1e-5)
_seeds = itertools.count(1000)  # every case draws its own inputs


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(next(_seeds))


@pytest.fixture
def poisoned_empty(monkeypatch):
    """Every floating-point torch.empty comes back NaN-filled, so an output element (or a
    split-KV partial) that a kernel forgets to write shows up."""
    empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", nan_empty)


def _forward_batch(host: dict, **fields) -> ForwardBatch:
    """A ForwardBatch; fields not given stay None (inputs these kernels do not read), `host`
    gives the host lengths."""
    return ForwardBatch(**fields, host=DecoderInputs(**host))


def _randn(gen: torch.Generator, *shape: int, dtype=torch.float32, device=DEVICE) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def _bias(gen, num_heads, bidirectional, num_buckets=8, max_distance=24, dtype=torch.float32,
          device=DEVICE) -> RelativePositionBias:
    bias = RelativePositionBias(num_buckets, max_distance, num_heads, bidirectional)
    bias.weight.data = _randn(gen, num_buckets, num_heads, dtype=dtype, device=device)
    return bias.to(device)


class _Batch:
    """A decoder batch on real pools: each request's slots come from shuffled pages, every
    slot of both pools holds random K/V, and unused table entries point at real slots too."""

    def __init__(self, gen, *, prefix_lens, extend_lens, encoder_lens, num_heads, num_kv_heads,
                 head_dim, page_size, cross_range=False, dtype=torch.float32, device=DEVICE):
        self.device = device
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
        batch, num_tokens = len(seq_lens), sum(extend_lens)

        def pool(cls, lens):
            num_pages = sum(-(-n // page_size) for n in lens) + 3
            return cls(num_pages, page_size, 1, num_kv_heads, head_dim, dtype, device)

        self.kv, self.cross = pool(TokenToKVPool, seq_lens), pool(CrossKVPool, encoder_lens)
        self.req = ReqToTokenPool(batch + 4, max(seq_lens) + 5, max(encoder_lens) + 5, device)
        rows = torch.randperm(self.req.size, generator=gen)[:batch].tolist()
        for kv_pool, table, lens in ((self.kv, self.req.req_to_token, seq_lens),
                                     (self.cross, self.req.req_to_cross, encoder_lens)):
            for buf in kv_pool.k_buffers + kv_pool.v_buffers:
                buf.copy_(_randn(gen, *buf.shape, dtype=dtype))
            num_slots = kv_pool.k_buffers[0].shape[0]
            table.copy_(torch.randint(0, num_slots, table.shape, generator=gen))
            pages = (torch.randperm(kv_pool.allocator.num_pages, generator=gen) + 1).tolist()
            for row, n in zip(rows, lens):
                mine, pages = pages[:kv_pool.pages_for(n)], pages[kv_pool.pages_for(n):]
                table[row, :n] = kv_pool.slots(mine, 0, n).to(device)
        kv_start = kv_end = None
        if cross_range:  # some queries see nothing, some reach past their request's keys
            kv_start = torch.cat([torch.randint(0, e + 1, (n,), generator=gen, dtype=torch.int32)
                                  for e, n in zip(encoder_lens, extend_lens)])
            kv_end = kv_start + torch.randint(-2, max(encoder_lens) + 3, (num_tokens,),
                                              generator=gen, dtype=torch.int32)
            empty = torch.randint(0, num_tokens, (max(1, num_tokens // 3),), generator=gen)
            kv_end[empty] = kv_start[empty]
            kv_start, kv_end = kv_start.to(device), kv_end.to(device)

        def dev(x):
            return torch.tensor(x, dtype=torch.int32, device=device)

        self.fb = _forward_batch(
            dict(seq_lens=seq_lens, extend_lens=list(extend_lens),
                 encoder_lens=list(encoder_lens), req_pool_indices=rows),
            forward_mode=(ForwardMode.DECODE if all(n == 1 for n in extend_lens)
                          else ForwardMode.EXTEND),
            positions=torch.cat([torch.arange(p, s) for p, s in zip(prefix_lens, seq_lens)])
            .to(device),
            out_cache_loc=torch.cat([self.req.req_to_token[row, p:s]
                                     for row, p, s in zip(rows, prefix_lens, seq_lens)]).long(),
            req_pool_indices=dev(rows).long(), seq_lens=dev(seq_lens),
            extend_lens=dev(extend_lens), encoder_lens=dev(encoder_lens),
            cross_kv_start=kv_start, cross_kv_end=kv_end, req_to_token_pool=self.req, token_to_kv_pool=self.kv,
            cross_kv_pool=self.cross,
        )
        self.q = _randn(gen, num_tokens, num_heads, head_dim, dtype=dtype, device=device)
        self.k_new = _randn(gen, num_tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.v_new = _randn(gen, num_tokens, num_kv_heads, head_dim, dtype=dtype, device=device)

    def layer(self, kind: AttentionKind, scaling: float = 1.0, **gemma) -> Attention:
        return Attention(kind, 0, self.num_heads, self.num_kv_heads, self.head_dim, scaling,
                         **gemma)

    def run(self, backend, kind: AttentionKind, bias=None, scaling: float = 1.0, **gemma):
        """`gemma`: the layer's sliding_window and softcap."""
        fb = dataclasses.replace(self.fb, attn_backend=backend, attn_metadata=None)
        backend.init_forward_metadata(fb)
        k, v = (self.k_new, self.v_new) if kind is AttentionKind.SELF else (None, None)
        return backend.forward(self.q, k, v, self.layer(kind, scaling, **gemma), fb, bias)


def _check(out: torch.Tensor, expected: torch.Tensor, **tol) -> None:
    assert not out.isnan().any(), "NaN in the kernel output"
    torch.testing.assert_close(out, expected, **tol)


def _compare(batch: _Batch, kind: AttentionKind, bias=None, scaling: float = 1.0,
             **gemma) -> None:
    out = batch.run(TritonBackend(device=batch.device), kind, bias, scaling, **gemma)
    _check(out, batch.run(TorchNativeBackend(), kind, bias, scaling, **gemma), **_F32)


# --- the in-kernel T5 bucket ------------------------------------------------------------------
@triton.jit
def _bucket_kernel(rel_ptr, out_ptr, n, BLOCK: tl.constexpr, BIDIRECTIONAL: tl.constexpr,
                   NUM_BUCKETS: tl.constexpr, LOG_RATIO: tl.constexpr):
    i = tl.arange(0, BLOCK)
    rel = tl.load(rel_ptr + i, mask=i < n, other=0)
    tl.store(out_ptr + i, t5_bucket(rel, BIDIRECTIONAL, NUM_BUCKETS, LOG_RATIO), mask=i < n)


@pytest.mark.parametrize("num_buckets,max_distance,bidirectional", [
    (32, 128, True), (32, 128, False), (16, 24, True), (8, 16, False), (12, 20, True),
    (16, 64, False), (8, 16, True),
])
def test_bucket_matches_torch(num_buckets, max_distance, bidirectional):
    rel = torch.arange(-4 * max_distance, 4 * max_distance + 1, dtype=torch.int32, device=DEVICE)
    out = torch.empty_like(rel)
    bias = RelativePositionBias(num_buckets, max_distance, 1, bidirectional)
    args = bias_constexprs(bias)
    _bucket_kernel[(1,)](rel, out, rel.numel(), BLOCK=triton.next_power_of_2(rel.numel()),
                         BIDIRECTIONAL=args["BIDIRECTIONAL"], NUM_BUCKETS=args["NUM_BUCKETS"],
                         LOG_RATIO=args["LOG_RATIO"])
    expected = relative_position_bucket(rel.cpu().long(), bidirectional, num_buckets, max_distance)
    assert out.cpu().long().tolist() == expected.tolist()


# --- encoder: bidirectional varlen ----------------------------------------------------------------
def _encoder_case(gen, lens, num_heads, num_kv_heads, head_dim, use_bias, dtype=torch.float32,
                  device=DEVICE, **gemma):
    total = sum(lens)
    q = _randn(gen, total, num_heads, head_dim, dtype=dtype, device=device)
    # k and v as strided views of one projection, as the model hands them over
    kv = _randn(gen, total, 2 * num_kv_heads * head_dim, dtype=dtype, device=device)
    k, v = (t.view(total, num_kv_heads, head_dim) for t in kv.split(num_kv_heads * head_dim, 1))
    fb = EncodeForwardBatch(token_ids=None, model_input=None, segment_lens=list(lens),
                            cross_out_loc=None, cached_hidden=None)
    bias = _bias(gen, num_heads, True, dtype=dtype, device=device) if use_bias else None
    layer = Attention(AttentionKind.ENCODER, -1, num_heads, num_kv_heads, head_dim, 1.0, **gemma)
    return q, k, v, fb, bias, layer


def _run_encoder(backend, q, k, v, fb, bias, layer):
    fb = dataclasses.replace(fb, attn_backend=backend)
    backend.init_forward_metadata(fb)
    return backend.forward(q, k, v, layer, fb, bias)


@pytest.mark.parametrize("lens,heads,use_bias", [
    ([1], (2, 2, 8), True),
    ([63, 64, 65], (4, 2, 12), True),  # around the 64-row query tile
    ([300, 5], (2, 1, 16), True),
    ([40, 129, 2], (4, 1, 7), False),
    ([70], (2, 2, 64), True),
])
def test_encoder_attention(gen, poisoned_empty, lens, heads, use_bias):
    case = _encoder_case(gen, lens, *heads, use_bias)
    out = _run_encoder(TritonBackend(device=DEVICE), *case)
    _check(out, _run_encoder(TorchNativeBackend(), *case), **_F32)


@pytest.mark.parametrize("lens,heads,window,softcap", [
    ([70, 5, 130], (4, 2, 16), 9, 3.0),  # windows inside and around the query tiles
    ([65], (2, 2, 8), 1, None),
    ([200, 3], (2, 1, 64), 64, 50.0),
])
def test_encoder_attention_gemma(gen, poisoned_empty, lens, heads, window, softcap):
    """T5Gemma's encoder layers: keys at most `window` away on either side, soft-capped."""
    case = _encoder_case(gen, lens, *heads, False, sliding_window=window, softcap=softcap)
    out = _run_encoder(TritonBackend(device=DEVICE), *case)
    _check(out, _run_encoder(TorchNativeBackend(), *case), **_F32)


# --- decoder self-attention -------------------------------------------------------------------
@pytest.mark.parametrize("prefix_lens,extend_lens,heads,page_size,use_bias", [
    ([0, 30, 100, 0], [5, 40, 1, 70], (2, 2, 8), 16, True),
    ([0, 30, 100, 0], [5, 40, 1, 70], (4, 2, 12), 1, True),
    ([16, 3], [65, 64], (4, 1, 16), 16, True),
    ([7, 0], [33, 9], (4, 4, 7), 1, False),
    ([50], [20], (2, 2, 64), 16, True),
])
def test_self_attention_extend(gen, poisoned_empty, prefix_lens, extend_lens, heads, page_size,
                               use_bias):
    batch = _Batch(gen, prefix_lens=prefix_lens, extend_lens=extend_lens,
                   encoder_lens=[1] * len(extend_lens), num_heads=heads[0],
                   num_kv_heads=heads[1], head_dim=heads[2], page_size=page_size)
    bias = _bias(gen, heads[0], False) if use_bias else None
    _compare(batch, AttentionKind.SELF, bias)


@pytest.mark.parametrize("seq_lens,heads,page_size,use_bias", [
    ([1, 17, 200, 64, 65], (2, 2, 8), 16, True),
    ([1, 17, 200, 64, 65], (4, 2, 12), 1, True),
    ([300], (4, 1, 16), 16, True),  # batch 1: split over the keys
    ([3, 129, 40], (4, 4, 7), 1, False),
    ([90, 20], (2, 1, 64), 16, False),
])
def test_self_attention_decode(gen, poisoned_empty, seq_lens, heads, page_size, use_bias):
    batch = _Batch(gen, prefix_lens=[n - 1 for n in seq_lens], extend_lens=[1] * len(seq_lens),
                   encoder_lens=[1] * len(seq_lens), num_heads=heads[0], num_kv_heads=heads[1],
                   head_dim=heads[2], page_size=page_size)
    bias = _bias(gen, heads[0], False) if use_bias else None
    _compare(batch, AttentionKind.SELF, bias, scaling=0.5 if use_bias else 1.0)


@pytest.mark.parametrize("prefix_lens,extend_lens,heads,page_size,window,softcap", [
    ([0, 30, 100], [5, 40, 70], (4, 2, 12), 16, 7, 2.0),
    ([16, 3], [65, 64], (4, 1, 16), 1, 70, None),  # a window longer than the tile
])
def test_self_attention_extend_gemma(gen, poisoned_empty, prefix_lens, extend_lens, heads,
                                     page_size, window, softcap):
    """T5Gemma's decoder prefill: the last `window` positions, soft-capped."""
    batch = _Batch(gen, prefix_lens=prefix_lens, extend_lens=extend_lens,
                   encoder_lens=[1] * len(extend_lens), num_heads=heads[0],
                   num_kv_heads=heads[1], head_dim=heads[2], page_size=page_size)
    _compare(batch, AttentionKind.SELF, sliding_window=window, softcap=softcap)


@pytest.mark.parametrize("seq_lens,heads,window,softcap", [
    ([1, 17, 200, 64, 65], (2, 2, 8), 5, 3.0),
    ([300], (4, 1, 16), 150, None),  # split over the keys inside the window
])
def test_self_attention_decode_gemma(gen, poisoned_empty, seq_lens, heads, window, softcap):
    batch = _Batch(gen, prefix_lens=[n - 1 for n in seq_lens], extend_lens=[1] * len(seq_lens),
                   encoder_lens=[1] * len(seq_lens), num_heads=heads[0], num_kv_heads=heads[1],
                   head_dim=heads[2], page_size=16)
    _compare(batch, AttentionKind.SELF, sliding_window=window, softcap=softcap)


@pytest.mark.parametrize("num_splits", [1, 2, 5, 40])  # 40: more splits than key blocks
def test_decode_kernel_splits(gen, poisoned_empty, num_splits):
    seq_lens = [1, 100, 260]
    batch = _Batch(gen, prefix_lens=[n - 1 for n in seq_lens], extend_lens=[1] * 3,
                   encoder_lens=[1] * 3, num_heads=4, num_kv_heads=2, head_dim=16, page_size=16)
    bias = _bias(gen, 4, False)
    expected = batch.run(TorchNativeBackend(), AttentionKind.SELF, bias)  # also writes new K/V
    fb = batch.fb
    for _ in range(2):  # the last split merges and leaves the counters at zero for the next
        out = paged_decode_attention(batch.q, batch.kv.k_buffers[0], batch.kv.v_buffers[0],
                                     batch.req.req_to_token, fb.req_pool_indices.int(),
                                     fb.seq_lens, num_splits, 1.0, bias)
        _check(out, expected, **_F32)
        assert not _split_counters(out.device, 1).any()


# --- cross-attention --------------------------------------------------------------------------
@pytest.mark.parametrize("encoder_lens,extend_lens,heads,page_size,ranged", [
    ([1, 63, 65, 300], [1, 1, 1, 1], (2, 2, 8), 16, False),
    ([5, 0, 130], [1, 1, 1], (4, 2, 12), 1, True),
    ([200], [1], (4, 1, 16), 16, True),
    ([1, 63, 65, 300], [3, 1, 70, 5], (2, 2, 8), 16, False),
    ([20, 0, 70], [66, 2, 9], (4, 4, 7), 1, True),
    ([40, 90], [4, 17], (2, 1, 64), 16, True),
])
def test_cross_attention(gen, poisoned_empty, encoder_lens, extend_lens, heads, page_size,
                         ranged):
    batch = _Batch(gen, prefix_lens=[2] * len(extend_lens), extend_lens=extend_lens,
                   encoder_lens=encoder_lens, num_heads=heads[0], num_kv_heads=heads[1],
                   head_dim=heads[2], page_size=page_size, cross_range=ranged)
    _compare(batch, AttentionKind.CROSS)
    if ranged:  # queries that see no key read exact zeros
        out = batch.run(TritonBackend(device=DEVICE), AttentionKind.CROSS)
        assert (out[batch.fb.cross_kv_end <= batch.fb.cross_kv_start] == 0).all()


@pytest.mark.parametrize("encoder_lens,extend_lens", [([1, 63, 300], [1, 1, 1]),
                                                      ([20, 0, 70], [66, 2, 9])])
def test_cross_attention_softcap(gen, poisoned_empty, encoder_lens, extend_lens):
    """T5Gemma's cross-attention: soft-capped scores, decode and extend."""
    batch = _Batch(gen, prefix_lens=[2] * len(extend_lens), extend_lens=extend_lens,
                   encoder_lens=encoder_lens, num_heads=4, num_kv_heads=2, head_dim=12,
                   page_size=16)
    _compare(batch, AttentionKind.CROSS, scaling=0.5, softcap=2.0)


# --- bf16 on a GPU ----------------------------------------------------------------------------
_BF16 = dict(atol=3e-2, rtol=3e-2)
_needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _upcast(batch: _Batch, exact: _Batch) -> None:
    """Give `exact` (float32) the bf16-rounded contents of `batch`, so only the math differs."""
    for pool, exact_pool in ((batch.kv, exact.kv), (batch.cross, exact.cross)):
        for src, dst in zip(pool.k_buffers + pool.v_buffers,
                            exact_pool.k_buffers + exact_pool.v_buffers):
            dst.copy_(src.float())
    for name in ("q", "k_new", "v_new"):
        setattr(exact, name, getattr(batch, name).float())


def _bias_pair(gen, num_heads, bidirectional):
    bias = _bias(gen, num_heads, bidirectional, 32, 128, dtype=torch.bfloat16, device="cuda")
    exact = RelativePositionBias(32, 128, num_heads, bidirectional).cuda()
    exact.weight.data = bias.weight.float()
    return bias, exact


@pytest.mark.gpu
@_needs_cuda
@pytest.mark.parametrize("heads,scaling", [((16, 16, 64), 1.0), ((32, 8, 128), 128**-0.5)])
@pytest.mark.parametrize("decode", [True, False])
def test_gpu_bf16_decoder(gen, heads, scaling, decode):
    seq_lens = [1, 700, 1500, 64, 333, 2048]
    extend_lens = [1] * 6 if decode else [1, 100, 300, 64, 33, 129]
    kwargs = dict(prefix_lens=[s - e for s, e in zip(seq_lens, extend_lens)],
                  extend_lens=extend_lens, encoder_lens=[512, 0, 77, 1024, 5, 300],
                  num_heads=heads[0], num_kv_heads=heads[1], head_dim=heads[2], page_size=16,
                  cross_range=not decode, device="cuda")
    seed = next(_seeds)  # both batches draw the same inputs
    batch = _Batch(torch.Generator().manual_seed(seed), dtype=torch.bfloat16, **kwargs)
    exact = _Batch(torch.Generator().manual_seed(seed), dtype=torch.float32, **kwargs)
    _upcast(batch, exact)
    bias, exact_bias = _bias_pair(gen, heads[0], bidirectional=False)
    for kind, b, eb in ((AttentionKind.SELF, bias, exact_bias), (AttentionKind.CROSS, None, None)):
        out = batch.run(TritonBackend(device="cuda"), kind, b, scaling)
        _check(out.float(), exact.run(TorchNativeBackend(), kind, eb, scaling), **_BF16)


@pytest.mark.gpu
@_needs_cuda
@pytest.mark.parametrize("heads", [(16, 16, 64), (32, 8, 128)])
def test_gpu_bf16_encoder(gen, heads):
    q, k, v, fb, _, layer = _encoder_case(gen, [1, 511, 64, 1000], *heads, False,
                                          dtype=torch.bfloat16, device="cuda")
    bias, exact_bias = _bias_pair(gen, heads[0], bidirectional=True)
    out = _run_encoder(TritonBackend(device="cuda"), q, k, v, fb, bias, layer)
    expected = _run_encoder(TorchNativeBackend(), q.float(), k.float(), v.float(), fb,
                            exact_bias, layer)
    _check(out.float(), expected, **_BF16)
