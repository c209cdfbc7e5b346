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

With --kind sampled each request samples (temperature 1, top-k 50, a seed each) and the NullRunner's
pass picks every row it is given (the device's batched pass, computing nothing): what the engine does
around a sampled step, or a burst of them.

Reported per level: tokens/s (median, min-max over --repeats), and the host's microseconds per step
and per token. With --tree-a DIR, another checkout's engine runs the same (this file, that checkout's
attnserve) in a process of its own, the two alternating in rounds, and b/a per round is the change's
speed-up. Torch-free.

    python -m benchmarks.host_cost --model models/small-1k-bpe [--concurrency 16,64,256]
        [--intervals 1,unary] [--new-tokens 128] [--repeats 5] [--kind greedy|sampled] [--tree-a DIR] [--out F.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from attnserve.engine.domain import Final, GenerationRequest, SamplingParams, StreamInterval
from attnserve.engine.seam import Logits, ModelSpec, Pick, stepwise
from benchmarks.serving import spread

KINDS = ("greedy", "sampled")


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
        """The next ids; a key in `passes` picked by a pass that computes nothing (its next id)."""
        keys = list(next_ids)
        for key in keys:
            self.rows[key] += 1
        ids = self.next_ids(keys)
        picks = {key: Pick(int(token), 0.0) for key, token in zip(keys, ids) if passes and key in passes}
        return Logits(keys, self.zeros[: len(keys)], ids, picks=picks)

    def decode_steps(self, next_ids, steps, enough, bans=None, ahead=False, draws=None) -> int:
        if draws is None:  # as a tree's engine from before draws calls it
            return stepwise(self, next_ids, steps, enough, bans, ahead)
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


async def run_kind(engine, batch: list[list[int]], new_tokens: int, every: StreamInterval | None, kind: str) -> float:
    """Every prompt of `batch` at once, each to its length (ignore_eos), greedy or sampled (seeded by its
    place): tokens/s. Its own reading loop, engine_cost.read's with a sampling: --tree-a's checkout
    brings its own benchmarks.engine_cost, whose read may take none."""
    start, tokens = time.perf_counter(), 0

    async def read(i: int, prompt: list[int]) -> None:
        nonlocal tokens
        sampling = SamplingParams(temperature=1.0, top_k=50, seed=i) if kind == "sampled" else SamplingParams()
        request = GenerationRequest("bench", tuple(prompt), new_tokens, sampling, interval=every, ignore_eos=True)
        handle = engine.submit(request)
        while True:
            events = await handle.next_events()
            for event in events:
                if isinstance(event, Exception):
                    raise event
                tokens += len(getattr(event, "token_ids", ()))
            if isinstance(events[-1], Final):
                return

    await asyncio.gather(*(read(i, prompt) for i, prompt in enumerate(batch)))
    return tokens / (time.perf_counter() - start)


def side(
    model: str, levels: list[int], intervals: list[str], new_tokens: int, kind: str = "greedy"
) -> dict[str, float]:
    """One round of every (level, interval) with the engine on sys.path over a NullRunner, requests of
    `kind`: tokens/s by "level/interval"."""
    from attnserve.engine.engine import Engine, EngineLimits
    from attnserve.runtime.contract import read_manifest
    from attnserve.tokenizer import from_model_dir
    from benchmarks.engine_cost import interval_of, prompts

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
                asyncio.run(run_kind(engine, batch, new_tokens, every, kind))  # warm-up
                got[f"{level}/{interval}"] = asyncio.run(run_kind(engine, batch, new_tokens, every, kind))
    finally:
        engine.stop()
    return got


def in_tree(tree: str, args: argparse.Namespace) -> dict[str, float]:
    """side() of this file in a process of its own with checkout `tree` first on sys.path."""
    code = (
        f"import sys, json, importlib.util; sys.path.insert(0, {tree!r}); "
        f"spec = importlib.util.spec_from_file_location('host_cost', {__file__!r}); "
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
        f"print(json.dumps(module.side({args.model!r}, {args.levels!r}, {args.intervals!r}, {args.new_tokens}, "
        f"{args.kind!r})))"
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
    p.add_argument("--kind", default="greedy", choices=KINDS, help="greedy requests, or sampled ones (top-k 50)")
    p.add_argument("--tree-a", help="another checkout: its engine is side a, this one's side b")
    p.add_argument("--out", type=Path, help="write the JSON here")
    args = p.parse_args(argv)
    args.levels = [int(c) for c in args.concurrency.split(",")]
    args.model = str(Path(args.model).resolve())  # each side runs in its checkout's folder
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
    result = {
        "model": args.model,
        "kind": args.kind,
        "trees": trees,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
