"""What the first requests after start-up get: two trees (or flag sets) of `attnserve serve`, each started
--launches times, a first and b first in turn, one server up at a time (work a server does after its
start-up must not slow the other's rounds), and measured from the moment it says SERVING: its time to
start, then --rounds rounds of S streams through gRPC, each round fresh prompts (bench's --seed is the
round's number, so no round finds another's blocks in the prefix cache), after only the one request
`attnserve bench` sends before each round. Round 1 is what the first users of a new replica get; the later
rounds are the server warmed by traffic.

Reports, per round, each side's median output tokens/s and time to first token (p50) over its launches with
min and max, b/a launch by launch, and each side's start-up seconds; then one JSON object last. Torch-free.

    python -m benchmarks.first_requests --model models/NAME [--tree-a DIR] [--tree-b DIR] [--a FLAGS]
        [--b FLAGS] [--streams 16] [--max-batch 64] [--prompt-tokens 16] [--new-tokens 64] [--rounds 3]
        [--launches 4] [--out F.json] [--plot F.png]

A before/after of a change: `git worktree add /tmp/before COMMIT`, then `--tree-a /tmp/before`.
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path

from attnserve.report_stamp import Stamp
from benchmarks.serving import add_sides, error_bars, launch_orders, report, served_ratios, spread
from benchmarks.size_ladder import Served

SIDES = ("a", "b")
TITLE = "The first requests after start-up, two servers started in turn, one at a time"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sides(p, example="--prefix-cache off")
    p.add_argument("--streams", type=int, default=16, help="streams at once in each round")
    p.add_argument("--max-batch", type=int, default=64, help="both servers' --max-batch")
    p.add_argument("--rounds", type=int, default=3, help="rounds after each start-up, the first one first")
    p.add_argument(
        "--launches",
        type=int,
        default=4,
        help="times each side is started, a first and b first in turn, one up at a time",
    )
    p.add_argument("--out", help="write the JSON result (and its Markdown report) here")
    p.add_argument("--plot", help="write a PNG of each round's time to first token, side by side, here")
    args = p.parse_args(argv)
    for name in ("streams", "max_batch", "rounds", "launches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    trees = {"a": args.tree_a, "b": args.tree_b}
    stamp = Stamp.start()
    started: dict[str, list[float]] = {side: [] for side in SIDES}

    def start(side: str) -> Served:
        t0 = time.perf_counter()
        flags = shlex.split(getattr(args, side))
        server = Served(args.model, 0, args.max_batch, args.new_tokens, *flags, tree=trees[side])
        started[side].append(time.perf_counter() - t0)
        return server

    prompts = [[0] * args.prompt_tokens] * args.streams  # bench draws the ids; only the shape counts
    kinds = [("--ignore-eos", "--seed", str(r)) for r in range(args.rounds)]
    runs: dict[str, list[list[dict]]] = {side: [] for side in SIDES}  # side -> launch -> round
    for order in launch_orders(SIDES, args.launches):
        for side in order:  # one server up at a time
            server = start(side)
            try:
                runs[side].append([server.measure(prompts, args.new_tokens, kind) for kind in kinds])
            finally:
                server.close()
    rows = [row_of(r, {side: [launch[r] for launch in runs[side]] for side in SIDES}) for r in range(args.rounds)]
    settings = {"a": args.a, "b": args.b, "model": str(args.model), "trees": trees, "streams": args.streams}
    settings.update(max_batch=args.max_batch, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens)
    settings.update(launches=args.launches, start_s={side: spread(started[side]) for side in SIDES})
    report({**settings, "rows": rows}, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


def row_of(number: int, runs: dict[str, list[dict]]) -> dict:
    """One round's figures over the launches: each side's tokens/s and time to first token, b/a launch by launch."""
    row: dict = {"round": number + 1}
    for side in SIDES:
        row[side] = {key: spread([r[key] for r in runs[side]]) for key in ("tokens_per_s", "ttft_ms")}
    return {**row, **served_ratios(runs)}


def print_table(result: dict) -> None:
    a, b = result["a"] or "(defaults)", result["b"] or "(defaults)"
    trees = result["trees"]
    print(f"a: {a} from {trees['a'] or 'this tree'}; b: {b} from {trees['b'] or 'this tree'}; {result['model']}")
    starts = result["start_s"]
    print(f"start-up, s: a {starts['a']['median']:.1f}, b {starts['b']['median']:.1f}")
    for row in result["rows"]:
        a, b, r, t = row["a"], row["b"], row["b_over_a"], row["ttft_b_over_a"]
        print(
            f"round {row['round']}: a {a['tokens_per_s']['median']:,.1f} tokens/s, "
            f"b {b['tokens_per_s']['median']:,.1f}, b/a {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f}); "
            f"TTFT a {a['ttft_ms']['median']:,.0f} ms "
            f"({a['ttft_ms']['min']:,.0f}-{a['ttft_ms']['max']:,.0f}), b {b['ttft_ms']['median']:,.0f} "
            f"({b['ttft_ms']['min']:,.0f}-{b['ttft_ms']['max']:,.0f}), b/a {t['median']:.3f}"
        )


def write_plot(result: dict, path: str) -> None:
    """Each round's time to first token, a bar per side, min and max over the launches as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(rows), 4))
    for i, side in enumerate(SIDES):
        medians, errors = error_bars([row[side]["ttft_ms"] for row in rows])
        label = f"{side}: {result[side] or result['trees'][side] or 'this tree'}"
        ax.bar([k + i * 0.4 for k in range(len(rows))], medians, 0.4, yerr=errors, label=label, color=f"C{i}")
    ax.set_xticks([k + 0.2 for k in range(len(rows))])
    ax.set_xticklabels([f"round {row['round']}" for row in rows])
    ax.set_ylabel("time to first token, p50 (ms)")
    ax.legend(fontsize=7)
    ax.set_title(f"{Path(result['model']).name}: {result['streams']} streams after start-up", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    raise SystemExit(main())
