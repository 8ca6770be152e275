"""Whisper tokenizers made here, without a download: GPT-2's 256 byte-level symbols, a few
merges, optionally filler symbols up to a real vocabulary's size, then Whisper's special
tokens in Whisper's order (end of text, start of transcript, the languages, translate,
transcribe, start of LM, start of previous, no speech, no timestamps) and optionally the
1,501 timestamp tokens. The tiny test checkpoints (tests/whisper_checkpoints.py) and the
benchmark shapes (runtime/bench/shapes.py: whisper-large-v3's 51,866 ids, each special token
at its real id) are both written by `write_whisper_tokenizer`."""

from __future__ import annotations

import json
from pathlib import Path

# a few merges, so that text encodes to fewer tokens than bytes
MERGES = ("Ġ t", "h e", "Ġt he", "Ġ a", "i n", "e r", "o n", "Ġ s")
STAMPS = 1501  # <|0.00|> to <|30.00|>


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet (the one Whisper's tokenizer uses): byte -> symbol, in
    GPT-2's vocabulary order (the space, "Ġ", is id 220 as in Whisper's)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def special_tokens(languages: tuple[str, ...]) -> list[str]:
    """Whisper's special tokens in its vocabulary's order (no language tokens for an
    English-only model: `languages` empty)."""
    return ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{c}|>" for c in languages),
            "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
            "<|nospeech|>", "<|notimestamps|>"]


def write_whisper_tokenizer(out: Path, languages: tuple[str, ...], timestamps: bool = False,
                            text_tokens: int | None = None,
                            merges: tuple[str, ...] = MERGES) -> dict[str, int]:
    """Writes a `WhisperTokenizer` to `out`; returns each special token's id.

    `text_tokens`: the ordinary vocabulary's size (the first special token's id: 50,257 in
    the multilingual Whisper's, 50,256 in the English-only ones'), filled past the byte
    symbols and merges with two-symbol tokens that no merge makes (decodable, never
    produced by encoding). With `timestamps`, the vocabulary ends with the timestamp tokens
    (ordinary added tokens after the specials, as the released tokenizers have them)."""
    from tokenizers import AddedToken
    from transformers import WhisperTokenizer

    out.mkdir(parents=True, exist_ok=True)
    alphabet = list(bytes_to_unicode().values())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for merge in merges:
        vocab["".join(merge.split())] = len(vocab)
    if text_tokens is not None:
        fillers = (a + b for a in alphabet for b in alphabet)
        while len(vocab) < text_tokens:
            filler = next(fillers)
            vocab.setdefault(filler, len(vocab))
    specials = {tok: len(vocab) + i for i, tok in enumerate(special_tokens(languages))}
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tok = WhisperTokenizer(str(out / "vocab.json"), str(out / "merges.txt"),
                           bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                           unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_tokens(list(specials), special_tokens=True)
    if tok.convert_tokens_to_ids(list(specials)) != list(specials.values()):
        raise RuntimeError("the special tokens did not get the ids of Whisper's order")
    if timestamps:  # the released tokenizers' specials (HF's offsets start after the last)
        stamps = [f"<|{i * 0.02:.2f}|>" for i in range(STAMPS)]
        tok.add_special_tokens({"additional_special_tokens": list(specials)})
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in stamps])
    tok.save_pretrained(out)
    return specials
