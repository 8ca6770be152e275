#!/usr/bin/env python
"""Train the bundled demo model, models/assets/demo-t5-numbers: a small T5 v1.1-architecture
T5ForConditionalGeneration (gated-GELU, RMS norm, relative position bias, tied embeddings)
that writes numbers in words:

    "translate digits to English: 1984" -> "one thousand nine hundred eighty-four"

From scratch on the CPU, on data made on the fly from the exact answer
(tests/number_words.py), with the real T5 tokenizer (models/assets/t5-tokenizer) that the
runtime uses. A disjoint ~2% of the numbers (tests/number_words.is_held_out) is never
trained on; the script reports greedy exact-match accuracy on them, first from the model in
memory and then from the directory it wrote, reloaded with
T5ForConditionalGeneration.from_pretrained, and writes that figure into the README.

    python scripts/train_demo.py     # the bundled model (about 20 min on 2 cores)
    python scripts/train_demo.py --steps 300 --out /tmp/demo-quick --min-accuracy 0  # a smoke run

Deterministic for a given seed and thread count (torch.set_num_threads(--threads)).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import sys
from pathlib import Path

# OpenMP threads that sleep instead of spinning while they wait: on a shared or busy machine
# spinning threads make every step many times slower; on an idle one it costs next to nothing
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TOKENIZER_DIR = REPO / "models" / "assets" / "t5-tokenizer"
DEFAULT_OUT = REPO / "models" / "assets" / "demo-t5-numbers"
TEMPLATE = "translate {source_lang} to {target_lang}: {text}"  # goes into seq2serve.json
SOURCE_LANG, TARGET_LANG = "digits", "English"


_spec = importlib.util.spec_from_file_location("training", Path(__file__).with_name("training.py"))
training = importlib.util.module_from_spec(_spec)  # scripts/training.py (scripts/ is no package)
_spec.loader.exec_module(training)
nw = training.load_script("number_words", REPO / "tests")  # the tests' reference, by path


def prompt(n: int) -> str:
    return TEMPLATE.format(source_lang=SOURCE_LANG, target_lang=TARGET_LANG, text=str(n))


# --- data ------------------------------------------------------------------------------------
class NumberSampler:
    """Training numbers, never held-out ones. The digit count is drawn first (longer numbers
    more often, but short ones are not starved as under a uniform draw), then either a
    uniform number of that length or, a third of the time, one rich in zeros (round numbers
    and inner zeros: 100000, 20005, 7010 — the words skip those parts)."""

    def __init__(self, rng: random.Random, max_digits: int, negative_fraction: float):
        self.rng = rng
        self.max_digits = max_digits
        self.negative_fraction = negative_fraction
        self.weights = [min(k, 6) ** 1.3 for k in range(1, max_digits + 1)]

    def draw(self) -> int:
        rng = self.rng
        while True:
            k = rng.choices(range(1, self.max_digits + 1), weights=self.weights)[0]
            if k == 1:
                n = rng.randint(0, 9)
            elif rng.random() < 1 / 3:
                p_zero = rng.choice((0.3, 0.6, 0.9))
                digits = [rng.randint(1, 9)] + [0 if rng.random() < p_zero else rng.randint(0, 9)
                                                for _ in range(k - 1)]
                n = int("".join(map(str, digits)))
            else:
                n = rng.randint(10 ** (k - 1), 10**k - 1)
            if self.negative_fraction and n and rng.random() < self.negative_fraction:
                n = -n
            if not nw.is_held_out(n):
                return n


def encode_batch(tokenizer, numbers: list[int]) -> dict[str, torch.Tensor]:
    enc = tokenizer([prompt(n) for n in numbers], padding=True, return_tensors="pt")
    labels = tokenizer([nw.number_to_words(n) for n in numbers], padding=True,
                       return_tensors="pt").input_ids
    labels[labels == tokenizer.pad_token_id] = -100
    return {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "labels": labels}


def train_loss(model, batch: dict[str, torch.Tensor],
               candidates: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy at the real target positions (the head does no work on padding): what
    T5ForConditionalGeneration(labels=) computes. Over the full 32,128-token vocabulary when
    `candidates` is None; else over those token ids only (sorted, holding every target), a
    sampled softmax that skips most of the head's cost."""
    labels = batch["labels"]
    enc = model.encoder(input_ids=batch["input_ids"],
                        attention_mask=batch["attention_mask"]).last_hidden_state
    dec = model.decoder(input_ids=model._shift_right(labels), encoder_hidden_states=enc,
                        encoder_attention_mask=batch["attention_mask"]).last_hidden_state
    valid = labels != -100
    hidden = dec[valid] * model.model_dim**-0.5  # tied head: T5's scale_decoder_outputs
    target = labels[valid]
    if candidates is None:
        logits = model.lm_head(hidden)
    else:
        logits = hidden @ model.lm_head.weight[candidates].t()
        target = torch.searchsorted(candidates, target)
    return torch.nn.functional.cross_entropy(logits.float(), target)


