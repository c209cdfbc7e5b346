"""How soon does a decoder learn to copy from its context? The lectures' model (2 layers, width 64, 4
heads, 128 positions, 2,048 ids) trained in PyTorch on windows of uniformly random ids, each run of 8 to 23
ids listed twice in a row: the second listing is predictable only by copying the first. Prints the training
loss in nats every 100 steps: ln 2048 = 7.62 where nothing is copied, about 4.1 where every second listing
is (its first id still a guess). A probe of positions and learning rates before a long training
(docs/reports/speculative.md); fp32, CPU.

    python -m benchmarks.copy_probe [--positional rotary] [--lr 0.001] [--steps 2000] [--threads 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import time

VOCAB, WINDOW, BATCH, SHORTEST, LONGEST = 2048, 128, 32, 8, 23


def windows(generator, specials: int = 3):
    """A batch of inputs and targets (BATCH, WINDOW): runs of random ids (no special ones), each twice."""
    import torch

    rows = []
    for _ in range(BATCH):
        row: list[int] = []
        while len(row) < WINDOW + 1:
            length = int(torch.randint(SHORTEST, LONGEST + 1, (), generator=generator))
            run = torch.randint(specials, VOCAB, (length,), generator=generator).tolist()
            row += run + run
        rows.append(row[: WINDOW + 1])
    ids = torch.tensor(rows)
    return ids[:, :-1], ids[:, 1:]


def probe(positional: str, lr: float, steps: int, seed: int = 0, log=print) -> list[tuple[int, float]]:
    """(step, loss in nats) every 100 steps and at the last."""
    import torch
    import torch.nn.functional as F

    from attnserve.model.config import preset
    from attnserve.model.lm import DecoderLM
    from attnserve.model.train import lm_inputs

    torch.manual_seed(seed)
    config = preset("tiny", vocab_size=VOCAB, positional=positional, max_len=WINDOW)
    model = DecoderLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed + 1)
    losses, start = [], time.perf_counter()
    for step in range(steps):
        x, y = windows(generator)
        logits = model(*lm_inputs(x, config))[0]
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            losses.append((step, round(loss.item(), 3)))
            log(f"step {step}: {loss.item():.3f} nats ({time.perf_counter() - start:.0f} s)")
    return losses


def main(argv: list[str] | None = None) -> int:
    import torch

    from attnserve.model.config import POSITIONALS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--positional", choices=POSITIONALS, default="rotary", help="(default: rotary)")
    p.add_argument("--lr", type=float, default=0.001, help="AdamW's learning rate, constant (default: 0.001)")
    p.add_argument("--steps", type=int, default=2000, help="(default: 2000)")
    p.add_argument("--threads", type=int, default=2, help="(default: 2)")
    p.add_argument("--out", default=None, help="a JSON file for the losses")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    losses = probe(args.positional, args.lr, args.steps)
    print(
        f"{args.positional}, lr {args.lr:g}: {losses[-1][1]:.3f} nats after {args.steps} steps "
        f"(nothing copied {math.log(VOCAB):.2f})"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"positional": args.positional, "lr": args.lr, "losses": losses}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
