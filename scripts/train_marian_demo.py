#!/usr/bin/env python
"""Train the bundled demo translation model, models/assets/demo-marian-en-de: a small
MarianMTModel (OPUS-MT's architecture: sinusoidal positions, scaled embeddings shared by
the encoder, the decoder and the head, swish feed-forward, pad as the decoder start) that
translates a controlled English into German (tests/toy_translation.py: the grammar and
its exact German).

    "Today, the team builds 3 bridges." -> "Heute baut das Team 3 Brücken."

From scratch on the CPU, on pairs drawn on the fly from the grammar, with a SentencePiece
vocabulary trained here on the grammar's text (digits split, as OPUS-MT's are not: copying a
number is then copying digits) and saved the way OPUS-MT checkpoints ship it (source.spm,
target.spm, vocab.json for MarianTokenizer). A disjoint ~2 % of the sentences
(`is_held_out`) is never trained on; the script reports exact-match accuracy on them, greedy
and with 4 beams, from the directory it wrote, reloaded with
MarianMTModel.from_pretrained, and writes the figures into the directory's README.

    python scripts/train_marian_demo.py          # the bundled model (~25 min on 2 cores)
    python scripts/train_marian_demo.py --steps 200 --out /tmp/marian-quick --min-accuracy 0

Deterministic for a given seed and thread count.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see scripts/train_demo.py

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "models" / "assets" / "demo-marian-en-de"


_spec = importlib.util.spec_from_file_location("training", Path(__file__).with_name("training.py"))
training = importlib.util.module_from_spec(_spec)  # scripts/training.py (scripts/ is no package)
_spec.loader.exec_module(training)
toy = training.load_script("toy_translation", REPO / "tests")  # the task and its oracle
bart_checkpoints = training.load_script("bart_checkpoints", REPO / "tests")  # OPUS-MT's files


# --- the vocabulary ------------------------------------------------------------------------------
def build_tokenizer(out: Path, vocab_size: int, seed: int):
    """A unigram SentencePiece model over both sides of 30,000 training pairs (digits split,
    every character kept), written as OPUS-MT's files; the MarianTokenizer over them."""
    import sentencepiece as spm

    gen = toy.Toy(seed + 1000)
    corpus = [s for _ in range(30000) for s in gen.training_pair()]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=buf, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, split_digits=True, minloglevel=2,
        pad_id=-1, bos_id=-1, eos_id=-1, unk_id=0, hard_vocab_limit=False)
    return bart_checkpoints.marian_tokenizer_files(buf.getvalue(), out)


def build_model(args, tok):
    from transformers import MarianConfig, MarianMTModel

    pad = tok.pad_token_id
    config = MarianConfig(
        vocab_size=len(tok), d_model=args.d_model, encoder_layers=args.layers,
        decoder_layers=args.layers, encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads, encoder_ffn_dim=args.d_ff,
        decoder_ffn_dim=args.d_ff, activation_function="swish", scale_embedding=True,
        max_position_embeddings=256, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, pad_token_id=pad, decoder_start_token_id=pad,
        eos_token_id=tok.eos_token_id, forced_eos_token_id=None, bos_token_id=None,
        tie_word_embeddings=True, share_encoder_decoder_embeddings=True)
    torch.manual_seed(args.seed)
    return MarianMTModel(config)


def encode(tok, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    enc = tok([en for en, _ in pairs], padding=True, return_tensors="pt")
    labels = tok(text_target=[de for _, de in pairs], padding=True,
                 return_tensors="pt").input_ids
    labels[labels == tok.pad_token_id] = -100
    return {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask,
            "labels": labels}


# --- evaluation ----------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, tok, pairs: list[tuple[str, str]], num_beams: int = 1,
             batch_size: int = 200) -> dict:
    """Exact match of the decoded German."""
    model.eval()
    correct, wrong = 0, []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i:i + batch_size]
        enc = tok([en for en, _ in chunk], padding=True, return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=64, num_beams=num_beams, do_sample=False)
        for (en, de), text in zip(chunk, tok.batch_decode(out, skip_special_tokens=True)):
            if text == de:
                correct += 1
            elif len(wrong) < 8:
                wrong.append((en, text))
    model.train()
    return {"n": len(pairs), "correct": correct, "accuracy": correct / len(pairs),
            "wrong": wrong}


# --- checkpoint ----------------------------------------------------------------------------------
def save(model, tok, out: Path, dtype: str, num_beams: int) -> int:
    from transformers import GenerationConfig

    model.to(getattr(torch, dtype)).save_pretrained(str(out))
    model.to(torch.float32)
    tok.save_pretrained(str(out))
    pad = model.config.pad_token_id
    GenerationConfig(decoder_start_token_id=pad, pad_token_id=pad,
                     eos_token_id=model.config.eos_token_id, max_length=128,
                     num_beams=num_beams, bad_words_ids=[[pad]]).save_pretrained(str(out))
    return (out / "model.safetensors").stat().st_size


