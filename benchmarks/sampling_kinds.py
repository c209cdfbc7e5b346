"""Each kind of request production sends against plain greedy, served through gRPC: what a request
costs for asking more than argmax (issue 60's table), on one server, and before/after a change.

One `attnserve serve` per side on 127.0.0.1 (b: this checkout with --b's flags; with --tree-a or --a,
also side a: that checkout, or this one, with --a's flags, on the same model), each driven by `attnserve
bench` from a process of its own: S streams at once, each --prompt-tokens prompt ids and up to
--new-tokens tokens (--waves requests a stream, one after another), every stream of one kind. Each round
runs every side and every kind once, sides and kinds in turn forwards and backwards; with two sides the
servers are started --launches times, a first and then b first (a server started after another can run
faster all its life), the rounds spread over the launches. Reports, per stream count and side, each
kind's median output tokens/s with min and max, its ratio to greedy on the same server in the same
round, and (with side a) each kind's b/a ratio, round by round; then one JSON object last (--out also
writes its Markdown report, --plot a PNG). Torch-free.

    python -m benchmarks.sampling_kinds --model models/NAME [--tree-a DIR] [--a FLAGS] [--b FLAGS] [--streams 1,16]
        [--prompt-tokens 16] [--new-tokens 64] [--repeats 6] [--waves 1] [--launches 2] [--kinds greedy,ignore_eos,...]
        [--threads N] [--out F.json] [--plot F.png]

A before/after: `git worktree add /tmp/before COMMIT`, then `--tree-a /tmp/before`; two settings of
one tree: `--a "--logits-pass off" --b "--logits-pass auto"`.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from attnserve.report_stamp import Stamp
from benchmarks.serving import alternating, launches, report, spread
from benchmarks.size_ladder import Served

TITLE = "Request kinds against greedy through gRPC, alternating"
# each kind's `attnserve bench` flags (issue 60's kinds); greedy ends at EOS like the sampled kinds, ignore_eos never
KINDS = {
    "greedy": [],
    "ignore_eos": ["--ignore-eos"],
    "top_p": ["--temperature", "0.8", "--top-p", "0.95"],
    "top_p_fixed": ["--ignore-eos", "--temperature", "0.8", "--top-p", "0.95"],  # sampled to a fixed length
    "top_k": ["--temperature", "1", "--top-k", "50"],
    "logprobs": ["--logprobs", "5"],
    "repetition": ["--temperature", "0.7", "--repetition-penalty", "1.1"],
    "mix": ["--mix", "production"],
    "mix_fixed": ["--ignore-eos", "--mix", "production"],  # the size ladder's sampled column: fixed lengths
}
BASELINE = "greedy"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=Path, help="model directory written by `attnserve export`")
    p.add_argument("--tree-a", help="a checkout to serve as side a (the before), e.g. a git worktree")
    p.add_argument("--a", default="", help='side a\'s `attnserve serve` flags, one string (e.g. "--logits-pass off")')
    p.add_argument("--b", default="", help="side b's flags")
    p.add_argument("--streams", default="1,16", help="comma-separated streams at once")
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt ids per stream")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per stream, at most (EOS may end one)")
    p.add_argument("--repeats", type=int, default=6, help="rounds, sides and kinds alternating; medians reported")
    p.add_argument(
        "--waves",
        type=int,
        default=1,
        help="requests each stream sends a measurement, one after another (more tokens a measurement: a round's "
        "ratio less moved by the machine's moments, at one stream)",
    )
    p.add_argument(
        "--launches",
        type=int,
        default=2,
        help="with two sides: how often both servers are started, a first and b first in turn; rounds spread over them",
    )
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}")
    p.add_argument("--threads", type=int, default=0, help="the servers' --threads (0: their default)")
    p.add_argument("--out", help="write the JSON result (and its Markdown report) here")
    p.add_argument("--plot", help="write a PNG of each kind's ratio to greedy here")
    args = p.parse_args(argv)
    if args.launches < 1:
        p.error(f"--launches must be at least 1, got {args.launches}")
    if args.waves < 1:
        p.error(f"--waves must be at least 1, got {args.waves}")
    kinds = [k.strip() for k in args.kinds.split(",")]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        p.error(f"--kinds: unknown {', '.join(unknown)}; the kinds are {', '.join(KINDS)}")
    kinds = [BASELINE, *(k for k in kinds if k != BASELINE)]
    streams = [int(s) for s in args.streams.split(",")]
    trees = {"a": args.tree_a, "b": None} if args.tree_a or args.a else {"b": None}
    flags = {"a": shlex.split(args.a), "b": shlex.split(args.b)}
    stamp = Stamp.start(provider="cpu")
    sides = list(trees)

    def start(side: str) -> Served:
        return Served(args.model, args.threads, max(streams), args.new_tokens, *flags[side], tree=trees[side])

    runs = [(side, kind) for side in sides for kind in kinds]
    count_of_launches = args.launches if len(sides) == 2 else 1
    rounds = -(-args.repeats // count_of_launches)  # each launch's
    measured: dict[int, dict[tuple[str, str], list[float]]] = {count: {run: [] for run in runs} for count in streams}
    for servers in launches(start, Served.close, sides, count_of_launches):
        for count in streams:
            prompts = [[0] * args.prompt_tokens] * count  # bench draws the ids; only the shape counts
            for server in servers.values():
                server.measure(prompts[: min(count, 4)], 4, [])  # warm-up
            for run in alternating(runs, rounds, f"{count} streams"):
                side, kind = run
                measured[count][run].append(
                    servers[side].measure(prompts, args.new_tokens, KINDS[kind], args.waves)["tokens_per_s"]
                )
    rows = [summary(count, measured[count], sides, kinds) for count in streams]
    settings = {"model": str(args.model), "tree_a": args.tree_a, "a": args.a, "b": args.b, "threads": args.threads}
    settings["kinds"] = kinds
    settings.update(prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, repeats=rounds * count_of_launches)
    settings["waves"] = args.waves
    settings["launches"] = count_of_launches
    settings["flags"] = {kind: " ".join(KINDS[kind]) for kind in kinds}
    report({**settings, "rows": rows}, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


def summary(count: int, measured: dict[tuple[str, str], list[float]], sides: list[str], kinds: list[str]) -> dict:
    """One stream count's figures: per side and kind, tokens/s and the ratio to greedy (round by round,
    same server); per kind, b over a (round by round) when there are two sides."""
    row: dict = {"streams": count, "sides": {}}
    for side in sides:
        base = measured[side, BASELINE]
        row["sides"][side] = {
            kind: {
                "tokens_per_s": spread(measured[side, kind]),
                "over_greedy": spread([k / g for k, g in zip(measured[side, kind], base)]),
            }
            for kind in kinds
        }
    if "a" in sides:
        row["b_over_a"] = {
            kind: spread([b / a for a, b in zip(measured["a", kind], measured["b", kind])]) for kind in kinds
        }
    return row


def print_table(result: dict) -> None:
    a = f"{result['tree_a'] or 'this checkout'} {result['a']}" if "a" in result["rows"][0]["sides"] else "-"
    print(f"{result['model']}; a: {a}; b: this checkout {result['b']}")
    for row in result["rows"]:
        for side, kinds in row["sides"].items():
            for kind, figures in kinds.items():
                t, r = figures["tokens_per_s"], figures["over_greedy"]
                flags = result["flags"][kind] or "(greedy)"
                line = f"{row['streams']:>3} streams {side} {kind:<10} {flags:<48} {t['median']:>9,.1f} tokens/s"
                line += f"  {r['median']:.2f}x greedy ({r['min']:.2f}-{r['max']:.2f})"
                if side == "b" and "b_over_a" in row:
                    ba = row["b_over_a"][kind]
                    line += f"  b/a {ba['median']:.2f} ({ba['min']:.2f}-{ba['max']:.2f})"
                print(line)


def write_plot(result: dict, path: str) -> None:
    """One panel per stream count: each kind's ratio to greedy, a bar per side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(6 * len(rows), 4), squeeze=False)
    kinds = result["kinds"][1:]
    for ax, row in zip(axes[0], rows):
        sides = list(row["sides"])
        width = 0.8 / len(sides)
        for i, side in enumerate(sides):
            values = [row["sides"][side][kind]["over_greedy"]["median"] for kind in kinds]
            tree = result["tree_a"] if side == "a" and result["tree_a"] else "this checkout"
            label = f"{side}: {tree} {result[side]}"
            ax.bar([k + i * width for k in range(len(kinds))], values, width, label=label, color=f"C{i}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(kinds))])
        ax.set_xticklabels([result["flags"][kind] for kind in kinds], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("tokens/s over greedy's, same server and round", fontsize=8)
        ax.set_title(f"{row['streams']} streams", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"request kinds against greedy: {Path(result['model']).name}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    raise SystemExit(main())
