"""One media worker process (`media_workers.MediaWorkers` starts them): reads an image
source, decodes and preprocesses it with the model's image processor, and sends back its
`ImageFeatures` (and, for Florence-2's answers, the image's size), one task at a time, on one
torch thread. Started as `python -m seq2serve.runtime.frontend.media_worker TASK_FD
RESULT_FD` (not through multiprocessing: its spawn would run the parent's `__main__`
again, and a user's script that builds an engine at its top level would build one in every
worker). It exits when the parent closes its task pipe, or dies."""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Connection


def prepared(src, policy, processor, with_size: bool) -> tuple:
    """(ImageFeatures, (width, height) or None) of one image source: read under `policy`,
    decoded and preprocessed by `processor` (an ImageProcessor), its size read where Florence-2's
    answers need it. What a media thread and a media worker both do with an image."""
    from seq2serve.encoders.image_loader import read_image
    from seq2serve.runtime.frontend.florence_answers import image_size

    ident, decode = read_image(src, policy)
    size = image_size(src, ident) if with_size else None
    return processor(ident, decode), size


def serve(tasks: Connection, results: Connection) -> None:
    """Answer tasks until the parent closes `tasks`. The first message is the config:
    ImageProcessor's keyword arguments, the MediaPolicy, and whether to read image sizes."""
    import torch

    torch.set_num_threads(1)
    from seq2serve.encoders.image_processor import ImageProcessor
    from seq2serve.runtime.frontend.media_workers import recv, send
    from seq2serve.runtime.memory.host_memory import PeriodicTrim

    config = recv(tasks)
    processor = ImageProcessor(**config["processor"])
    policy, with_size, folder = config["policy"], config["with_size"], config["folder"]
    trim = PeriodicTrim()
    send(results, ("ready", os.getpid()))
    while True:
        try:
            task_id, src = recv(tasks)
        except EOFError:
            return
        try:
            features, size = prepared(src, policy, processor, with_size)
            reply = (task_id, "ok", (*_passed(features, folder, task_id), size))
        except ValueError as e:  # the input's fault: the caller names it
            reply = (task_id, "refused", str(e))
        except Exception as e:  # noqa: BLE001 - sent back, the worker goes on
            reply = (task_id, "failed", f"{type(e).__name__}: {e}")
        del src
        send(results, reply)
        del reply
        trim.maybe(1.0)  # (a large image's buffers back to the OS: flat memory)


def _passed(features, folder: str, task_id: int) -> tuple:
    """(features, file): its pixels written to a file in `folder` (the parent reads them back
    from host memory: a pipe moved them at a few ms an image) and left out of the features;
    where the folder has no room, the pixels stay in the features, pickled (file None)."""
    import dataclasses

    import torch

    pixels = features.pixel_values
    path = os.path.join(folder, f"{os.getpid()}-{task_id}")
    try:
        with open(path, "wb") as f:
            f.write(memoryview(pixels.contiguous().view(torch.uint8).numpy()))
    except OSError:
        if os.path.exists(path):
            os.unlink(path)
        return features, None
    return (dataclasses.replace(features, pixel_values=None),
            (path, pixels.dtype, tuple(pixels.shape)))


def main() -> None:
    tasks = Connection(int(sys.argv[1]), writable=False)
    results = Connection(int(sys.argv[2]), readable=False)
    try:
        serve(tasks, results)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass  # the parent went away


if __name__ == "__main__":
    main()
