"""Integers in American English words, and the held-out split of the bundled demo model.

Shared by scripts/train_demo.py (which trains models/assets/demo-t5-numbers on this task)
and tests/test_demo_model.py (which checks the trained model against it). Pure Python, no
dependencies: the reference answer is computed here, never by a model.

Style: 1984 -> "one thousand nine hundred eighty-four"; hyphens for 21..99 ("forty-two"),
no "and", no commas, "zero" for 0, "negative" before negative numbers.
"""

from __future__ import annotations

import hashlib

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
        "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
        "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
SCALES = [(10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (10**3, "thousand")]

HELD_OUT_MODULUS = 50


def _below_thousand(n: int) -> list[str]:
    """Words for 1..999 (empty for 0)."""
    words = []
    hundreds, rest = divmod(n, 100)
    if hundreds:
        words += [ONES[hundreds], "hundred"]
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(TENS[tens] + (f"-{ONES[ones]}" if ones else ""))
    elif rest:
        words.append(ONES[rest])
    return words


def number_to_words(n: int) -> str:
    """`n` (|n| < 10**15) in words: 1984 -> "one thousand nine hundred eighty-four"."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"expected an int, got {type(n).__name__}")
    if abs(n) >= 10**15:
        raise ValueError(f"{n} is out of range (|n| < 10**15)")
    if n == 0:
        return "zero"
    if n < 0:
        return "negative " + number_to_words(-n)
    words = []
    for value, name in SCALES:
        count, n = divmod(n, value)
        if count:
            words += _below_thousand(count) + [name]
    words += _below_thousand(n)
    return " ".join(words)


def is_held_out(n: int) -> bool:
    """The demo model's evaluation split: about 1 number in 50 (by a hash of its decimal
    string), never used for training. Negative numbers hash with their sign, so -n and n
    fall independently."""
    digest = hashlib.blake2b(str(n).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % HELD_OUT_MODULUS == 0


def held_out_numbers(count: int, seed: int = 0, low: int = 0, high: int = 999_999,
                     negative_fraction: float = 0.0) -> list[int]:
    """`count` distinct held-out numbers: every held-out number below 1000 first (the small
    ones a person tries by hand), then a deterministic pseudo-random draw from [low, high],
    spread over the digit counts so that short numbers are not swamped by long ones."""
    import random

    rng = random.Random(seed)
    out: list[int] = [n for n in range(max(low, 0), min(high, 999) + 1) if is_held_out(n)]
    out = out[:count]
    seen = set(out)
    max_digits = len(str(high))
    attempts = 0
    while len(out) < count:
        attempts += 1
        if attempts > 1000 * count:
            raise ValueError("range too small for that many held-out numbers")
        digits = rng.randint(1, max_digits)
        lo, hi = max(low, 10 ** (digits - 1) if digits > 1 else 0), min(high, 10**digits - 1)
        if lo > hi:
            continue
        n = rng.randint(lo, hi)
        if negative_fraction and rng.random() < negative_fraction:
            n = -n
        if n not in seen and is_held_out(n):
            seen.add(n)
            out.append(n)
    return out
