"""The engine's host work alone: the engine over a runner that computes nothing (each step's ids come
back at once), so that tokens/s is what the engine's own Python allows: on a GPU, where a 124M model's
decode step takes 0.9-3 ms at 16-256 rows, this is the part of each step the GPU waits for (issue 62;
docs/reports/gpu-ladder.md).

  NullRunner  a SlotRunner with no model: a row's next id is drawn from the tokenizer's ordinary ids by
              (key, position), never EOS, so every request runs to its length and the text the engine
              detokenizes is the model's own tokenizer's (--model: its tokenizer.json, no ONNX session)
  engine      Engine.submit of N prompts (greedy, --new-tokens each) at once, each a stream read as the
              gRPC servicer reads it (Handle.next_events) on this process's event loop, the engine's
              thread beside it (`--engine-core thread`'s arrangement): the engine's step, its events
              and their reading, with no model, no protobuf and no network; the two share one GIL,
              and the engine's wake of the loop waits for it (more than the engine core process pays)

Reported per level: tokens/s (median, min-max over --repeats), and the host's microseconds per step
and per token. With --tree-a DIR, another checkout's engine (one that has this file) runs the same in a
process of its own, the two alternating in rounds, and b/a per round is the change's speed-up. Torch-free.

    python -m benchmarks.host_cost --model models/small-1k-bpe [--concurrency 16,64,256]
        [--intervals 1,unary] [--new-tokens 128] [--repeats 5] [--tree-a DIR] [--out F.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from attnserve.engine.seam import Logits, ModelSpec, stepwise
from benchmarks.serving import spread


class NullRunner:
    """A SlotRunner that computes nothing (module docstring): `ordinary`, the ids it answers with."""

    def __init__(self, spec: ModelSpec, ordinary: np.ndarray, capacity: int):
        self.spec, self.ordinary, self.capacity = spec, ordinary, capacity
        self.rows: dict[int, int] = {}  # key -> ids fed
        self.waiting: list[tuple[int, int]] = []  # (key, prompt length)
        self.zeros = np.zeros((capacity, spec.vocab_size), np.float32)

    def next_ids(self, keys: list[int]) -> np.ndarray:
        places = np.array([(key * 7919 + self.rows[key] * 104729) % len(self.ordinary) for key in keys])
        return self.ordinary[places]

    def free_slots(self) -> int:
        return self.capacity - len(self.rows) - len(self.waiting)

    def start(self, key: int, prompt: tuple[int, ...], prompt_logits: bool = False, forks: tuple = ()) -> None:  # noqa: ARG002
        self.waiting.append((key, len(prompt)))

    def prefill(self) -> Logits:
        keys = [key for key, _ in self.waiting]
        for key, length in self.waiting:
            self.rows[key] = length
        self.waiting = []
        rows = np.zeros((len(keys), self.spec.vocab_size), np.float32)
        rows[np.arange(len(keys)), self.next_ids(keys)] = 1.0
        return Logits(keys, rows)

    def decode(self, next_ids: dict[int, int], sampled=None, passes=None, bans=None) -> Logits:  # noqa: ARG002
        keys = list(next_ids)
        for key in keys:
            self.rows[key] += 1
        return Logits(keys, self.zeros[: len(keys)], self.next_ids(keys))

    def decode_steps(self, next_ids, steps, enough, bans=None, ahead=False, draws=None) -> int:
        return stepwise(self, next_ids, steps, enough, bans, ahead, draws)

    def verify(self, next_ids, proposals, sampled=frozenset()):
        raise NotImplementedError("no speculation here")

    def rewind(self, key: int, count: int) -> None:
        raise NotImplementedError("no speculation here")

    def copy_cache(self, src: int, dst: int) -> None:
        self.rows[dst] = self.rows[src]

    def release(self, key: int) -> None:
        self.rows.pop(key, None)
        self.waiting = [item for item in self.waiting if item[0] != key]

    def reset(self) -> None:
        self.rows.clear()
        self.waiting.clear()


def side(model: str, levels: list[int], intervals: list[str], new_tokens: int) -> dict[str, float]:
    """One round of every (level, interval) with this checkout's engine over a NullRunner: tokens/s by
    "level/interval"."""
    from attnserve.engine.engine import Engine, EngineLimits
    from attnserve.runtime.contract import read_manifest
    from attnserve.tokenizer import from_model_dir
    from benchmarks.engine_cost import interval_of, prompts, run_engine

    manifest = read_manifest(Path(model))
    tokenizer = from_model_dir(Path(model), manifest.tokenizer)
    vocab = tokenizer.vocab_size
    specials = {tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}
    ordinary = np.array([i for i in range(vocab) if i not in specials])

    spec = ModelSpec(vocab, manifest.context_length, tokenizer.bos_id)
    engine = Engine(
        NullRunner(spec, ordinary, max(levels)), tokenizer, EngineLimits(max(levels), max(levels), 0, None, "off", 0)
    )
    engine.start()
    got: dict[str, float] = {}
    try:
        for level in levels:
            batch = prompts(vocab, specials, level)
            for interval in intervals:
                every = interval_of(interval)
                asyncio.run(run_engine(engine, batch, new_tokens, every, ignore_eos=True))  # warm-up
                got[f"{level}/{interval}"] = asyncio.run(run_engine(engine, batch, new_tokens, every, True))[
                    "tokens_per_s"
                ]
    finally:
        engine.stop()
    return got


def in_tree(tree: str, args: argparse.Namespace) -> dict[str, float]:
    """side() in a process of its own with checkout `tree` first on sys.path."""
    code = (
        f"import sys, json; sys.path.insert(0, {tree!r}); from benchmarks.host_cost import side; "
        f"print(json.dumps(side({args.model!r}, {args.levels!r}, {args.intervals!r}, {args.new_tokens})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="an exported model directory (its tokenizer only)")
    p.add_argument("--concurrency", default="16,64,256", help="streams decoded together")
    p.add_argument("--intervals", default="1,unary", help="tokens a stream message, or unary")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens a request")
    p.add_argument("--repeats", type=int, default=5, help="rounds; medians")
    p.add_argument("--tree-a", help="another checkout: its engine is side a, this one's side b")
    p.add_argument("--out", type=Path, help="write the JSON here")
    args = p.parse_args(argv)
    args.levels = [int(c) for c in args.concurrency.split(",")]
    args.intervals = args.intervals.split(",")
    here = str(Path(__file__).resolve().parent.parent)
    trees = {"a": args.tree_a, "b": here} if args.tree_a else {"b": here}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(args.repeats):
        for name in list(trees)[:: 1 if r % 2 == 0 else -1]:
            runs[name].append(in_tree(trees[name], args))
            print(f"[host-cost] round {r + 1}, {name}: {runs[name][-1]}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for cell in runs["b"][0]:
        level = int(cell.split("/")[0])
        row: dict[str, Any] = {"concurrency": level, "interval": cell.split("/")[1]}
        for name in trees:
            rate = spread([run[cell] for run in runs[name]])
            row[name] = {**rate, "us_per_step": 1e6 * level / rate["median"], "us_per_token": 1e6 / rate["median"]}
        if "a" in trees:
            row["b_over_a"] = spread([b[cell] / a[cell] for a, b in zip(runs["a"], runs["b"])])
        rows.append(row)
    for row in rows:
        b = row["b"]
        line = (
            f"{row['concurrency']:>4} streams, interval {row['interval']:>5}: b {b['median']:>9,.0f} tokens/s "
            f"({b['min']:,.0f}-{b['max']:,.0f}), {b['us_per_step']:,.0f} us a step, {b['us_per_token']:.1f} us a token"
        )
        if "a" in row:
            r = row["b_over_a"]
            line += f"; a {row['a']['median']:,.0f}; b/a {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"
        print(line)
    result = {"model": args.model, "trees": trees, "new_tokens": args.new_tokens, "repeats": args.repeats, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
