"""The tokenizer manager's work for chat images (768x768 JPEG data URLs, quality 90) with
florence-2-large's processor: stage by stage on one thread (medians of 20 images: reading the
URL (base64), decoding and preprocessing (`ImageProcessor`: HF's processor, with or without
the deferred normalization), the pixel-store write), then the whole of it for `--images`
distinct images on thread pools of `--threads` sizes (the media pool's: `min(8, cores)`). No
model and no GPU: a change to the front end's image path is timed on any machine.

    OMP_NUM_THREADS=1 python benchmarks/frontend_image_cost.py --threads 1,2,4,8,16
"""

import argparse
import base64
import io
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from PIL import Image

from seq2serve.encoders.image_loader import MediaPolicy, read_image
from seq2serve.encoders.image_processor import ImageProcessor
from seq2serve.encoders.pixel_store import PixelStore
from seq2serve.runtime.bench.shapes import write_shape


def data_urls(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    urls = []
    for _ in range(n):
        b = io.BytesIO()
        Image.fromarray((rng.random((768, 768, 3)) * 255).astype("uint8")).save(
            b, "JPEG", quality=90)
        urls.append("data:image/jpeg;base64," + base64.b64encode(b.getvalue()).decode())
    return urls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="", help="pool sizes, e.g. 1,4,8 (none: stages only)")
    ap.add_argument("--images", type=int, default=128, help="distinct images a pool run")
    args = ap.parse_args()
    path = str(write_shape("florence-2-large", "/tmp/shape-florence-2-large-frontend"))
    # (a memo smaller than a pool run's images: every image is preprocessed)
    proc = ImageProcessor(path, "m", None, pixel_dtype=torch.bfloat16,
                          stages=[(7, 4, 3), (3, 2, 1), (3, 2, 1), (3, 2, 1)], extra_tokens=1)
    print(type(proc.hf).__name__, "deferred normalization:", getattr(proc, "normalize", None))
    store = PixelStore()
    t = {k: [] for k in ("read", "decode+process", "store")}
    for i, u in enumerate(data_urls(24, 0)):
        a = time.perf_counter()
        ident, decode = read_image(u, MediaPolicy())
        b = time.perf_counter()
        f = proc(ident, decode)
        c = time.perf_counter()
        store.put(f.key, f.pixel_values)
        d = time.perf_counter()
        if i >= 4:  # (the first few warm the processor up)
            for k, v in zip(t, (b - a, c - b, d - c)):
                t[k].append(v)
    print(", ".join(f"{k} {statistics.median(v) * 1e3:.2f} ms" for k, v in t.items()),
          f"pixels {f.pixel_values.dtype} {f.pixel_values.nbytes / 1e6:.2f} MB", flush=True)

    def one(url: str):
        ident, decode = read_image(url, MediaPolicy())
        return proc(ident, decode)

    for seed, n in enumerate(int(x) for x in args.threads.split(",") if x):
        urls = data_urls(args.images, seed + 1)
        with ThreadPoolExecutor(n) as pool:
            start = time.perf_counter()
            feats = list(pool.map(one, urls))
            mid = time.perf_counter()
        for f in feats:  # (the tokenizer manager writes them on its event loop, one by one)
            store.put(f.key, f.pixel_values)
            store.release(f.key)
        end = time.perf_counter()
        print(f"{n:2d} threads: {args.images} images read and preprocessed in {mid - start:.3f} s "
              f"({(mid - start) / args.images * 1e3:.2f} ms an image), then stored one by one "
              f"in {end - mid:.3f} s", flush=True)
    store.close()


if __name__ == "__main__":
    main()