def write_readme(out: Path, args, info: dict) -> None:
    g, b = info["greedy"], info["beams"]
    (out / "README.md").write_text(f"""# demo-marian-en-de: a small trained Marian that translates a controlled English into German

The translation model seq2serve ships, so that documents, glossaries, alternatives and
prefixes are tested end to end on a model with meaning. It is OPUS-MT's architecture
(`MarianMTModel`: sinusoidal positions, scaled embeddings shared by encoder, decoder and
head, swish feed-forward, pad as the decoder start, `bad_words_ids` = pad) with OPUS-MT's
tokenizer files (`source.spm`, `target.spm`, `vocab.json`), trained from scratch on one
synthetic task with an exact answer: the controlled English of `tests/toy_translation.py`
into German. Nouns with gender and plural, adjectives with their endings, three cases,
verb agreement, the verb second after a fronted adverb, questions, `nicht`, `gibt es`;
names and numbers (digits) are copied.

    Today, the small workers build 3 red bridges.  ->  Heute bauen die kleinen Arbeiter 3 rote Brücken.
    Does Anna see the ship in the old garden?      ->  Sieht Anna das Schiff im alten Garten?

It knows only the vocabulary and the sentence forms of that grammar (about 40 nouns, 12
adjectives, 14 verbs, 16 names); anything else comes out as grammar-shaped nonsense.

```bash
seq2serve serve --model-path models/assets/demo-marian-en-de --device cpu
curl -s localhost:30000/v1/translations -H 'content-type: application/json' \\
  -d '{{"input": "Today, the team builds 3 bridges. Do the workers see the ship?", "source_lang": "en", "target_lang": "de"}}'
```

| | |
|---|---|
| sizes | d_model {args.d_model}, {args.layers} encoder + {args.layers} decoder layers, {args.heads} heads, d_ff {args.d_ff}, vocabulary {info["vocab"]:,} (SentencePiece unigram, digits split) |
| parameters | {info["params"]:,} |
| weights | `model.safetensors`, {args.save_dtype}, {info["weights_bytes"]:,} bytes |
| training | {args.steps:,} steps x {args.batch_size} pairs, AdamW, seed {args.seed}, {args.threads} CPU threads, {info["train_minutes"]:.1f} min on the machine it was made on |
| held-out exact match, greedy | **{g["correct"]}/{g["n"]} = {100 * g["accuracy"]:.2f}%** |
| held-out exact match, 4 beams (the default: `generation_config.json`'s `num_beams`) | **{b["correct"]}/{b["n"]} = {100 * b["accuracy"]:.2f}%** |

Measured on this directory reloaded with `MarianMTModel.from_pretrained`, on {g["n"]:,}
distinct held-out sentences (`is_held_out` in `tests/toy_translation.py`: a hash of the
English mod 50 == 0; never trained on). Made by `scripts/train_marian_demo.py`, run from
the repository root with the project's virtualenv (torch {torch.__version__}, transformers
{info["transformers"]}):

```bash
python scripts/train_marian_demo.py{info["command_args"]}
```

## Licence

Weights and vocabulary were trained from scratch by the script above on synthetic data and
are released with seq2serve under Apache-2.0.
""")


# --- main ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--steps", type=int, default=2500)
    p.add_argument("--batch-size", type=int, default=96)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--d-model", type=int, default=192)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=768)
    p.add_argument("--layers", type=int, default=3, help="encoder layers = decoder layers")
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--num-beams", type=int, default=4, help="generation_config's num_beams")
    p.add_argument("--save-dtype", default="float16",
                   choices=("float32", "float16", "bfloat16"))
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-size", type=int, default=200)
    p.add_argument("--final-eval-size", type=int, default=1000)
    p.add_argument("--min-accuracy", type=float, default=0.95,
                   help="exit 1 when the reloaded model's greedy held-out accuracy is lower")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    import transformers
    from transformers import MarianMTModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tok = build_tokenizer(args.out, args.vocab_size, args.seed)
    gen = toy.Toy(args.seed)
    for _ in range(200):  # the tokenizer must give the reference text back exactly
        en, de = gen.pair()
        for text in (en, de):
            assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text, text
    model = build_model(args, tok)
    model.train()
    n_params = sum(q.numel() for q in model.parameters())
    print(f"vocab {len(tok)}, params {n_params:,}", flush=True)
    monitor = toy.Toy(10_001).held_out_pairs(args.eval_size)
    final = toy.Toy(10_002).held_out_pairs(args.final_eval_size)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9,
                            weight_decay=0.0)


    trainer = training.Trainer(model, opt, args)
    for step in range(args.steps):
        batch = encode(tok, [gen.training_pair() for _ in range(args.batch_size)])
        trainer.before(step)
        loss = model(**batch).loss
        trainer.after(step, loss)
        if (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            ev = evaluate(model, tok, monitor)
            print(f"  held-out {ev['correct']}/{ev['n']} = {100 * ev['accuracy']:.1f}%  "
                  f"e.g. {ev['wrong'][:2]}", flush=True)
    train_s = trainer.seconds
    print(f"trained in {train_s / 60:.1f} min", flush=True)

    size = save(model, tok, args.out, args.save_dtype, args.num_beams)
    reloaded = MarianMTModel.from_pretrained(str(args.out), dtype=torch.float32)
    greedy = evaluate(reloaded, tok, final)
    beams = evaluate(reloaded, tok, final, num_beams=4)
    for name, ev in (("greedy", greedy), ("4 beams", beams)):
        print(f"held-out ({name}, reloaded): {ev['correct']}/{ev['n']} = "
              f"{100 * ev['accuracy']:.2f}%; wrong e.g. {ev['wrong'][:4]}", flush=True)

    command_args = training.command_args(p, args, DEFAULT_OUT)
    write_readme(args.out, args, {
        "greedy": greedy, "beams": beams, "params": n_params, "vocab": len(tok),
        "weights_bytes": size, "train_minutes": train_s / 60,
        "transformers": transformers.__version__, "command_args": command_args})
    if greedy["accuracy"] < args.min_accuracy:
        print(f"held-out accuracy below --min-accuracy {args.min_accuracy}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
