"""The default encoder-decoder task: numbers into English words ("4021" -> "four thousand twenty-one").

Generated on the fly, so it needs no download; a fixed, hashed split keeps held-out numbers out
of training. Also reads a user's own task from a tab-separated file of source/target pairs.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
SCALES = [(10**9, "billion"), (10**6, "million"), (1000, "thousand")]
MAX_NUMBER = 999_999_999
MAX_DIGITS = 6  # the default task: 0 .. 999,999 (targets up to 58 characters)


def below_thousand(n: int) -> str:
    words = []
    if n >= 100:
        words.append(f"{ONES[n // 100]} hundred")
        n %= 100
    if n >= 20:
        words.append(TENS[n // 10] + (f"-{ONES[n % 10]}" if n % 10 else ""))
    elif n or not words:
        words.append(ONES[n])
    return " ".join(words)


def number_to_words(n: int) -> str:
    """American English without "and": 4021 -> "four thousand twenty-one"."""
    if not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"number must be in 0..{MAX_NUMBER}, got {n}")
    if n == 0:
        return "zero"
    words = []
    for scale, name in SCALES:
        if n >= scale:
            words.append(f"{below_thousand(n // scale)} {name}")
            n %= scale
    if n:
        words.append(below_thousand(n))
    return " ".join(words)


def is_heldout(n: int, percent: int = 5) -> bool:
    """A fixed split by hash: the same numbers are held out in every run."""
    return zlib.crc32(str(n).encode()) % 100 < percent


def sample_number(rng: random.Random) -> int:
    """Numbers of 1 to MAX_DIGITS digits, each length equally likely, so short ones are seen often."""
    digits = rng.randint(1, MAX_DIGITS)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def number_pairs(count: int, heldout: bool, seed: int) -> list[tuple[str, str]]:
    """`count` (digits, words) pairs from the training or the held-out side of the split."""
    rng, pairs = random.Random(seed), list[tuple[str, str]]()
    while len(pairs) < count:
        n = sample_number(rng)
        if is_heldout(n) == heldout:
            pairs.append((str(n), number_to_words(n)))
    return pairs


def read_pairs(path: str | Path) -> list[tuple[str, str]]:
    """Source/target pairs of a tab-separated file; raises ValueError naming the bad line."""
    pairs = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0] or not fields[1]:
            raise ValueError(f"{path}:{i}: expected 'source<TAB>target', got {line[:60]!r}")
        pairs.append((fields[0], fields[1]))
    if not pairs:
        raise ValueError(f"{path} has no source/target pairs")
    return pairs
