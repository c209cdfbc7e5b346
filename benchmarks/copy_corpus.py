"""A training corpus meant to teach a model to continue text it has seen in its context: passages of
the default corpus's training part (CPython's pydoc topics but its last 5%, which
benchmarks/speculative.py's prompts come from), two in three with their words shuffled and then,
after a blank line, the same again. A shuffled passage is new each time, so a model cannot learn it
by heart, only copy it (as an answer that quotes, edits or summarizes its context repeats it).
Measured: a model of 2 million parameters trained on it for 15 minutes on 2 cores does not yet copy
a passage it has never seen (nor one it was trained on), no more than one trained on the corpus as
it is: its greedy output falls into loops instead; nor after 65 minutes, the last 18 on a denser corpus
(--shortest 80 --longest 300 --plain-every 4; benchmarks/copies.py measures it, docs/reports/speculative.md).
What teaches it: rotary positions, and first runs of random ids listed twice (--random-ids: random_runs),
then this corpus.

    python -m benchmarks.copy_corpus OUT.txt [--bytes 16000000] [--seed 0] [--shortest 150] [--longest 600]
        [--plain-every 3]
    python -m benchmarks.copy_corpus OUT.txt --random-ids CHECKPOINT [--bytes 16000000] [--seed 0]
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


def random_runs(checkpoint: str, size: int = SIZE, seed: int = 0, shortest: int = 8, longest: int = 23) -> str:
    """About `size` bytes of runs of `shortest` to `longest` ids drawn uniformly from the tokenizer of
    `checkpoint` (those that are text by themselves and encode back to themselves), each run's text twice
    in a row: the second is predictable only by copying the first. A model with rotary positions learns to
    copy on these within about 1,500 steps, where none here did on the copy corpus alone in 1,500 to 3,500
    (benchmarks/copy_probe.py, docs/reports/speculative.md); resumed on the copy corpus after, it copies
    text. Train on it with --resume from a checkpoint of that tokenizer (a one-step run on the copy corpus)."""
    from attnserve.model.checkpoint import load_state
    from attnserve.tokenizer import from_state

    tokenizer, rng = from_state(load_state(checkpoint).get("tokenizer")), random.Random(seed)
    pieces = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
    usable = [p for i, p in enumerate(pieces) if p and "\ufffd" not in p and tokenizer.encode(p) == [i]]
    out: list[str] = []
    total = 0
    while total < size:
        run = "".join(rng.choice(usable) for _ in range(rng.randint(shortest, longest)))
        out.append(run + run)
        total += 2 * len(run)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the text file to write")
    p.add_argument("--bytes", type=int, default=SIZE, help="the corpus's size, about")
    p.add_argument("--seed", type=int, default=0, help="seed of the passages")
    p.add_argument("--shortest", type=int, default=SHORTEST, help=f"a passage's fewest bytes (default: {SHORTEST})")
    p.add_argument("--longest", type=int, default=LONGEST, help=f"a passage's most bytes (default: {LONGEST})")
    p.add_argument("--plain-every", type=int, default=3, help="one passage in this many as it is (default: 3)")
    p.add_argument(
        "--random-ids",
        metavar="CHECKPOINT",
        default=None,
        help="instead: runs of 8 to 23 ids drawn from CHECKPOINT's tokenizer, each twice (random_runs)",
    )
    args = p.parse_args(argv)
    if args.random_ids is not None:
        args.out.write_text(random_runs(args.random_ids, args.bytes, args.seed))
        print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")
        return 0
    if not 0 < args.shortest <= args.longest or args.plain_every < 1:
        p.error("--shortest must be 1 to --longest, and --plain-every at least 1")
    args.out.write_text(copy_corpus(args.bytes, args.seed, args.shortest, args.longest, args.plain_every))
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
