"""Two `attnserve serve` settings side by side on one model directory (or two), through gRPC: the A/B
that chooses a serving default at a given size (threads, prefill chunk, KV memory).

Both servers run at once on 127.0.0.1 (idle while the other is measured); each round drives one,
then the other (the order flips every round), with `attnserve bench` from a process of its own: S
streams at once, each --prompt-tokens prompt ids and exactly --new-tokens tokens (--ignore-eos). The
servers are started --launches times, a first and then b first (a server started after another can
run faster all its life), the rounds spread over the launches.
Reports, per stream count, each side's median output tokens/s and time to first token (p50) with
min and max, b/a per round, and each server's resident memory (its processes together) after the
rounds; then one JSON object last. Torch-free.

    python -m benchmarks.served_ab --model models/NAME --a "--threads 1" --b "--threads 2"
        [--model-b models/OTHER] [--tree-a DIR] [--tree-b DIR] [--streams 1,16] [--prompt-tokens 16]
        [--new-tokens 64] [--repeats 4] [--launches 2] [--connections 1] [--provider cpu] [--out F.json] [--plot F.png]

Front ends in parallel (--api-server-count) need the streams on several connections (the kernel
spreads connections over the front ends): `--connections 8` gives both sides the same eight.

A before/after of a change: `git worktree add /tmp/before COMMIT`, then `--tree-a /tmp/before`.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from attnserve.report_stamp import Stamp
from benchmarks.serving import add_sides, alternating, error_bars, launches, report, served_ratios, spread
from benchmarks.size_ladder import Served

SIDES = ("a", "b")
TITLE = "Two serving settings through gRPC, alternating"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sides(p, example="--threads 1")
    p.add_argument("--model-b", type=Path, help="side b's model directory (default: --model)")
    p.add_argument("--streams", default="1,16", help="comma-separated streams at once")
    p.add_argument(
        "--repeats",
        type=int,
        default=4,
        help="rounds, the sides alternating, spread over the launches; medians reported",
    )
    p.add_argument(
        "--launches",
        type=int,
        default=2,
        help="times both servers are started, in turn a first and b first (the one started second can run faster)",
    )
    p.add_argument("--connections", type=int, default=1, help="gRPC connections the streams take in turn (both sides)")
    p.add_argument("--provider", default="cpu", choices=("cpu", "cuda"), help="both servers' --provider")
    p.add_argument("--out", help="write the JSON result (and its Markdown report) here")
    p.add_argument("--plot", help="write a PNG of b/a (tokens/s and time to first token) per stream count here")
    args = p.parse_args(argv)
    if args.launches < 1:
        p.error(f"--launches must be at least 1, got {args.launches}")
    streams = [int(s) for s in args.streams.split(",")]
    models = {"a": args.model, "b": args.model_b or args.model}
    trees = {"a": args.tree_a, "b": args.tree_b}
    stamp = Stamp.start(provider=args.provider)

    def start(side: str) -> Served:  # --threads is a flag of the side's own; Served's 0 is the server's default
        flags = shlex.split(getattr(args, side))
        return Served(models[side], 0, max(streams), args.new_tokens, *flags, tree=trees[side], provider=args.provider)

    kind = ("--ignore-eos", "--connections", str(args.connections))  # fixed lengths, as Served's default
    rounds = -(-args.repeats // args.launches)  # each launch's
    runs: dict[int, dict[str, list[dict]]] = {count: {side: [] for side in SIDES} for count in streams}
    for servers in launches(start, Served.close, SIDES, args.launches):
        for count in streams:
            prompts = [[0] * args.prompt_tokens] * count  # bench draws the ids; only the shape counts
            for server in servers.values():
                server.measure(prompts[: min(count, 4)], 4, kind)  # warm-up
            for side in alternating(SIDES, rounds, f"{count} streams"):
                runs[count][side].append(servers[side].measure(prompts, args.new_tokens, kind))
    rows = [row_of(count, runs[count]) for count in streams]
    settings = {"a": args.a, "b": args.b, "model": str(args.model), "model_b": str(models["b"]), "trees": trees}
    settings.update(prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, repeats=rounds * args.launches)
    settings.update(launches=args.launches, connections=args.connections)
    report({**settings, "rows": rows}, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


def row_of(count: int, runs: dict[str, list[dict]]) -> dict:
    """One stream count's figures: each side's tokens/s and time to first token, b/a round by round."""
    row: dict = {"streams": count}
    for side in SIDES:
        row[side] = {
            "tokens_per_s": spread([r["tokens_per_s"] for r in runs[side]]),
            "ttft_ms": spread([r["ttft_ms"] for r in runs[side]]),
            "rss_mib": round(max(r["rss_bytes"] for r in runs[side]) / 2**20),
        }
    return {**row, **served_ratios(runs)}


def print_table(result: dict) -> None:
    a, b = result["a"] or "(defaults)", result["b"] or "(defaults)"
    print(f"a: {a} on {result['model']}; b: {b} on {result['model_b']}")
    for row in result["rows"]:
        a, b, r, t = row["a"], row["b"], row["b_over_a"], row["ttft_b_over_a"]
        print(
            f"{row['streams']:>3} streams: a {a['tokens_per_s']['median']:,.1f} tokens/s, b "
            f"{b['tokens_per_s']['median']:,.1f}, b/a {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f}); TTFT a "
            f"{a['ttft_ms']['median']:,.1f} ms, b {b['ttft_ms']['median']:,.1f}, b/a {t['median']:.3f}; RSS a "
            f"{a['rss_mib']:,} MiB, b {b['rss_mib']:,}"
        )


def write_plot(result: dict, path: str) -> None:
    """b/a of tokens/s and of time to first token, a pair of bars per stream count, round-to-round
    min and max as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(rows), 4))
    for i, (key, label) in enumerate([("b_over_a", "tokens/s, b/a"), ("ttft_b_over_a", "time to first token, b/a")]):
        medians, errors = error_bars([row[key] for row in rows])
        ax.bar([k + i * 0.4 for k in range(len(rows))], medians, 0.4, yerr=errors, label=label, color=f"C{i}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([k + 0.2 for k in range(len(rows))])
    ax.set_xticklabels([f"{row['streams']} streams" for row in rows])
    ax.legend(fontsize=7)
    a, b = Path(result["model"]).name, Path(result["model_b"]).name
    ax.set_title(f"b: {b} {result['b']}\nagainst a: {a} {result['a']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    raise SystemExit(main())