class Candidates:
    """The sampled softmax's token ids for one step: every token seen so far in a prompt or
    an answer (the ones a wrong answer is likely to be) plus `k` drawn from the rest of the
    vocabulary, so that each unused token keeps being pushed down."""

    def __init__(self, vocab_size: int, k: int, generator: torch.Generator):
        self.seen = torch.zeros(vocab_size, dtype=torch.bool)
        self.k, self.generator, self.vocab_size = k, generator, vocab_size

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.seen[batch["input_ids"].flatten()] = True
        self.seen[batch["labels"][batch["labels"] != -100]] = True
        mask = self.seen.clone()
        mask[torch.randint(self.vocab_size, (self.k,), generator=self.generator)] = True
        return mask.nonzero().squeeze(1)


# --- evaluation ------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, tokenizer, numbers: list[int], batch_size: int = 256,
             max_new_tokens: int = 40) -> dict:
    """Greedy exact match of the decoded text, and whether every answer ended with EOS."""
    model.eval()
    correct, stopped, wrong = 0, 0, []
    for i in range(0, len(numbers), batch_size):
        chunk = numbers[i:i + batch_size]
        enc = tokenizer([prompt(n) for n in chunk], padding=True, return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             num_beams=1)
        for n, ids in zip(chunk, out.tolist()):
            ids = ids[1:]  # the decoder start token
            stopped += tokenizer.eos_token_id in ids
            text = tokenizer.decode(ids, skip_special_tokens=True)
            if text == nw.number_to_words(n):
                correct += 1
            elif len(wrong) < 10:
                wrong.append((n, text))
    model.train()
    return {"n": len(numbers), "correct": correct, "accuracy": correct / len(numbers),
            "stopped": stopped, "wrong": wrong}


# --- model and checkpoint --------------------------------------------------------------------
def build_model(args):
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=32128, d_model=args.d_model, d_kv=args.d_kv, d_ff=args.d_ff,
        num_layers=args.layers, num_decoder_layers=args.layers, num_heads=args.heads,
        relative_attention_num_buckets=32, relative_attention_max_distance=128,
        dropout_rate=0.0, layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu",
        tie_word_embeddings=True, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(args.seed)
    return T5ForConditionalGeneration(config)


def save_checkpoint(model, out: Path, dtype: str) -> int:
    """config.json + model.safetensors (tied: shared.weight is the head, with T5's
    d_model**-0.5 scaling) + tokenizer + seq2serve.json. Returns the weights file's size."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(getattr(torch, dtype)).contiguous()
             for k, v in model.state_dict().items()
             if k not in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                          "lm_head.weight")}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("torch_dtype", None)
    cfg.update(architectures=["T5ForConditionalGeneration"], model_type="t5",
               tie_word_embeddings=True, scale_decoder_outputs=True, dtype=dtype,
               decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_DIR / name, out / name)
    (out / "seq2serve.json").write_text(
        json.dumps({"translation_template": TEMPLATE}, indent=2) + "\n")
    return (out / "model.safetensors").stat().st_size


def write_readme(out: Path, args, info: dict) -> None:
    cmd = "python scripts/train_demo.py" + info["command_args"]
    ev = info["eval"]
    text = f"""# demo-t5-numbers: a tiny trained T5 that writes numbers in words

