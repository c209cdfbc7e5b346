"""What structured output costs a decode step: the engine in this process, greedy, with no row, one
row or every row of the batch constrained by a JSON schema, in one run, reported as ratios (issue 24).

  free   every request unconstrained: plain greedy rows, one argmax over the batch
  one    the same batch with request 0 constrained (at 1 stream: the same as all)
  all    every request constrained

The grammar is a JSON array of at least 300 strings of up to 16 characters (`SCHEMA`): it cannot end
before --new-tokens, so every constrained row runs every step, and its mask is a JSON grammar's
(lexer and parser), not a trivial one. A constrained row's mask for its next token is computed by the
mask thread (llguidance) while the model runs, and the row picks by its own sampler with the mask
applied; free rows keep the batch's argmax. Besides the
engine's tokens/s, `mask_us` is the mask alone: the constrained completions' tokens replayed through
fresh matchers, the time of each step's mask (fill and unpack to a bool per id). Sides alternate
within each round; medians over --repeats with min and max; load average before and after. Prints a
table, then one JSON object last. Torch-free.

    python -m benchmarks.structured --model models/small-1k-bpe [--concurrency 1,16]
        [--new-tokens 256] [--repeats 5] [--threads 1] [--out F.json] [--plot F.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from attnserve.engine.domain import Final, GenerationRequest, Grammar
from attnserve.engine.engine import Engine, EngineLimits
from attnserve.engine.grammar import Matcher, compile_grammar
from attnserve.engine.sampling import unpacked
from attnserve.report_stamp import Stamp
from attnserve.runtime.model_sessions import ModelSessions
from attnserve.runtime.opening import open_slot_runner
from attnserve.tokenizer import Tokenizer, from_model_dir
from benchmarks.engine_cost import PROMPT_TOKENS, parse_args, prompts, settings, summary
from benchmarks.serving import alternating, report, spread

SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 300}
SIDES = ("free", "one", "all")
TITLE = "Structured output's cost per decode step"


async def read(engine: Engine, request: GenerationRequest) -> list[int]:
    """One request's stream, as the servicer reads it: the ids it produced."""
    handle = engine.submit(request)
    ids: list[int] = []
    while True:
        events = await handle.next_events()
        for event in events:
            if isinstance(event, Exception):
                raise event
            ids += getattr(event, "token_ids", ())
        if isinstance(events[-1], Final):
            return ids


async def run_side(engine: Engine, batch: list[list[int]], constrained: int, grammar: Grammar, new_tokens: int):
    """The batch, its first `constrained` requests under the grammar: tokens/s, and their ids."""
    requests = [
        GenerationRequest(f"r{i}", tuple(p), new_tokens, grammar=grammar if i < constrained else None)
        for i, p in enumerate(batch)
    ]
    start = time.perf_counter()
    outputs = await asyncio.gather(*(read(engine, r) for r in requests))
    seconds = time.perf_counter() - start
    tokens = sum(map(len, outputs))
    steps = max(map(len, outputs))
    run = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "step_us": 1e6 * seconds / steps}
    return run, outputs[:constrained]


def mask_times(grammar: Grammar, tokenizer: Tokenizer, outputs: list[list[int]]) -> list[float]:
    """Microseconds of each step's mask, replaying each completion's ids through a fresh matcher."""
    times = []
    for ids in outputs:
        matcher = Matcher(grammar, tokenizer)
        for token in ids:
            start = time.perf_counter()
            allowed = matcher.allowed()
            times.append(1e6 * (time.perf_counter() - start))
            assert unpacked(allowed, tokenizer.vocab_size)[token], (
                "the engine generated an id its grammar did not allow"
            )
            matcher.take(token)
    return times


async def measure(model: ModelSessions, levels: list[int], new_tokens: int, repeats: int) -> list[dict]:
    tokenizer = from_model_dir(model.model_dir, model.manifest.tokenizer)
    grammar = compile_grammar("json_schema", json.dumps(SCHEMA), tokenizer)
    specials = {tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}
    limits = EngineLimits(
        max_batch=max(levels),
        max_queue=max(levels),
        max_buffered=0,
        speculation=None,
        run_ahead="off",
        max_waiting_steps=0,
    )
    engine = Engine(open_slot_runner(model, max(levels), PROMPT_TOKENS * max(levels)), tokenizer, limits)
    engine.start()
    rows = []
    try:
        for level in levels:
            batch = prompts(model.spec.vocab_size, specials, level)
            counts = {"free": 0, "one": 1, "all": level}
            sides = [side for side in SIDES if side != "one" or level > 1]
            for side in sides:  # warm-up
                await run_side(engine, batch, counts[side], grammar, new_tokens)
            runs: dict[str, list[dict]] = {side: [] for side in sides}
            constrained: list[list[int]] = []
            for side in alternating(sides, repeats, f"{level} streams"):
                run, outputs = await run_side(engine, batch, counts[side], grammar, new_tokens)
                runs[side].append(run)
                constrained += outputs
            row: dict[str, Any] = {"concurrency": level, **{side: summary(runs[side]) for side in sides}}
            for side in sides:
                row[side]["step_us"] = statistics.median(r["step_us"] for r in runs[side])
                if side != "free":
                    ratios = [s["tokens_per_s"] / f["tokens_per_s"] for s, f in zip(runs[side], runs["free"])]
                    row[f"{side}_vs_free"] = spread(ratios)
            masks = mask_times(grammar, tokenizer, constrained)
            row["mask_us"] = {"median": statistics.median(masks), "p90": statistics.quantiles(masks, n=10)[-1]}
            rows.append(row)
    finally:
        engine.stop()
    return rows


def print_table(result: dict) -> None:
    print(f"{'streams':>8} {'side':>5} {'tok/s':>8} {'step us':>8} {'vs free (min-max)':>20}")
    for row in result["rows"]:
        for side in SIDES:
            if side not in row:
                continue
            ratio = row.get(f"{side}_vs_free")
            text = f"{ratio['median']:.2f}x {ratio['min']:.2f}-{ratio['max']:.2f}" if ratio else ""
            print(
                f"{row['concurrency']:>8} {side:>5} {row[side]['tokens_per_s']:>8,.0f} "
                f"{row[side]['step_us']:>8,.0f} {text:>20}"
            )
        mask = row["mask_us"]
        print(f"{'':>8} mask alone: {mask['median']:.1f} us a row a step (p90 {mask['p90']:.1f})")


def write_plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.25
    for i, side in enumerate(SIDES):
        xs = [j + (i - 1) * width for j, row in enumerate(result["rows"]) if side in row]
        ys = [row[side]["step_us"] for row in result["rows"] if side in row]
        ax.bar(xs, ys, width, label={"free": "no row", "one": "one row", "all": "every row"}[side] + " constrained")
    labels = [f"{row['concurrency']} stream" + "s" * (row["concurrency"] > 1) for row in result["rows"]]
    ax.set_xticks(range(len(result["rows"])), labels)
    ax.set_ylabel("engine step (us, median)")
    ax.set_title("Structured output's cost per decode step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plot", help="write a PNG of the step times here")
    args, model = parse_args(p, argv)
    stamp = Stamp.start(provider="cpu")
    rows = asyncio.run(measure(model, args.levels, args.new_tokens, args.repeats))
    result = {**settings(args), "schema": SCHEMA, "rows": rows}
    report(result, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
