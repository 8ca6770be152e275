"""`seq2serve bench quality`: a quantized model against the same weights unquantized.

Both run through the engine, one after the other, on the same fixed prompts with greedy
decoding: the first generated token of each prompt is the model's next-token prediction
(top-1), and the whole greedy sequence shows how soon a small difference changes the text.
Reported: next-token agreement (share of prompts whose first token is the same), greedy
sequence match (share of identical sequences) and the mean share of each reference sequence
reproduced before the first difference. With `--shape` both load the same random weights
(the same seed): random weights have flat logits, so agreement there is a harsher test than
on trained weights.
"""

from __future__ import annotations

import json
import tempfile

OPENINGS = ["The history of", "A short guide to", "Ten facts about", "My favourite thing about",
            "The best way to learn about", "Scientists recently wrote about", "Tell me about",
            "Here is a poem about", "The biggest problem with", "Children often ask about"]
TOPICS = ["the Roman Empire", "black holes", "French cooking", "the ocean", "mountain birds",
          "electric cars", "the piano", "ancient Egypt", "coffee", "the moon landing",
          "honey bees", "the internet", "volcanoes", "chess", "the Amazon rainforest",
          "jazz music", "bicycles", "the human heart", "winter in Canada", "paper money"]


def prompts(n: int = 200) -> list[str]:
    """n fixed English prompts (opening x topic; at most 200 distinct)."""
    every = [f"{o} {t}" for t in TOPICS for o in OPENINGS]
    if not 0 < n <= len(every):
        raise ValueError(f"between 1 and {len(every)} prompts, got {n}")
    return every[:n]


def greedy_outputs(model_path: str, texts: list[str], max_new_tokens: int,
                   **engine_args) -> list[list[int]]:
    """Each prompt's greedy output ids from one engine (closed before returning)."""
    from seq2serve import Seq2SeqEngine

    with Seq2SeqEngine(model_path=model_path, **engine_args) as engine:
        outs = engine.generate(prompt=texts, sampling_params={
            "max_new_tokens": max_new_tokens, "temperature": 0})
    return [o["output_ids"] for o in outs]


def compare(reference: list[list[int]], candidate: list[list[int]]) -> dict:
    """Agreement of `candidate`'s greedy outputs with `reference`'s, prompt by prompt."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError("compare needs the same (non-zero) number of outputs")
    first = sum(bool(r) and bool(c) and r[0] == c[0] for r, c in zip(reference, candidate))
    same = sum(r == c for r, c in zip(reference, candidate))
    kept = []
    for r, c in zip(reference, candidate):
        n = 0
        while n < min(len(r), len(c)) and r[n] == c[n]:
            n += 1
        kept.append(n / len(r) if r else 1.0)
    return {"prompts": len(reference), "next_token_agreement": first / len(reference),
            "greedy_sequence_match": same / len(reference),
            "mean_prefix_kept": sum(kept) / len(kept)}


def measure(model_path: str, quantization: str, num_prompts: int = 200,
            max_new_tokens: int = 16, reference_args: dict | None = None,
            quantized_args: dict | None = None, **engine_args) -> dict:
    """Quantized (`quantization`, `engine_args` with `quantized_args` over them) against
    unquantized (`engine_args` with `reference_args` over them) on `prompts(num_prompts)`.
    `quantization` "none" compares two unquantized runs (a control: another dtype in
    `reference_args`)."""
    texts = prompts(num_prompts)
    ref = greedy_outputs(model_path, texts, max_new_tokens,
                         **(engine_args | (reference_args or {})))
    quantized = {} if quantization == "none" else {"quantization": quantization}
    quant = greedy_outputs(model_path, texts, max_new_tokens, **quantized,
                           **(engine_args | (quantized_args or {})))
    return compare(ref, quant) | {"quantization": quantization,
                                  "max_new_tokens": max_new_tokens}


def add_quality_parser(sub) -> None:
    p = sub.add_parser("quality", help="quantized vs unquantized: next-token agreement")
    p.add_argument("--shape", help="a real model shape with random weights (mt5-large, ...)")
    p.add_argument("--model-path", help="or a model directory (real weights)")
    p.add_argument("--quantization", default="int8", choices=["int8", "fp8", "none"],
                   help="none: unquantized against --reference-dtype (a control)")
    p.add_argument("--quantize-lm-head", action="store_true")
    p.add_argument("--int8-activations", action="store_true",
                   help="CPU, int8: activations quantized per token too (as CTranslate2)")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--dtype", default="auto", help="both models' dtype (auto: CPU float32)")
    p.add_argument("--reference-dtype",
                   help="the reference's dtype instead (float32: how far the model in --dtype "
                        "is itself from it, the floor a quantization is measured against)")
    p.add_argument("--device", default=None)
    p.add_argument("--engine-args", default="{}", help="JSON of extra engine options")
    p.add_argument("--json", help="write the result here")
    p.set_defaults(fn=_quality)


def _quality(args) -> dict:
    load = {}
    model_path = args.model_path
    if args.shape:
        from seq2serve.runtime.bench.shapes import write_shape

        model_path, load = str(write_shape(args.shape, tempfile.mkdtemp())), {
            "load_format": "dummy"}
    elif not model_path:
        raise ValueError("give --shape or --model-path")
    r = measure(model_path, args.quantization, args.num_prompts, args.max_new_tokens,
                device=args.device, dtype=args.dtype, quantize_lm_head=args.quantize_lm_head,
                quantized_args={"int8_activations": True} if args.int8_activations else None,
                reference_args={"dtype": args.reference_dtype} if args.reference_dtype else None,
                **load, **json.loads(args.engine_args))
    method = args.quantization + (" (int8 activations)" if args.int8_activations else "")
    if args.quantization == "none":
        method = f"unquantized {args.dtype}"
    print(f"{method} vs unquantized ({args.reference_dtype or args.dtype}) over {r['prompts']} prompts: "
          f"next-token agreement {r['next_token_agreement']:.1%}, greedy sequences identical "
          f"{r['greedy_sequence_match']:.1%} ({args.max_new_tokens} tokens), mean prefix kept "
          f"{r['mean_prefix_kept']:.1%}", flush=True)
    return r
