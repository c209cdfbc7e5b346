"""What the engine itself costs: the engine in this process and the engine core in a process of
its own, each against a plain Python loop over the same arena driver, on one model directory, in
one run, reported as ratios (issue 22's middle rows).

  loop     ArenaDecoder.prefill of the prompts together, then --new-tokens decode steps, each one
           np.argmax over the batch: the least Python that can drive the graph
  engine   Engine.submit of the same prompts (greedy, max_new_tokens = --new-tokens) all at once,
           each a stream of every --intervals value in turn (tokens per Delta) or a unary call
           (one Delta at the end), read as the gRPC servicer reads it (Handle.next_events), no gRPC: the
           engine thread shares this process's GIL with the event loop that reads the streams
           (`attnserve serve --engine-core thread`)
  core     the same through EngineClient: the engine core in a process of its own, one message
           on a Unix socket per step back to this process's event loop (`--engine-core process`, the default)

The loop and the engine run the same ONNX Runtime session (one ModelSessions, --threads), each over
an arena of its own; the core opens its own session of the same directory with the same threads.
The ratios are each engine's own cost: scheduling, sampling, detokenizing, timing, metrics hooks
and the hand-off of events to the event loop. A request may end early at EOS; tokens
are counted as produced. Sides alternate within each round (the order flips every round); medians
over --repeats with min and max; the load average before and after says whether the machine was
busy. Prints a table, then one JSON object last. Torch-free.

    python -m benchmarks.engine_cost --model models/small-1k-bpe [--concurrency 1,16]
        [--intervals 1,8,unary] [--new-tokens 256] [--repeats 5] [--threads 1] [--run-ahead auto] [--out F.json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from attnserve.core.client import EngineClient
from attnserve.engine.ahead_rule import MODES as AHEAD_MODES
from attnserve.engine.domain import Final, GenerationRequest, StreamInterval
from attnserve.engine.engine import Engine, EngineCalls, EngineLimits, EngineObserver
from attnserve.report_stamp import Stamp
from attnserve.runtime.model_sessions import ModelSessions
from attnserve.runtime.opening import open_slot_runner
from attnserve.server.config import ServerConfig
from attnserve.tokenizer import from_model_dir
from benchmarks.serving import alternating, report, spread

PROMPT_TOKENS = 16
SIDES = ("loop", "engine", "core")
TITLE = "The engine's own cost against a plain loop"


def prompts(vocab_size: int, specials: set[int], count: int) -> list[list[int]]:
    """`count` different prompts of PROMPT_TOKENS ids, special ids left out (seeded: the same every run)."""
    rng = np.random.default_rng(0)
    allowed = np.array([i for i in range(vocab_size) if i not in specials])
    return [rng.choice(allowed, PROMPT_TOKENS).tolist() for _ in range(count)]


def run_loop(model: ModelSessions, batch: list[list[int]], new_tokens: int) -> dict[str, float]:
    """Prefill all, then greedy decode steps with one argmax over the batch; tokens/s."""
    decoder = open_slot_runner(model, len(batch), PROMPT_TOKENS * len(batch)).decoder
    start = time.perf_counter()
    tokens = decoder.prefill(0, batch).argmax(axis=1)
    for _ in range(new_tokens - 1):
        tokens = decoder.decode(tokens).argmax(axis=1)
    seconds = time.perf_counter() - start
    return {"tokens": new_tokens * len(batch), "seconds": seconds, "tokens_per_s": new_tokens * len(batch) / seconds}


def interval_of(text: str) -> StreamInterval | None:
    """One of --intervals: a stream's tokens per message (>= 1), or "unary" (one message at the end);
    ValueError for anything else."""
    if text == "unary":
        return None
    if not (text.isdigit() and int(text) >= 1):
        raise ValueError(f"--intervals: {text!r} is neither a number of tokens (>= 1) nor unary")
    return StreamInterval(int(text))


async def read(
    engine: EngineCalls, prompt: list[int], new_tokens: int, interval: StreamInterval | None, ignore_eos: bool = False
) -> int:
    """One request's stream, read as the servicer reads it; the number of tokens it produced."""
    request = GenerationRequest("bench", tuple(prompt), new_tokens, interval=interval, ignore_eos=ignore_eos)
    return await read_request(engine, request)


async def read_request(engine: EngineCalls, request: GenerationRequest) -> int:
    """`request` submitted and its stream read to its end as the servicer reads it: the tokens it produced;
    an error in its events raised."""
    handle = engine.submit(request)
    tokens = 0
    while True:
        events = await handle.next_events()
        for event in events:
            if isinstance(event, Exception):
                raise event
            tokens += len(getattr(event, "token_ids", ()))
        if isinstance(events[-1], Final):
            return tokens


