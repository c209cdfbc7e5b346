"""The host's pick of sampled rows whose penalties or bias change their logits (sampling.pick_whole_row, no
log-probabilities asked), two checkouts against each other: each side a process of its own running this
file's `--side` over its tree's attnserve, the sides alternating round by round. Per kind, a row of V float32
logits (temperature 0.7, top-p 0.9 unless said): `ban` (EOS banned, as ignore_eos), `repetition` (that and a
penalty of 1.1 on 80 seen ids), `occurrences` (presence 0.5 and frequency 0.3 on 40 ids, counts 1 to 3, no
ban), `bias` (EOS banned, two ids biased), `all` (the three) and `all_whole` (the three, every id drawn).
Before each call a sweep of 128 MB evicts the row from the caches, as a decode step does. Reports each side's
microseconds a row, median (min-max) over the rounds (each round's figure the median of --calls calls), b/a,
and whether the sides picked the same ids; then one JSON object last.

    git worktree add /tmp/before COMMIT
    python -m benchmarks.changed_rows_ab --tree-a /tmp/before [--tree-b .] [--vocab 50257] [--rounds 8] \\
        [--calls 100] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent
KINDS = ("ban", "repetition", "occurrences", "bias", "all", "all_whole")
SWEEP = 16 << 20  # float64s: 128 MB


def rows_of(kind: str, vocab: int):
    """The kind's PassRow (uniform 0; each call gives its own), built by the side's own attnserve."""
    from attnserve.engine.seam import PassRow

    rng = np.random.default_rng(1)
    seen = rng.choice(vocab, 80, replace=False).astype(np.int64)
    given: dict = {}
    if kind in ("repetition", "all", "all_whole"):
        given.update(repetition=1.1, seen=seen)
    if kind in ("occurrences", "all", "all_whole"):
        given.update(presence=0.5, frequency=0.3, occurred=seen[-40:], counts=rng.integers(1, 4, 40))
    bias = {"ban": ((vocab - 1, -np.inf),), "bias": ((vocab - 1, -np.inf), (5, 2.0), (77, -3.0))}
    bias["repetition"] = bias["ban"]
    bias["all"] = bias["all_whole"] = bias["bias"]
    top_p = 1.0 if kind == "all_whole" else 0.9
    return PassRow(0.7, 0, top_p, 0.0, 0.0, bias.get(kind, ()), **given)


def side(vocab: int, calls: int, seed: int) -> dict:
    """This process's attnserve: per kind, the median microseconds of `calls` picks and the ids picked."""
    from dataclasses import replace

    from attnserve.engine.sampling import pick_whole_row

    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((8, vocab)) * 2).astype(np.float32)
    sweep, out = np.ones(SWEEP), {}
    for kind in KINDS:
        row, times, ids = rows_of(kind, vocab), [], []
        for call in range(calls + 5):  # the first five: warm-up
            picked = replace(row, uniform=float(rng.random()))
            sweep += 1.0
            start = time.perf_counter()
            ids.append(pick_whole_row(logits[call % 8], picked, scored=False).token)
            if call >= 5:
                times.append((time.perf_counter() - start) * 1e6)
        out[kind] = {"us": float(np.median(times)), "ids": ids}
    return out


def run_side(tree: str, vocab: int, calls: int, seed: int) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{HERE}"}
    command = [sys.executable, str(Path(__file__).resolve()), "--side", "--vocab", str(vocab)]  # this file, any tree
    command += ["--calls", str(calls), "--seed", str(seed)]
    done = subprocess.run(command, cwd=tree, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree-a", help="side a's checkout (e.g. a git worktree of the commit before)")
    p.add_argument("--tree-b", default=str(HERE), help="side b's checkout (default: this one)")
    p.add_argument("--vocab", type=int, default=50257, help="ids a row (default: GPT-2's 50,257)")
    p.add_argument("--rounds", type=int, default=8, help="processes of each side, alternating (default: 8)")
    p.add_argument("--calls", type=int, default=100, help="picks of each kind a process (default: 100)")
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--plot", help="write a PNG of b/a per kind here")
    args = p.parse_args(argv)
    if args.side:
        print(json.dumps(side(args.vocab, args.calls, args.seed)))
        return 0
    if not args.tree_a:
        p.error("--tree-a is required")
    from attnserve.report_stamp import Stamp
    from benchmarks.serving import ab_kind, emit  # here: a side runs another tree's attnserve and benchmarks

    stamp = Stamp.start(provider="cpu")
    us: dict[str, dict[str, list[float]]] = {kind: {"a": [], "b": []} for kind in KINDS}
    same = dict.fromkeys(KINDS, True)
    for round_ in range(args.rounds):
        got = {}
        for name in ("a", "b") if round_ % 2 == 0 else ("b", "a"):
            got[name] = run_side(getattr(args, f"tree_{name}"), args.vocab, args.calls, round_)
        for kind in KINDS:
            for name in ("a", "b"):
                us[kind][name].append(got[name][kind]["us"])
            same[kind] &= got["a"][kind]["ids"] == got["b"][kind]["ids"]
    results = []
    for kind in KINDS:
        results.append(ab_kind(kind, us[kind], same[kind]))
    report = {
        "trees": {"a": args.tree_a, "b": args.tree_b},
        "vocab": args.vocab,
        "rounds": args.rounds,
        "calls": args.calls,
        "kinds": results,
        "stamp": stamp.finish(),
    }
    if args.plot:
        write_plot(report, args.plot)
    return emit(report, args.out)


def write_plot(report: dict, path: str) -> None:
    """b/a per kind, a bar each, with the rounds' spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.serving import error_bars

    kinds = report["kinds"]
    medians, errors = error_bars([kind["b_over_a"] for kind in kinds])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(range(len(kinds)), medians, yerr=errors, capsize=3, color="C0")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(kinds)))
    ax.set_xticklabels([kind["kind"] for kind in kinds], fontsize=8)
    ax.set_ylabel("b's time a row over a's (lower: b faster)", fontsize=8)
    ax.set_title(
        f"a sampled row's pick, {report['vocab']:,} ids: {report['trees']['b']} over {report['trees']['a']}", fontsize=8
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())
