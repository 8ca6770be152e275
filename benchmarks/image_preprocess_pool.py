"""HF's image processor for florence-2-large's shape on 256 images of 768x768, one after
another, on threads and on processes: what parallel preprocessing of one call's images can
gain on this host (each image hashed, preprocessed to bf16 and written to /dev/shm, as the
tokenizer manager does), and one processor call for a part of 16 or 64 images.

    python3 benchmarks/image_preprocess_pool.py [--workers 8,16]
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import torch

_processor = None


def _load(path: str, threads: int | None = None) -> None:
    global _processor
    if threads:
        torch.set_num_threads(threads)
    from transformers import AutoImageProcessor

    _processor = AutoImageProcessor.from_pretrained(path)


def _one(item) -> tuple[str, tuple[int, ...]]:
    image, folder = item
    key = hashlib.sha256(image.mode.encode() + repr(image.size).encode()
                         + image.tobytes()).hexdigest()[:32]
    pixels = _processor(images=[image], return_tensors="pt")["pixel_values"][0]
    pixels = pixels.to(torch.bfloat16).contiguous()
    with open(os.path.join(folder, key), "wb") as f:
        f.write(memoryview(pixels.view(torch.uint8).numpy()))
    return key, tuple(pixels.shape)


def _part(item) -> list[tuple[int, ...]]:
    """A part's images through the processor in one call (its torch backend stacks images
    of one size and runs each step once for all of them), then each written as `_one`."""
    images, folder = item
    keys = [hashlib.sha256(i.mode.encode() + repr(i.size).encode() + i.tobytes()).hexdigest()[:32]
            for i in images]
    pixels = _processor(images=images, return_tensors="pt")["pixel_values"]
    pixels = pixels.to(torch.bfloat16).contiguous()
    for key, p in zip(keys, pixels):
        with open(os.path.join(folder, key), "wb") as f:
            f.write(memoryview(p.view(torch.uint8).numpy()))
    return [tuple(p.shape) for p in pixels]


def main() -> None:
    from seq2serve.runtime.bench.shapes import write_shape
    from seq2serve.runtime.bench.workload import random_image

    p = argparse.ArgumentParser()
    p.add_argument("--workers", default="8,16")
    p.add_argument("--images", type=int, default=256)
    args = p.parse_args()
    path = str(write_shape("florence-2-large", tempfile.mkdtemp()))
    images = [random_image(i, 768) for i in range(args.images)]
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    items = [(image, folder) for image in images]
    _load(path)
    print(f"{type(_processor).__name__}, {os.cpu_count()} cpus", flush=True)
    first = items[:32]
    start = time.perf_counter()
    for item in first:
        _one(item)
    print(f"one after another: {(time.perf_counter() - start) / len(first) * 1e3:.1f} ms an "
          f"image", flush=True)
    workers = [int(n) for n in args.workers.split(",")]
    for n in workers:
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(_one, items[:n]))
            start = time.perf_counter()
            list(pool.map(_one, items))
            print(f"{n} threads: {time.perf_counter() - start:.3f} s", flush=True)
    for size in (16, 64):  # one processor call a part of `size` images
        parts = [(images[i:i + size], folder) for i in range(0, len(images), size)]
        for n in workers:
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(_part, parts[:1]))
                start = time.perf_counter()
                list(pool.map(_part, parts))
                print(f"{n} threads, one call a part of {size}: "
                      f"{time.perf_counter() - start:.3f} s", flush=True)
    for n in workers:  # (each process one torch thread: the pool is the parallelism)
        with ProcessPoolExecutor(n, mp.get_context("spawn"), initializer=_load,
                                 initargs=(path, 1)) as pool:
            list(pool.map(_one, items[:n]))  # (started and loaded, not timed)
            for _ in range(2):
                start = time.perf_counter()
                list(pool.map(_one, items))
                print(f"{n} processes: {time.perf_counter() - start:.3f} s", flush=True)


if __name__ == "__main__":
    main()
