"""A model's vocabulary as the grammar backend reads it: each token id's bytes as they appear
in the output text.

xgrammar reads an HF tokenizer itself (byte-level BPE such as Llama 3's, SentencePiece with
or without byte fallback); Marian's SentencePiece tokenizer it does not read, so its pieces
are read here. Two things are fixed: a SentencePiece vocabulary without byte fallback (T5,
mT5, Marian) comes back as raw pieces whose `▁` is a space in the text, and special tokens
(`<pad>`, `</s>`, `<|eot_id|>`) would be text the grammar may place inside a string, although
the detokenizer drops them. So the table is rebuilt from the decoded bytes, `▁` as a space
where the pieces are raw, special tokens empty (the backend never allows an empty token); the
model's stop tokens are given per request (`GrammarCache.matcher`).
"""

from __future__ import annotations

import re

import xgrammar as xgr

_SPIECE_SPACE = "\u2581".encode()
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer, vocab_size: int) -> list[bytes]:
    """Each id's bytes in the output (ids past the tokenizer's, a padded LM head's: empty)."""
    try:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    except ValueError:  # a tokenizer class xgrammar does not read (Marian's)
        pieces = _sentencepiece_bytes(tokenizer, vocab_size)
    else:
        pieces = list(info.decoded_vocab)[:vocab_size]
        pieces += [b""] * (vocab_size - len(pieces))
        if info.vocab_type == xgr.VocabType.RAW:
            pieces = [p.replace(_SPIECE_SPACE, b" ") for p in pieces]
    for i in set(getattr(tokenizer, "all_special_ids", ()) or ()):
        if 0 <= i < vocab_size:
            pieces[i] = b""
    return pieces


def _sentencepiece_bytes(tokenizer, vocab_size: int) -> list[bytes]:
    """A SentencePiece vocabulary's pieces as text: `▁` a space, byte pieces (`<0x0A>`) their
    byte."""
    pieces = [b""] * vocab_size
    for piece, i in tokenizer.get_vocab().items():
        if 0 <= i < vocab_size:
            byte = _BYTE_PIECE.fullmatch(piece)
            pieces[i] = (bytes([int(byte.group(1), 16)]) if byte
                         else piece.encode().replace(_SPIECE_SPACE, b" "))
    return pieces


def vocabulary_chars(pieces: list[bytes]) -> frozenset[str]:
    """Every character some token's text contains."""
    chars: set[str] = set()
    for p in pieces:
        chars.update(p.decode("utf-8", errors="ignore"))
    return frozenset(chars)
