"""A training corpus meant to teach a model to continue text it has seen in its context: passages of
the default corpus's training part (CPython's pydoc topics but its last 5%, which
benchmarks/speculative.py's prompts come from), two in three with their words shuffled and then,
after a blank line, the same again. A shuffled passage is new each time, so a model cannot learn it
by heart, only copy it (as an answer that quotes, edits or summarizes its context repeats it).
Measured: a model of 2 million parameters trained on it for 15 minutes on 2 cores does not yet copy
a passage it has never seen (nor one it was trained on), no more than one trained on the corpus as
it is: its greedy output falls into loops instead; nor after 65 minutes, the last 18 on a denser corpus
(--shortest 80 --longest 300 --plain-every 4; benchmarks/copies.py measures it, docs/reports/speculative.md).
A longer training, or a GPU's, is what this corpus is for.

    python -m benchmarks.copy_corpus OUT.txt [--bytes 16000000] [--seed 0] [--shortest 150] [--longest 600]
        [--plain-every 3]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from benchmarks.speculative import corpus_parts

SHORTEST, LONGEST = 150, 600  # a passage's bytes, drawn uniformly
SIZE = 16_000_000  # bytes: more than a 15-minute training reads, so that no drawn passage comes twice


def copy_corpus(
    size: int = SIZE, seed: int = 0, shortest: int = SHORTEST, longest: int = LONGEST, plain_every: int = 3
) -> str:
    """About `size` bytes: passages of `shortest` to `longest` bytes from random places in the text, one in
    `plain_every` as it is, the others with their words shuffled and followed by a blank line and themselves
    again."""
    text, rng = corpus_parts()[0], random.Random(seed)
    out: list[str] = []
    total = 0
    while total < size:
        length = rng.randint(shortest, longest)
        start = rng.randrange(len(text) - length)
        passage = text[start : start + length]
        if len(out) % plain_every:
            words = passage.split(" ")
            rng.shuffle(words)
            passage = " ".join(words)
            passage = f"{passage}\n\n{passage}"
        out.append(passage)
        total += len(passage) + 2
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the text file to write")
    p.add_argument("--bytes", type=int, default=SIZE, help="the corpus's size, about")
    p.add_argument("--seed", type=int, default=0, help="seed of the passages")
    p.add_argument("--shortest", type=int, default=SHORTEST, help=f"a passage's fewest bytes (default: {SHORTEST})")
    p.add_argument("--longest", type=int, default=LONGEST, help=f"a passage's most bytes (default: {LONGEST})")
    p.add_argument("--plain-every", type=int, default=3, help="one passage in this many as it is (default: 3)")
    args = p.parse_args(argv)
    if not 0 < args.shortest <= args.longest or args.plain_every < 1:
        p.error("--shortest must be 1 to --longest, and --plain-every at least 1")
    args.out.write_text(copy_corpus(args.bytes, args.seed, args.shortest, args.longest, args.plain_every))
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
