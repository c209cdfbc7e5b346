"""Bytes vs BPE, served: the same `attnserve bench` run against two servers, one per model
directory, alternating in rounds, compared in output bytes/s (tokens of different tokenizers
do not compare) and tokens/s.

Starts `attnserve serve` twice (ports 0, each with the default configuration), runs `attnserve
bench` in a process of its own against one, then the other, --rounds times, and reports medians
with their range and the BPE / bytes ratios. Writes JSON with its Markdown report, and a PNG;
prints a Markdown table.

    python benchmarks/tokenizer_serving.py --bytes models/tok-bytes --bpe models/tok-bpe \
        --out reports/tokenizer-serving.json --plot reports/tokenizer-serving.png
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

from attnserve.report_stamp import Stamp, write_report

SERVE = [sys.executable, "-m", "attnserve.cli", "serve"]
BENCH = [sys.executable, "-m", "attnserve.cli", "bench"]


def start(model: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [*SERVE, "--model", model, "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if found:
            return proc, int(found.group(1))
    raise RuntimeError(f"attnserve serve --model {model} did not start")


def bench(port: int, args) -> list[dict]:
    out = subprocess.run(
        [
            *BENCH,
            "--target",
            f"127.0.0.1:{port}",
            "--concurrency",
            args.concurrency,
            "--requests",
            str(args.requests),
            "--max-new-tokens",
            str(args.new_tokens),
            "--prompt-text",  # the same text to both models: what their tokenizers make of it is the point
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["levels"]


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", required=True, help="model directory of the byte tokenizer")
    p.add_argument("--bpe", required=True, help="model directory of the BPE")
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="reports/tokenizer-serving.json")
    p.add_argument("--plot", default="reports/tokenizer-serving.png")
    args = p.parse_args()
    stamp = Stamp.start()
    servers = {side: start(model) for side, model in (("bytes", args.bytes), ("bpe", args.bpe))}
    runs: dict[str, list[list[dict]]] = {side: [] for side in servers}
    try:
        for _, port in servers.values():
            bench(port, argparse.Namespace(**{**vars(args), "requests": 4}))  # warm-up
        for r in range(args.rounds):
            for side, (_, port) in servers.items():
                print(f"round {r + 1}/{args.rounds}: {side}", file=sys.stderr, flush=True)
                runs[side].append(bench(port, args))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    levels = [int(c) for c in args.concurrency.split(",")]
    result = {"config": vars(args), "levels": {}}
    for i, c in enumerate(levels):
        row = {
            side: {
                key: summary([run[i][key] for run in runs[side]])
                for key in ("output_tokens_per_s", "output_bytes_per_s")
            }
            for side in runs
        }
        row["bpe_vs_bytes"] = {
            key: row["bpe"][key]["median"] / row["bytes"][key]["median"]
            for key in ("output_tokens_per_s", "output_bytes_per_s")
        }
        result["levels"][str(c)] = row
    result["stamp"] = stamp.finish()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    plot(result, args.plot)
    write_report(args.out, result, args.plot, "Bytes vs BPE, served")
    print("| in flight | bytes: tok/s | bytes: B/s | BPE: tok/s | BPE: B/s | BPE / bytes, B/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for level, row in result["levels"].items():
        cell = lambda side, key, row=row: (
            f"{row[side][key]['median']:,.0f} [{row[side][key]['min']:,.0f}-{row[side][key]['max']:,.0f}]"
        )
        print(
            f"| {level} | {cell('bytes', 'output_tokens_per_s')} | {cell('bytes', 'output_bytes_per_s')} | "
            f"{cell('bpe', 'output_tokens_per_s')} | {cell('bpe', 'output_bytes_per_s')} | "
            f"**{row['bpe_vs_bytes']['output_bytes_per_s']:.2f}x** |"
        )
    print(json.dumps(result))
    return 0


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(result["levels"])
    fig, ax = plt.subplots(figsize=(6, 3.2))
    width = 0.38
    for k, side in enumerate(("bytes", "bpe")):
        values = [result["levels"][c][side]["output_bytes_per_s"]["median"] for c in levels]
        ax.bar([i + (k - 0.5) * width for i in range(len(levels))], values, width, label=side)
    ax.set_xticks(range(len(levels)), [f"{c} in flight" for c in levels])
    ax.set_ylabel("output bytes/s (median)")
    ax.set_title("attnserve bench through gRPC: bytes vs BPE")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
