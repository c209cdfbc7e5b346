"""A training corpus that teaches a small model to continue text it has seen in its context: the default
corpus's training part (CPython's pydoc topics but its last 5%, which benchmarks/speculative.py's
prompts come from) cut into passages, every other passage followed by a blank line and itself again,
as an answer that quotes, edits or summarizes its context repeats it. A model of a few million
parameters trained on it for minutes copies such a passage (the speculative decoding benchmark's
target); trained on the corpus as it is, it does not in that time.

    python -m benchmarks.copy_corpus OUT.txt [--seed 0]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from benchmarks.speculative import HELDOUT

SHORTEST, LONGEST = 150, 600  # a passage's bytes, drawn uniformly


def training_text() -> str:
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in sorted(topics))
    return text[: int(len(text) * (1 - HELDOUT))]


def copy_corpus(seed: int = 0) -> str:
    """The training text in passages of SHORTEST to LONGEST bytes, every other one repeated after a blank line."""
    text, rng, start = training_text(), random.Random(seed), 0
    out: list[str] = []
    while start < len(text):
        passage = text[start : start + rng.randint(SHORTEST, LONGEST)]
        start += len(passage)
        out.append(f"{passage}\n\n{passage}" if len(out) % 2 else passage)
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the text file to write")
    p.add_argument("--seed", type=int, default=0, help="seed of the passages' lengths")
    args = p.parse_args(argv)
    args.out.write_text(copy_corpus(args.seed))
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
