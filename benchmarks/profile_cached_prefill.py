"""Where the time of a repeated image's first token goes, in the scheduler (in-process, no
child processes): a fresh image, then the same image and prompt again (encoder cache hit and
radix hit), the latter under torch.profiler; host ops sorted by their own CPU time.

    python benchmarks/profile_cached_prefill.py --shape mllama-11b
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
from PIL import Image
from torch.profiler import ProfilerActivity, profile

from seq2serve.runtime.bench.shapes import write_shape
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.config.tokenizer import load_tokenizer
from seq2serve.runtime.frontend.generate_request import GenerateReqInput
from seq2serve.runtime.frontend.tokenizer_manager import TokenizerManager
from seq2serve.runtime.scheduler.scheduler import Scheduler
from seq2serve.runtime.scheduler.scheduler_process import scheduler_info


def _image(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((1120, 1120, 3)) * 255).astype("uint8"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="mllama-11b")
    args = ap.parse_args()
    if args.shape == "tiny":  # a CPU check of this script
        from seq2serve.runtime.tools.demo_checkpoint import write_mllama_checkpoint

        path = str(write_mllama_checkpoint(tempfile.mkdtemp()))
        sargs = ServerArgs(model_path=path, device="cpu")
    else:
        path = str(write_shape(args.shape, tempfile.mkdtemp()))
        sargs = ServerArgs(model_path=path, device="cuda", dtype="bfloat16",
                           load_format="dummy", max_running_requests=8, context_length=4096)
    tok = load_tokenizer(path)
    sched = Scheduler(sargs, ModelConfig.from_path(path), tok)
    tm = TokenizerManager(None, tok, scheduler_info(sched), model_id=path)
    words = " ".join(["word"] * 125)

    def first_token(img, rid):
        t0 = time.perf_counter()
        _, reqs = tm.tokenize(GenerateReqInput(
            text="<|image|>" + words, image_data=[img], rid=rid,
            sampling_params={"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}))
        t1 = time.perf_counter()
        sched.add_request(reqs[0])
        while sched.has_work:
            sched.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return t1 - t0, time.perf_counter() - t1

    for i, seed in enumerate((0, 0, 1, 1)):  # warm both paths
        first_token(_image(seed), f"w{i}")
    img = _image(2)
    print("fresh  (tokenize, scheduler) ms:", [round(t * 1e3, 1) for t in first_token(img, "f")])
    print("cached (tokenize, scheduler) ms:", [round(t * 1e3, 1) for t in first_token(img, "c")])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        times = first_token(img, "p")
    print("cached under the profiler ms:", [round(t * 1e3, 1) for t in times])
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25,
                                    max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12,
                                    max_name_column_width=60))


if __name__ == "__main__":
    main()