async def run_engine(
    engine: EngineCalls,
    batch: list[list[int]],
    new_tokens: int,
    interval: StreamInterval | None,
    ignore_eos: bool = False,
) -> dict[str, float]:
    """Every prompt of `batch` at once (each `ignore_eos`: to its length); its tokens, seconds and tokens/s."""
    start = time.perf_counter()
    reads = (read(engine, prompt, new_tokens, interval, ignore_eos) for prompt in batch)
    tokens = sum(await asyncio.gather(*reads))
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Median tokens/s with min and max; the tokens of every run (greedy: the same each run)."""
    rates = [r["tokens_per_s"] for r in runs]
    tokens = sorted({r["tokens"] for r in runs})
    return {"tokens_per_s": statistics.median(rates), "min": min(rates), "max": max(rates), "tokens": tokens}


async def measure(
    model: ModelSessions,
    levels: list[int],
    intervals: list[str],
    new_tokens: int,
    repeats: int,
    threads: int,
    run_ahead: str = "auto",
) -> list[dict]:
    tokenizer = from_model_dir(model.model_dir, model.manifest.tokenizer)
    specials = {tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}
    limits = EngineLimits(max(levels), max(levels), 0, None, run_ahead, 0)
    runner = open_slot_runner(model, max(levels), PROMPT_TOKENS * max(levels), run_ahead=run_ahead)
    engine = Engine(runner, tokenizer, limits)
    engine.start()
    config = ServerConfig(
        model=str(model.model_dir),
        provider="cpu",
        threads=threads,
        max_batch=max(levels),
        max_queue=max(levels),
        prefill_chunk=PROMPT_TOKENS * max(levels),
        engine_core="process",
        run_ahead=run_ahead,
    )
    core = EngineClient(config.core(), EngineObserver(), config.stream_buffer_events)
    core.start()
    rows = []
    try:
        for level, interval in itertools.product(levels, intervals):
            batch, every = prompts(model.spec.vocab_size, specials, level), interval_of(interval)
            sides: dict[str, Callable[[], Awaitable[dict[str, float]]]] = {
                "loop": functools.partial(asyncio.to_thread, run_loop, model, batch, new_tokens),
                "engine": functools.partial(run_engine, engine, batch, new_tokens, every),
                "core": functools.partial(run_engine, core, batch, new_tokens, every),
            }
            for run in sides.values():  # warm-up: bindings, allocations, caches
                await run()
            runs: dict[str, list[dict]] = {side: [] for side in SIDES}
            for side in alternating(SIDES, repeats, f"{level} streams, interval {interval}"):
                runs[side].append(await sides[side]())
            row = {"concurrency": level, "interval": interval, **{side: summary(runs[side]) for side in SIDES}}
            for side in ("engine", "core"):
                ratios = [e["tokens_per_s"] / lp["tokens_per_s"] for e, lp in zip(runs[side], runs["loop"])]
                row[f"{side}_vs_loop"] = spread(ratios)
            rows.append(row)
    finally:
        engine.stop()
        core.stop()
    return rows


def print_table(result: dict) -> None:
    head = ("streams", "interval", "loop tok/s", "engine", "core", "engine/loop (min-max)", "core/loop (min-max)")
    print("{:>8} {:>8} {:>11} {:>8} {:>8} {:>22} {:>21}".format(*head))
    for row in result["rows"]:
        e, c = row["engine_vs_loop"], row["core_vs_loop"]
        print(
            f"{row['concurrency']:>8} {row['interval']:>8} {row['loop']['tokens_per_s']:>11,.0f}"
            f" {row['engine']['tokens_per_s']:>8,.0f} "
            f"{row['core']['tokens_per_s']:>8,.0f} {e['median']:>9.2f}x {e['min']:.2f}-{e['max']:.2f}"
            f" {c['median']:>9.2f}x {c['min']:.2f}-{c['max']:.2f}"
        )


def parse_args(p: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, ModelSessions]:
    """The flags of a benchmark of the engine's own cost (this one's and benchmarks/structured.py's), and
    the model they name; p.error when the prompt and --new-tokens exceed its context."""
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument("--concurrency", default="1,16", help="comma-separated streams decoded together")
    p.add_argument("--new-tokens", type=int, default=256, help="greedy tokens per request")
    p.add_argument("--repeats", type=int, default=5, help="rounds, sides alternating; medians reported")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (every side)")
    p.add_argument("--out", help="write the JSON result here")
    args = p.parse_args(argv)
    args.levels = [int(c) for c in args.concurrency.split(",")]
    model = ModelSessions(args.model, provider="cpu", threads=args.threads)
    if PROMPT_TOKENS + args.new_tokens > model.context_length:
        p.error(
            f"--new-tokens {args.new_tokens} + {PROMPT_TOKENS} prompt tokens exceed the context {model.context_length}"
        )
    return args, model


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What the result JSON records of the run's flags."""
    keys = ("model", "new_tokens", "threads", "repeats", "run_ahead")
    return {"prompt_tokens": PROMPT_TOKENS, **{key: getattr(args, key) for key in keys if key in vars(args)}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--intervals", default="1", help="comma-separated stream intervals in tokens per message, or unary")
    p.add_argument("--run-ahead", default="auto", choices=AHEAD_MODES, help="the engines' --run-ahead")
    args, model = parse_args(p, argv)
    stamp = Stamp.start(provider="cpu")
    intervals = args.intervals.split(",")
    try:
        for interval in intervals:
            interval_of(interval)  # refused before any side runs, not in the middle of the run
    except ValueError as e:
        p.error(str(e))
    rows = asyncio.run(
        measure(model, args.levels, intervals, args.new_tokens, args.repeats, args.threads, args.run_ahead)
    )
    result = {**settings(args), "rows": rows}
    report(result, stamp, args.out, None, print_table, title=TITLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
