"""What cuBLAS's first GEMM of a new row count costs, and what padding the rows to
`bucket_rows` costs instead: one Llama-3.2-1B layer's four GEMMs (qkv, o, gate_up, down) at
row counts new to the process, then the same counts again, plain and padded; then the host and
device time of a repeated count. `source benchmarks/gpu_setup.sh; python3
benchmarks/gemm_new_rows.py` (docs/benchmarks.md, thirty-first session)."""
import time

import torch
import torch.nn.functional as F

from seq2serve.models.row_buckets import bucket_rows

DEV, BF = "cuda", torch.bfloat16
SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)]


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def plain(x, w):
    return F.linear(x, w)


def padded(x, w):
    m = x.shape[0]
    rows = bucket_rows(m)
    if rows == m:
        return F.linear(x, w)
    whole = x.new_empty(rows, x.shape[1])
    whole[:m] = x
    return F.linear(whole, w)[:m]


def main():
    ws = [torch.randn(n, k, device=DEV, dtype=BF) for n, k in SHAPES]

    def layer(fn, m):
        for w in ws:
            fn(torch.randn(m, w.shape[1], device=DEV, dtype=BF), w)

    F.linear(torch.randn(64, 2048, device=DEV, dtype=BF), ws[0])
    for lo, name in [(1001, "~1000 + decode rows"), (40, "40-400"), (3000, "3000+")]:
        for fname, fn in [("plain", plain), ("padded", padded)]:
            # (odd offsets: the two runs never share a row count)
            ms = list(range(lo + (7 if fname == "padded" else 3), lo + 400, 13))[:20]
            first = sorted(timed(lambda: layer(fn, m)) for m in ms)
            again = sorted(timed(lambda: layer(fn, m)) for m in ms)
            print(f"{name:20s} {fname:7s} 4 GEMMs, new M: median {first[10]:.3f} max "
                  f"{first[-1]:.3f} ms; same M again: median {again[10]:.3f} ms", flush=True)
    m = 1130
    xs = [torch.randn(m, w.shape[1], device=DEV, dtype=BF) for w in ws]
    for fname, fn in [("plain", plain), ("padded", padded)]:
        for w, x in zip(ws, xs):
            fn(x, w)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            for w, x in zip(ws, xs):
                fn(x, w)
        host = (time.perf_counter() - start) * 1e3 / 200
        torch.cuda.synchronize()
        both = (time.perf_counter() - start) * 1e3 / 200
        print(f"M={m} {fname:7s} 4 GEMMs: host {host:.3f} ms, with device {both:.3f} ms")


if __name__ == "__main__":
    main()
