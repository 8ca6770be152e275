"""The tokenizer manager's work for one chat image (a 768x768 JPEG data URL, quality 90) with
florence-2-large's processor, stage by stage on one thread (medians of 20 images): reading
the URL (base64), decoding and preprocessing (`ImageProcessor`: HF's processor, with or
without the deferred normalization), the pixel-store write. No model and no GPU: a change to
the front end's image path is timed on any machine.

    OMP_NUM_THREADS=1 python benchmarks/frontend_image_cost.py
"""

import base64
import io
import statistics
import time

import numpy as np
import torch
from PIL import Image

from seq2serve.encoders.image_loader import MediaPolicy, read_image
from seq2serve.encoders.image_processor import ImageProcessor
from seq2serve.encoders.pixel_store import PixelStore
from seq2serve.runtime.bench.shapes import write_shape

path = str(write_shape("florence-2-large", "/tmp/shape-fl"))
proc = ImageProcessor(path, "m", None, pixel_dtype=torch.bfloat16,
                      stages=[(7, 4, 3), (3, 2, 1), (3, 2, 1), (3, 2, 1)], extra_tokens=1)
print(type(proc.hf).__name__, "deferred normalize:", getattr(proc, "normalize", None))
rng = np.random.default_rng(0)
urls = []
for i in range(24):
    b = io.BytesIO()
    Image.fromarray((rng.random((768, 768, 3)) * 255).astype("uint8")).save(b, "JPEG", quality=90)
    urls.append("data:image/jpeg;base64," + base64.b64encode(b.getvalue()).decode())
store = PixelStore()
t = {k: [] for k in ("read", "decode+process", "store")}
for i, u in enumerate(urls):
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
store.close()
print(", ".join(f"{k} {statistics.median(v)*1e3:.2f} ms" for k, v in t.items()),
      f"pixels {f.pixel_values.dtype} {f.pixel_values.nbytes/1e6:.2f} MB")