The model `seq2serve` ships so that a first `seq2serve serve` gives real answers. It is a
T5 v1.1-architecture `T5ForConditionalGeneration` (gated-GELU feed-forward, RMS norm,
relative position bias, embeddings tied to the head with T5's `d_model**-0.5` scaling),
trained from scratch on one synthetic task with an exact answer: integers written in digits
to American English words (hyphens for 21-99, no "and", "zero" for 0{info["negatives_note"]}).

    translate digits to English: 1984  ->  one thousand nine hundred eighty-four

Inputs: plain digits {info["range_note"]}, no commas or spaces. With the runtime, use
`source_lang="digits"`, `target_lang="English"` (this directory's `seq2serve.json` holds the
prompt template):

```bash
seq2serve serve --model-path models/assets/demo-t5-numbers --device cpu
curl -s localhost:30000/v1/translations -H 'content-type: application/json' \\
  -d '{{"input": ["1984", "42"], "source_lang": "digits", "target_lang": "English"}}'
```

It knows nothing else: any other prompt gets number-like nonsense.

| | |
|---|---|
| sizes | d_model {args.d_model}, {args.layers} encoder + {args.layers} decoder layers, {args.heads} heads x d_kv {args.d_kv}, d_ff {args.d_ff}, vocab 32,128 (T5 v1.1 convention; the tokenizer has 32,100) |
| parameters | {info["params"]:,} ({info["params_non_embedding"]:,} outside the embedding) |
| weights | `model.safetensors`, {args.save_dtype}, {info["weights_bytes"]:,} bytes |
| training | {args.steps:,} steps x {args.batch_size} examples, AdamW, seed {args.seed}, {args.threads} CPU threads, {info["train_minutes"]:.1f} min on the machine it was made on |
| held-out accuracy | **{ev["correct"]}/{ev["n"]} = {100 * ev["accuracy"]:.2f}%** exact match, greedy, measured on this directory reloaded with `T5ForConditionalGeneration.from_pretrained` |

Made by `scripts/train_demo.py` in the seq2serve repository, run from the repository root
with the project's virtualenv (torch {torch.__version__}, transformers {info["transformers"]}):

```bash
{cmd}
```

The held-out numbers (`is_held_out` in `tests/number_words.py`: a hash of the decimal string
mod 50 == 0, about 2% of them) are never trained on; the accuracy above is on
{info["eval_desc"]}. `tests/test_demo_model.py` checks the same through the server.

## Licence

The tokenizer files (`tokenizer.json`, `tokenizer_config.json`) are the T5 SentencePiece
vocabulary, Apache-2.0 (see `models/assets/README.md` for where they come from). The weights
were trained from scratch by the script above on synthetic data and are released with
seq2serve under Apache-2.0.
"""
    (out / "README.md").write_text(text)


# --- main ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--d-model", type=int, default=96)
    p.add_argument("--d-kv", type=int, default=24)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=256)
    p.add_argument("--layers", type=int, default=3, help="encoder layers = decoder layers")
    p.add_argument("--max-digits", type=int, default=6)
    p.add_argument("--negative-fraction", type=float, default=0.15,
                   help="share of the training numbers made negative (\"negative forty-two\")")
    p.add_argument("--bf16-fraction", type=float, default=0.8,
                   help="the first fraction of the steps runs under bfloat16 autocast "
                        "(much faster on CPUs with avx512_bf16/AMX); the rest in float32")
    p.add_argument("--negatives", type=int, default=2048,
                   help="sampled softmax: random vocabulary entries per step besides the "
                        "tokens of the task")
    p.add_argument("--full-every", type=int, default=10,
                   help="every this many steps, the loss runs over the full vocabulary")
    p.add_argument("--full-fraction", type=float, default=0.1,
                   help="the last fraction of the steps all use the full vocabulary")
    p.add_argument("--save-dtype", default="float16",
                   choices=("float32", "float16", "bfloat16"))
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-size", type=int, default=300, help="held-out numbers per eval")
    p.add_argument("--final-eval-size", type=int, default=5000)
    p.add_argument("--min-accuracy", type=float, default=0.99,
                   help="exit 1 when the reloaded model's held-out accuracy is lower")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    import transformers
    from transformers import AutoTokenizer, T5ForConditionalGeneration
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    high = 10**args.max_digits - 1
    # the tokenizer must give back the reference text exactly, or exact match is meaningless
    for n in [0, 7, 42, 100, 1984, 20005, 999_999, high, -high, 18_000_070]:
        words = nw.number_to_words(n)
        assert tokenizer.decode(tokenizer(words).input_ids, skip_special_tokens=True) == words

    model = build_model(args)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    n_emb = model.shared.weight.numel()
    print(f"params {n_params:,} (embedding {n_emb:,}, rest {n_params - n_emb:,})", flush=True)
    monitor = nw.held_out_numbers(args.eval_size, seed=1, high=high,
                                  negative_fraction=args.negative_fraction)
    final_set = nw.held_out_numbers(args.final_eval_size, seed=2, high=high,
                                    negative_fraction=args.negative_fraction)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-8,
                            weight_decay=0.0)


    sampler = NumberSampler(rng, args.max_digits, args.negative_fraction)
    bf16_steps = int(args.bf16_fraction * args.steps)
    sampled_steps = int((1 - args.full_fraction) * args.steps)
    candidates = Candidates(model.config.vocab_size, args.negatives,
                            torch.Generator().manual_seed(args.seed))
    trainer = training.Trainer(model, opt, args)
    for step in range(args.steps):
        batch = encode_batch(tokenizer, [sampler.draw() for _ in range(args.batch_size)])
        trainer.before(step)
        full = step >= sampled_steps or (step + 1) % args.full_every == 0
        cand = None if full else candidates(batch)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=step < bf16_steps):
            loss = train_loss(model, batch, cand)
        trainer.after(step, loss)
        if (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            ev = evaluate(model, tokenizer, monitor)
            print(f"  held-out {ev['correct']}/{ev['n']} = {100 * ev['accuracy']:.1f}%  "
                  f"e.g. {ev['wrong'][:3]}", flush=True)
    train_s = trainer.seconds
    print(f"trained in {train_s / 60:.1f} min", flush=True)

    ev = evaluate(model, tokenizer, final_set)
    print(f"held-out (in memory): {ev['correct']}/{ev['n']} = {100 * ev['accuracy']:.2f}%, "
          f"{ev['stopped']} stopped with EOS; wrong e.g. {ev['wrong']}", flush=True)

    size = save_checkpoint(model, args.out, args.save_dtype)
    print(f"wrote {args.out} (model.safetensors {size:,} bytes)", flush=True)
    reloaded = T5ForConditionalGeneration.from_pretrained(args.out, dtype=torch.float32)
    ev = evaluate(reloaded, tokenizer, final_set)
    print(f"held-out (reloaded, {args.save_dtype} weights): {ev['correct']}/{ev['n']} = "
          f"{100 * ev['accuracy']:.2f}%, {ev['stopped']} stopped with EOS; "
          f"wrong e.g. {ev['wrong']}", flush=True)

    command_args = training.command_args(p, args, DEFAULT_OUT)
    small = sum(0 <= n < 1000 for n in final_set)
    negative = sum(n < 0 for n in final_set)
    write_readme(args.out, args, {
        "command_args": command_args, "eval": ev, "params": n_params,
        "transformers": transformers.__version__,
        "params_non_embedding": n_params - n_emb, "weights_bytes": size,
        "train_minutes": train_s / 60,
        "negatives_note": ', "negative" before negative numbers' if args.negative_fraction
        else "",
        "range_note": f"from {-high:,} to {high:,}" if args.negative_fraction
        else f"from 0 to {high:,}",
        "eval_desc": f"{ev['n']:,} held-out numbers: all {small} held-out ones below 1,000 and "
                     f"a draw spread over the digit counts ({negative} of them negative)"})
    if ev["accuracy"] < args.min_accuracy:
        print(f"held-out accuracy below --min-accuracy {args.min_accuracy}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
