"""How many decode forwards are launched ahead of the step in flight (the overlap schedule)
under arrivals over time, with or without beams: a request arrives every `--every` steps, and
each launch is counted as launched ahead (the host bookkeeping of the step before runs while
the device computes) or after the host read the step before (host and device in series), with
the EXTEND forwards apart. A count of launches on a tiny random BART on the CPU, not a timing:
what a served beam load meets, before any GPU.

    python benchmarks/beam_overlap_share.py --beams 4 --every 2 --requests 60 --new-tokens 32
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import tempfile
from pathlib import Path

from seq2serve.runtime.bench.shapes import SHAPES, write_shape
from seq2serve.runtime.config.model_config import ModelConfig
from seq2serve.runtime.config.sampling_params import SamplingParams
from seq2serve.runtime.config.server_args import ServerArgs
from seq2serve.runtime.messages.io_struct import TokenizedRequest
from seq2serve.runtime.scheduler.scheduler import Scheduler


def tiny_bart() -> str:
    path = Path(write_shape("bart-large-cnn", tempfile.mkdtemp()))
    cfg = dict(SHAPES["bart-large-cnn"], d_model=16, encoder_layers=1, decoder_layers=1,
               encoder_attention_heads=1, decoder_attention_heads=1, encoder_ffn_dim=16,
               decoder_ffn_dim=16, vocab_size=512)
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def count_launches(beams: int, every: int, requests: int, new_tokens: int) -> dict:
    """(forward mode, "ahead" | "after read") -> launches, over the whole run; and "steps a
    request" -> the mean steps from a request's arrival to its result."""
    path = tiny_bart()
    sched = Scheduler(ServerArgs(model_path=path, device="cpu", dtype="float32",
                                 load_format="dummy", max_running_requests=256,
                                 context_length=256), ModelConfig.from_path(path), None)
    counts: collections.Counter = collections.Counter()
    launch = sched._launch

    def counted(mode, reqs, prev=None, chunk=None):
        counts[(mode.value, "ahead" if prev is not None else "after read")] += 1
        return launch(mode, reqs, prev, chunk)

    sched._launch = counted
    rng = random.Random(0)
    sp = {"max_new_tokens": new_tokens, "ignore_eos": True, "num_beams": beams}
    sent = step = 0
    arrived, took = {}, []
    while sent < requests or sched.has_work:
        if sent < requests and step % every == 0:
            sched.add_request(TokenizedRequest(
                rid=str(sent), encoder_input_ids=[rng.randrange(3, 500) for _ in range(16)],
                decoder_input_ids=[2], sampling_params=SamplingParams.from_dict(sp)))
            arrived[str(sent)] = step
            sent += 1
        for out in sched.step():
            if out.finished_reason is not None:
                took.append(step + 1 - arrived[out.rid])
        step += 1
    return {**counts, "steps a request": sum(took) / len(took)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--every", type=int, default=2, help="steps between arrivals")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    counts = count_launches(args.beams, args.every, args.requests, args.new_tokens)
    took = counts.pop("steps a request")
    for (mode, when), n in sorted(counts.items()):
        print(f"{mode:7s} {when:10s} {n:5d}")
    print(f"steps from a request's arrival to its result: {took:.1f} (mean)")


if __name__ == "__main__":
    main()
