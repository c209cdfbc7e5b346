"""Which tokenizer should `attnserve train` default to? Train the `small` preset for the same time
budget with each tokenizer and compare held-out bits per byte (the loss per UTF-8 byte of the
held-out tail, so tokenizers compare fairly).

`make tokenizer-table` runs this: one `attnserve train` per configuration, one after another,
each in its own process on the whole machine. The load average before and after each run is
recorded: a run on a busy machine does fewer steps in its budget. Writes JSON with its Markdown
report, and a PNG, and prints a Markdown table (the README's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from attnserve.report_stamp import Stamp, write_report


def train(name: str, spec: str, budget: float, runs: Path) -> dict:
    kind, _, vocab = spec.partition(":")
    out = runs / name
    cmd = [
        sys.executable,
        "-m",
        "attnserve.cli",
        "train",
        "--preset",
        "small",
        "--tokenizer",
        kind,
        "--time-budget",
        str(budget),
        "--out",
        str(out),
    ] + (["--vocab-size", vocab] if vocab else [])
    load_before, start = os.getloadavg()[0], time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    state = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=True)
    tokens = state["step"] * state["train_config"]["batch_size"] * state["config"]["max_len"]
    return {
        "name": name,
        "tokenizer": kind,
        "vocab_size": state["config"]["vocab_size"],
        "heldout_bits_per_byte": round(state["heldout_bpb"], 4),
        "steps": state["step"],
        "train_seconds": round(state["train_seconds"], 1),
        "tokens_per_s": round(tokens / state["train_seconds"]),
        "wall_seconds": round(wall, 1),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "command": " ".join(["attnserve", *cmd[3:]]),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| tokenizer | ids | held-out bits/byte | steps | tokens/s | load before/after |",
        "|---|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r['name']} | {r['vocab_size']} | {r['heldout_bits_per_byte']:.3f} | {r['steps']} | "
        f"{r['tokens_per_s']:,} | {r['load_before']} / {r['load_after']} |"
        for r in rows
    ]
    return "\n".join(lines)


def plot(rows: list[dict], path: str, budget: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar([r["name"] for r in rows], [r["heldout_bits_per_byte"] for r in rows], color="#4c72b0")
    for i, r in enumerate(rows):
        ax.text(i, r["heldout_bits_per_byte"], f"{r['heldout_bits_per_byte']:.3f}", ha="center", va="bottom")
    ax.set_ylabel("held-out bits per byte")
    ax.set_title(f"small preset, {budget:g} s of training each, 2 CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--configs",
        default="bytes,bpe:512,bpe:1024,bpe:2048",
        help="comma-separated KIND[:VOCAB] (default bytes,bpe:512,bpe:1024,bpe:2048)",
    )
    p.add_argument("--budget", type=float, default=180.0, help="training seconds per run (default 180)")
    p.add_argument("--runs", default="runs/tokenizers", help="folder of the runs")
    p.add_argument("--out", default="reports/tokenizers.json")
    p.add_argument("--plot", default="reports/tokenizers.png")
    args = p.parse_args()
    stamp = Stamp.start()
    rows = []
    for spec in args.configs.split(","):
        name = spec.replace(":", " ")
        print(f"training {name} for {args.budget:g} s ...", file=sys.stderr, flush=True)
        rows.append(train(spec.replace(":", "-"), spec, args.budget, Path(args.runs)))
        rows[-1]["name"] = name
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    report = {"budget_seconds": args.budget, "preset": "small", "cores": os.cpu_count(), "runs": rows}
    report["stamp"] = stamp.finish()
    plot(rows, args.plot, args.budget)
    write_report(args.out, report, args.plot, "Tokenizers trained for the same time budget")
    print(table(rows))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
