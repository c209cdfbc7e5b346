"""Run-ahead's A/B in one process: two engines over one ONNX Runtime session, each with an arena runner of
its own, one with --run-ahead off and one with the mode asked (auto by default), the same requests
through each in turn (the order flips every round), no gRPC: what run-ahead changes in the engine
itself, per stream count and stream interval (tokens per message, or unary: one at the end).

Each request is greedy, --new-tokens long (--ignore-eos: every one runs to its length), read as the
gRPC servicer reads it (Handle.next_events). Reports each side's median tokens/s with min and max,
b/a per round, and whether the b engine's bursts ran ahead (its runner may, and the rule says so);
then one JSON object last. Torch-free.

    python -m benchmarks.run_ahead --model models/small-1k-bpe [--streams 1,16] [--intervals 1,8,unary]
        [--new-tokens 256] [--repeats 5] [--threads 1] [--mode auto|on|off] [--out F.json] [--plot F.png]

--mode off is the control (off against off); auto runs ahead only where its runner may (a core to itself:
runtime/run_ahead.spare_core), so on a 2-core machine compare `on`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools

from attnserve.engine.ahead_rule import MODES, runs_ahead
from attnserve.engine.domain import StreamInterval
from attnserve.engine.engine import Engine, EngineLimits
from attnserve.report_stamp import Stamp
from attnserve.runtime.model_sessions import ModelSessions
from attnserve.runtime.opening import open_slot_runner
from attnserve.tokenizer import from_model_dir
from benchmarks.engine_cost import PROMPT_TOKENS, interval_of, prompts, run_engine
from benchmarks.serving import alternating, report, spread

SIDES = ("off", "ahead")


class Takes:
    """A batch's share of the auto rule (ahead_rule.runs_ahead): the tokens its engine takes a step."""

    def __init__(self, per_step: float):
        self.per_step = per_step

    def takes_per_step(self) -> float:
        return self.per_step


TITLE = "Run-ahead against none, the engine in one process"


async def tokens_per_s(engine: Engine, batch: list[list[int]], new_tokens: int, interval: StreamInterval | None):
    """Every prompt of `batch` at once, each to its length: the engine's tokens/s."""
    return (await run_engine(engine, batch, new_tokens, interval, ignore_eos=True))["tokens_per_s"]


async def measure(args: argparse.Namespace, model: ModelSessions) -> list[dict]:
    tokenizer = from_model_dir(model.model_dir, model.manifest.tokenizer)
    specials = {tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}
    most = max(args.levels)
    engines, runners = {}, {}
    for side, mode in zip(SIDES, ("off", args.mode)):
        runners[side] = open_slot_runner(model, most, PROMPT_TOKENS * most, run_ahead=mode)
        engines[side] = Engine(runners[side], tokenizer, EngineLimits(most, most, 0, None, mode, 0))
        engines[side].start()
    rows = []
    try:
        for level, interval in itertools.product(args.levels, args.intervals):
            batch, every = prompts(model.spec.vocab_size, specials, level), interval_of(interval)
            for engine in engines.values():  # warm-up, and the auto rule's first measurements
                for _ in range(2):
                    await tokens_per_s(engine, batch, args.new_tokens, every)
            rates: dict[str, list[float]] = {side: [] for side in SIDES}
            for side in alternating(SIDES, args.repeats, f"{level} streams, interval {interval}"):
                rates[side].append(await tokens_per_s(engines[side], batch, args.new_tokens, every))
            takes = 0 if every is None else level / every.tokens  # the tokens the engine takes a step
            rows.append(
                {
                    "streams": level,
                    "interval": interval,
                    **{side: spread(rates[side]) for side in SIDES},
                    "ahead_over_off": spread([b / a for a, b in zip(rates["off"], rates["ahead"])]),
                    "ran_ahead": runners["ahead"].run_ahead and runs_ahead(args.mode, [Takes(takes)]),
                }
            )
    finally:
        for engine in engines.values():
            engine.stop()
    return rows


def print_table(result: dict) -> None:
    print(f"b: --run-ahead {result['mode']} against off on {result['model']}, {result['threads']} thread(s)")
    head = ("streams", "interval", "off tok/s", "b tok/s", "b/off (min-max)", "ran ahead")
    print("{:>8} {:>9} {:>11} {:>11} {:>22} {:>10}".format(*head))
    for row in result["rows"]:
        r = row["ahead_over_off"]
        print(
            f"{row['streams']:>8} {row['interval']:>9} {row['off']['median']:>11,.0f} {row['ahead']['median']:>11,.0f}"
            f" {r['median']:>9.3f}x {r['min']:.3f}-{r['max']:.3f} {row['ran_ahead']!s:>10}"
        )


def write_plot(result: dict, path: str) -> None:
    """b/off tokens/s per stream count and interval, round-to-round min and max as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    medians = [row["ahead_over_off"]["median"] for row in rows]
    errors = [
        [m - row["ahead_over_off"]["min"] for m, row in zip(medians, rows)],
        [row["ahead_over_off"]["max"] - m for m, row in zip(medians, rows)],
    ]
    fig, ax = plt.subplots(figsize=(2 + 1.1 * len(rows), 4))
    colors = ["C0" if row["ran_ahead"] else "C7" for row in rows]
    ax.bar(range(len(rows)), medians, 0.6, yerr=errors, color=colors)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{row['streams']} x {row['interval']}" for row in rows], fontsize=7)
    ax.set_xlabel("streams x interval (grey: it did not run ahead)", fontsize=8)
    ax.set_ylabel(f"tokens/s, --run-ahead {result['mode']} / off", fontsize=8)
    ax.set_title(f"{result['model']}, {result['threads']} thread(s)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument("--streams", default="1,16", help="comma-separated streams decoded together")
    p.add_argument("--intervals", default="1,8,unary", help="comma-separated stream intervals (tokens), or unary")
    p.add_argument("--new-tokens", type=int, default=256, help="greedy tokens per request (every one to its length)")
    p.add_argument("--repeats", type=int, default=5, help="rounds, sides alternating; medians reported")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    p.add_argument("--mode", default="auto", choices=MODES, help="side b's --run-ahead (off: control)")
    p.add_argument("--out", help="write the JSON result (and its Markdown report) here")
    p.add_argument("--plot", help="write a PNG of b/off per row here")
    args = p.parse_args(argv)
    args.levels = [int(s) for s in args.streams.split(",")]
    args.intervals = args.intervals.split(",")
    for interval in args.intervals:
        try:
            interval_of(interval)
        except ValueError as error:
            p.error(str(error))
    model = ModelSessions(args.model, provider="cpu", threads=args.threads)
    if PROMPT_TOKENS + args.new_tokens > model.context_length:
        p.error(
            f"--new-tokens {args.new_tokens} + {PROMPT_TOKENS} prompt tokens exceed the context {model.context_length}"
        )
    stamp = Stamp.start(provider="cpu")
    rows = asyncio.run(measure(args, model))
    settings = {"model": args.model, "mode": args.mode, "threads": args.threads, "new_tokens": args.new_tokens}
    settings.update(repeats=args.repeats, prompt_tokens=PROMPT_TOKENS)
    report({**settings, "rows": rows}, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
