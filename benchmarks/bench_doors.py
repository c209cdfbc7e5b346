"""attnserve's two streaming doors measured by the same tool: `attnserve bench` against the gRPC door
(attnserve.v1) and `attnserve bench --backend openai` against the HTTP door (/v1/completions), one
`attnserve serve` process, one model, one run (issue 61).

Both sides send the same requests: text prompts (--prompt-text, the only prompts an OpenAI-compatible
server takes), --ignore-eos so that each runs to --new-tokens, and either greedy or the production mix
(--mix production: 70% sampled, 20% greedy, 10% with logprobs). Each round runs both sides, in turn
forwards and backwards, each `attnserve bench` a process of its own with one warm-up request; the
report gives each level's median over --repeats rounds with min and max: output tokens/s, TTFT p50
and TPOT p50 (time per output token: the gap from the first token to the last over the tokens, blind
to how they were chunked; the HTTP door's ITL is per chunk, gRPC's per token), the messages (gRPC)
or chunks (HTTP) a request's tokens came in, and the ratios HTTP / gRPC. Prints a table, then one
JSON object last; --out writes it with a Markdown report.

    python -m benchmarks.bench_doors --model models/small [--concurrency 1,16] [--requests 32]
        [--new-tokens 64] [--mix production] [--repeats 5] [--out F.json] [--plot F.png]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from typing import Any

from attnserve.report_stamp import Stamp
from benchmarks.serving import alternating, progress, report, spread

SIDES = ("grpc", "http")
FIGURES = ("output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "messages_per_request")
TITLE = "attnserve bench: the gRPC door against the HTTP door, one server"


class Served:
    """`attnserve serve --model M --port 0 --http-port 0` in a process of its own, once it listens."""

    def __init__(self, model: str, threads: int):
        command = [sys.executable, "-m", "attnserve.cli", "serve", "--model", model, "--port", "0"]
        command += ["--http-port", "0", "--log-stats-interval", "0", "--threads", str(threads)]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.grpc, self.http_url = 0, ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if found := re.search(r"listening on \S+:(\d+)", line):
                self.grpc = int(found.group(1))
            if found := re.search(r"OpenAI-compatible API on (http://\S+/v1)", line):
                self.http_url = found.group(1)
                return
        raise RuntimeError(f"attnserve serve --model {model} exited before it listened")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def bench(served: Served, side: str, args: argparse.Namespace) -> dict[str, Any]:
    """One `attnserve bench` run against one door: its JSON report."""
    command = [sys.executable, "-m", "attnserve.cli", "bench", "--concurrency", args.concurrency]
    command += ["--requests", str(args.requests), "--max-new-tokens", str(args.new_tokens), "--ignore-eos"]
    command += ["--prompt-text", "--prompt-tokens", str(args.prompt_tokens), "--warmup", "1", "--seed", "0"]
    if args.mix:
        command += ["--mix", args.mix]
    if side == "http":
        command += ["--backend", "openai", "--target", served.http_url]
    else:
        command += ["--target", f"127.0.0.1:{served.grpc}"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def figures(level: dict[str, Any]) -> dict[str, float]:
    assert not level["errors"], level["errors"]
    return {
        "output_tokens_per_s": level["output_tokens_per_s"],
        "ttft_p50_ms": level["ttft_ms"]["p50"],
        "tpot_p50_ms": level["tpot_ms"]["p50"],
        "messages_per_request": level["messages_per_request"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(c) for c in args.concurrency.split(",")]
    rounds: dict[str, list[dict[int, dict[str, float]]]] = {side: [] for side in SIDES}
    served = Served(args.model, args.threads)
    try:
        for side in alternating(SIDES, args.repeats, "gRPC and HTTP doors"):
            result = bench(served, side, args)
            rounds[side].append({lv["concurrency"]: figures(lv) for lv in result["levels"]})
    finally:
        served.stop()
    rows = []
    for c in levels:
        row: dict[str, Any] = {"concurrency": c}
        for side in SIDES:
            for name in FIGURES:
                row[f"{side}_{name}"] = spread([r[c][name] for r in rounds[side]])
        for name in FIGURES:  # each round's HTTP over its gRPC
            ratios = [h[c][name] / g[c][name] for h, g in zip(rounds["http"], rounds["grpc"])]
            row[f"http_over_grpc_{name}"] = spread(ratios)
        rows.append(row)
    return {
        "benchmark": "bench_doors",
        "model": args.model,
        "requests": {
            "prompts": f"text, {args.prompt_tokens - 1} ASCII bytes",
            "new_tokens": args.new_tokens,
            "ignore_eos": True,
            "mix": args.mix or "greedy",
            "requests_per_level": args.requests,
        },
        "repeats": args.repeats,
        "levels": rows,
        "rounds": rounds,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'streams':>7}  {'figure':<20} {'gRPC':>10} {'HTTP':>10}  {'HTTP/gRPC (min-max)':>22}")
    for row in result["levels"]:
        for name in FIGURES:
            ratio = row[f"http_over_grpc_{name}"]
            print(
                f"{row['concurrency']:>7}  {name:<20} {row[f'grpc_{name}']['median']:>10.2f} "
                f"{row[f'http_{name}']['median']:>10.2f}  "
                f"{ratio['median']:>8.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})"
            )


def plot(result: dict[str, Any], path: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 3.6))
    levels = [row["concurrency"] for row in result["levels"]]
    for ax, name in zip(fig.subplots(1, len(FIGURES)), FIGURES):
        for side, marker in zip(SIDES, "os"):
            med = [row[f"{side}_{name}"]["median"] for row in result["levels"]]
            low = [m - row[f"{side}_{name}"]["min"] for m, row in zip(med, result["levels"])]
            high = [row[f"{side}_{name}"]["max"] - m for m, row in zip(med, result["levels"])]
            ax.errorbar(levels, med, yerr=[low, high], marker=marker, capsize=3, label=side)
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("streams")
        ax.set_title(name)
        ax.legend()
    fig.suptitle(f"{TITLE} ({result['requests']['mix']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=TITLE)
    p.add_argument("--model", required=True, help="model directory (or Hugging Face checkpoint) to serve")
    p.add_argument("--concurrency", default="1,16", help="comma-separated streams per level")
    p.add_argument("--requests", type=int, default=32, help="requests per level")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per request (--ignore-eos)")
    p.add_argument("--prompt-tokens", type=int, default=32, help="--prompt-text's length (bytes + 1)")
    p.add_argument("--mix", default=None, help="a mix of attnserve bench's (production), else greedy")
    p.add_argument("--threads", type=int, default=0, help="the server's --threads")
    p.add_argument("--repeats", type=int, default=5, help="rounds, each running both sides")
    p.add_argument("--out", default=None, help="write the JSON here (and its Markdown report beside it)")
    p.add_argument("--plot", default=None, help="write a PNG of the figures here")
    args = p.parse_args()
    stamp = Stamp.start()
    progress(f"serving {args.model}; {args.repeats} rounds of both doors at {args.concurrency} streams")
    result = run(args)
    stamp.provider = "CPUExecutionProvider"
    report(result, stamp, args.out, args.plot, print_table, plot, title=TITLE)


if __name__ == "__main__":
    main()
