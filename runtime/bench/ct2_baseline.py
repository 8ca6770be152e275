"""CTranslate2 on the same checkpoint and workload: the engine CPU translation services use,
the baseline of `bench offline --baseline ct2` (needs the `ctranslate2` package: the `ct2`
extra). The checkpoint is converted with CTranslate2's own converter; a `--shape` directory
without weights gets HF's random weights saved first (the same weights then serve both)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from seq2serve.runtime.bench.workload import BenchRequest


def ensure_weights(model_dir: str) -> str:
    """The directory itself if it holds weights, else a copy with HF's random weights (the
    seq2serve side then loads those too, so both engines run the same model)."""
    if any(Path(model_dir).glob("*.safetensors")):
        return model_dir
    import shutil

    import torch

    from seq2serve.runtime.bench.hf_baseline import load_hf_model

    out = tempfile.mkdtemp(prefix="ct2-weights-")
    shutil.copytree(model_dir, out, dirs_exist_ok=True)
    load_hf_model(model_dir, torch.float32, "cpu").save_pretrained(out)
    return out


def bench_ct2(model_dir: str, reqs: list[BenchRequest], batch_size: int, output_len: int,
              compute_type: str = "float32", threads: int | None = None,
              beam_size: int = 1) -> dict:
    """Output tokens/s of `Translator.translate_batch` (greedy, or `beam_size` beams and the
    best hypothesis counted; exactly `output_len` tokens each) over all `reqs`, after a
    warm-up batch; with each request's output ids."""
    return Ct2Runner(model_dir, reqs, batch_size, output_len, compute_type, threads,
                     beam_size)()


class Ct2Runner:
    """The checkpoint converted and loaded once, warmed up on one batch; each call is one
    timed `translate_batch` over all `reqs` (`bench offline --repeats` calls it N times)."""

    def __init__(self, model_dir: str, reqs: list[BenchRequest], batch_size: int,
                 output_len: int, compute_type: str = "float32",
                 threads: int | None = None, beam_size: int = 1) -> None:
        try:
            import ctranslate2
        except ImportError as e:
            raise RuntimeError("--baseline ct2 needs the ctranslate2 package "
                               "(pip install -e '.[ct2]')") from e
        import torch

        from seq2serve.runtime.config.tokenizer import load_tokenizer

        converted = tempfile.mkdtemp(prefix="ct2-")
        ctranslate2.converters.TransformersConverter(model_dir).convert(converted, force=True)
        self.version = ctranslate2.__version__
        self.compute_type, self.batch_size = compute_type, batch_size
        self.threads = threads or torch.get_num_threads()
        self.translator = ctranslate2.Translator(converted, device="cpu",
                                                 compute_type=compute_type, inter_threads=1,
                                                 intra_threads=self.threads)
        self.tok = load_tokenizer(model_dir)
        self.sources = [self.tok.convert_ids_to_tokens(r.input_ids) for r in reqs]
        # exactly output_len tokens, EOS an ordinary token (as seq2serve's ignore_eos)
        # (beams: length_penalty 1 and no early stop, HF's defaults; all end at output_len)
        self.opts = {"beam_size": beam_size, "max_decoding_length": output_len,
                     "min_decoding_length": output_len, "end_token": [],
                     "max_batch_size": batch_size}
        self.translator.translate_batch(self.sources[:batch_size], **self.opts)  # warm-up

    def __call__(self) -> dict:
        start = time.perf_counter()
        results = self.translator.translate_batch(self.sources, **self.opts)
        elapsed = time.perf_counter() - start
        outputs = [self.tok.convert_tokens_to_ids(r.hypotheses[0]) for r in results]
        return {"mode": f"ct2-{self.compute_type}", "batch_size": self.batch_size,
                "beam_size": self.opts["beam_size"],
                "threads": self.threads, "tokens_per_s": sum(map(len, outputs)) / elapsed,
                "seconds": elapsed, "ctranslate2_version": self.version,
                "output_ids": outputs}
