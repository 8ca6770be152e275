"""The tokenizer manager's work for chat images (768x768 JPEG data URLs, quality 90) with
florence-2-large's processor: stage by stage on one thread (medians of 20 images: reading the
URL (base64), decoding and preprocessing (`ImageProcessor`: HF's processor, with or without
the deferred normalization), the pixel-store write), then the whole of it for `--images`
distinct images on thread pools of `--threads` sizes (the media pool's: `min(8, cores)`), and
on pools of `--processes` worker processes (each with its own processor and one torch thread,
writing each image's pixels to the store's folder itself: the parent gets only each image's
key back), to tell the GIL's share from the machine's. `--torch-threads`:
torch's intra-op threads in this process for the thread pools (the tokenizer manager's
default is every core, from every media thread at once). No model and no GPU: a change to the
front end's image path is timed on any machine.

    OMP_NUM_THREADS=1 python benchmarks/frontend_image_cost.py --threads 1,2,4,8,16
    python benchmarks/frontend_image_cost.py --threads 1,8 --torch-threads 1 --processes 1,4,8,16
    python benchmarks/frontend_image_cost.py --threads 8 --media-workers 1,8,16

`--media-workers`: the engine's own pool (`--media-processes`, runtime/frontend/media_workers.py),
the parent's CPU time an image beside the wall time.
"""

import argparse
import base64
import io
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

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


STAGES = [(7, 4, 3), (3, 2, 1), (3, 2, 1), (3, 2, 1)]  # florence-2-large's patch convolutions
_WORKER: dict = {}


def _processor(path: str, memo_size: int = 32) -> ImageProcessor:
    return ImageProcessor(path, "m", None, pixel_dtype=torch.bfloat16, stages=STAGES,
                          extra_tokens=1, memo_size=memo_size)


def _worker_init(path: str, root: str) -> None:
    torch.set_num_threads(1)
    _WORKER.update(proc=_processor(path, 0), root=root)


def _worker_one(url: str) -> tuple[str, int]:
    """One image read, preprocessed and written to the store's folder in a worker process;
    (its key, its bytes): what the parent process gets back."""
    f = _WORKER["proc"](*read_image(url, MediaPolicy()))
    data = f.pixel_values.contiguous().view(torch.uint8).numpy()
    path = os.path.join(_WORKER["root"], f.key)
    with open(path + ".part", "wb") as out:
        out.write(memoryview(data))
    os.replace(path + ".part", path)
    return f.key, data.nbytes


def _process_pools(path: str, sizes: list[int], images: int, root: str) -> None:
    for seed, n in enumerate(sizes):
        urls = data_urls(images, 100 + seed)
        begun = time.perf_counter()
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_worker_init, initargs=(path, root)) as pool:
            list(pool.map(_worker_one, data_urls(2 * n, 99)))  # (every worker started)
            ready = time.perf_counter()
            done = list(pool.map(_worker_one, urls))
            end = time.perf_counter()
        for key, _ in done:
            os.unlink(os.path.join(root, key))
        print(f"{n:2d} processes: {images} images read, preprocessed and written in "
              f"{end - ready:.3f} s ({(end - ready) / images * 1e3:.2f} ms an image; the pool "
              f"started in {ready - begun:.1f} s)", flush=True)


def _media_workers(path: str, sizes: list[int], images: int, root: str) -> None:
    """The tokenizer manager's own worker pool (`--media-processes`): what the parent gets is
    each image's features, its pixels read back from the worker's file."""
    from seq2serve.runtime.frontend.media_workers import MediaWorkers

    args = dict(model_path=path, model_id="m", tokens_per_tile=None,
                pixel_dtype=torch.bfloat16, stages=STAGES, extra_tokens=1, memo_size=0)
    for seed, n in enumerate(sizes):
        begun = time.perf_counter()
        workers = MediaWorkers(n, args, MediaPolicy(), True, os.path.join(root, "workers"))
        try:
            ready = time.perf_counter()
            # (every image submitted before the first is waited for, as the tokenizer
            # manager does)
            [f.result() for f in list(map(workers.submit, data_urls(2 * n, 98)))]  # (warm)
            urls = data_urls(images, 200 + seed)
            cpu, start = time.process_time(), time.perf_counter()
            [f.result() for f in list(map(workers.submit, urls))]
            end, cpu = time.perf_counter(), time.process_time() - cpu
        finally:
            workers.close()
        print(f"{n:2d} media workers: {images} images in {end - start:.3f} s "
              f"({(end - start) / images * 1e3:.2f} ms an image; the parent's CPU "
              f"{cpu / images * 1e3:.2f} ms an image; started in {ready - begun:.1f} s)",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="", help="pool sizes, e.g. 1,4,8 (none: stages only)")
    ap.add_argument("--images", type=int, default=128, help="distinct images a pool run")
    ap.add_argument("--processes", default="", help="process pool sizes, e.g. 1,4,8,16")
    ap.add_argument("--media-workers", default="",
                    help="MediaWorkers sizes (the engine's --media-processes), e.g. 1,8,16")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="torch's threads in this process (0: torch's default)")
    args = ap.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(f"{os.cpu_count()} cores, torch threads {torch.get_num_threads()}", flush=True)
    path = str(write_shape("florence-2-large", "/tmp/shape-florence-2-large-frontend"))
    # (a memo smaller than a pool run's images: every image is preprocessed)
    proc = _processor(path)
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
    if args.processes:
        _process_pools(path, [int(x) for x in args.processes.split(",")], args.images,
                       store.root)
    if args.media_workers:
        _media_workers(path, [int(x) for x in args.media_workers.split(",")], args.images,
                       store.root)
    store.close()


if __name__ == "__main__":
    main()
