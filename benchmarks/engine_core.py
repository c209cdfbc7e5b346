"""Where the engine runs, measured end to end: `attnserve serve --engine-core process` (the default)
against `--engine-core thread`, both driven by `attnserve bench` through gRPC, and onnxruntime-genai
decoding the same number of prompts in static batches (of up to 32, its limit here) in its own
process, on the same model directory, in one run.

Two servers over one model directory (same flags but the engine core) run side by side on
127.0.0.1; each round benches one, then the other, then genai (the order flips every round), at
every concurrency and stream interval asked for, with greedy requests of --prompt-tokens ids and
--new-tokens output tokens (genai: exactly that many; a request through gRPC may end early at
EOS, and is counted as produced). Medians over --repeats with min and max of output tokens/s, p50
inter-token and time-to-first-token latency, and the process/thread and process/genai ratios per
round; the load average before and after says whether the machine was busy. genai runs where
.venv-genai exists (`make test` builds it) unless --no-genai. Prints a table, then one JSON
object last. Torch-free.

    python -m benchmarks.engine_core --model models/small-1k-bpe [--concurrency 1,16,64]
        [--stream-interval 1,8] [--new-tokens 256] [--repeats 3] [--no-genai] [--out F.json] [--plot F.png]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from typing import Any

from attnserve.report_stamp import Stamp
from attnserve.runtime.contract import read_manifest
from benchmarks.kv import GENAI_PYTHON, genai_batch
from benchmarks.loadtest.server_process import ServerProcess
from benchmarks.serving import alternating, report, spread

MODES = ("thread", "process")
GENAI_MAX_BATCH = 32  # onnxruntime-genai 0.18 refuses more with this export ("batch_size (64) must be in [1, 32]")
TITLE = "Engine core: process vs thread vs onnxruntime-genai, through gRPC"


def bench(target: str, concurrency: int, interval: int, new_tokens: int, prompt_tokens: int) -> dict:
    """One `attnserve bench` level: its report's row (throughput and latency)."""
    requests = max(2 * concurrency, 8)
    command = [sys.executable, "-m", "attnserve.cli", "bench", "--target", target, "--concurrency", str(concurrency)]
    command += ["--requests", str(requests), "--max-new-tokens", str(new_tokens), "--prompt-tokens", str(prompt_tokens)]
    command += ["--stream-interval-tokens", str(interval), "--warmup", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    (level,) = json.loads(done.stdout.strip().splitlines()[-1])["levels"]
    return {
        "tokens_per_s": level["output_tokens_per_s"],
        "itl_p50_ms": level["itl_ms"]["p50"],
        "ttft_p50_ms": level["ttft_ms"]["p50"],
        "errors": level["requests"] - level["completed"],
    }


def median_of(runs: list[dict], key: str) -> dict[str, float]:
    return spread([r[key] for r in runs])


def genai_prompts(model_dir: str, count: int, prompt_tokens: int) -> list[list[int]]:
    """`count` prompts of prompt_tokens ids, drawn as `attnserve bench` draws its own (specials left out)."""
    m = read_manifest(model_dir, verify=False)
    specials = {m.bos_id, m.eos_id, m.pad_id}
    rng = random.Random(count)
    return [rng.choices([i for i in range(m.vocab_size) if i not in specials], k=prompt_tokens) for _ in range(count)]


def genai_batches(model_dir: str, ids: list[list[int]], new_tokens: int) -> dict[str, float]:
    """genai decoding the prompts in static batches of at most GENAI_MAX_BATCH, one after the other
    (what a server built on its batch API does with more requests than a batch holds): tokens/s
    over the batches' decode time."""
    parts = [
        genai_batch(model_dir, ids[i : i + GENAI_MAX_BATCH], new_tokens) for i in range(0, len(ids), GENAI_MAX_BATCH)
    ]
    tokens, seconds = sum(p["tokens"] for p in parts), sum(p["seconds"] for p in parts)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def ratio(runs: dict[str, list[dict]], side: str, other: str) -> dict[str, float]:
    """side / other per round: median, min, max."""
    return spread([a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs[side], runs[other])])


def measure(args, servers: dict[str, ServerProcess]) -> list[dict]:
    rows = []
    sides = (*MODES, "genai") if args.genai else MODES
    for interval in [int(i) for i in args.stream_interval.split(",")]:
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            runs: dict[str, list[dict]] = {side: [] for side in sides}
            ids = genai_prompts(args.model, concurrency, args.prompt_tokens)
            label = f"stream interval {interval}, {concurrency} streams"
            for side in alternating(sides, args.repeats, label):
                if side == "genai":
                    runs[side].append(genai_batches(args.model, ids, args.new_tokens))
                else:
                    target = servers[side].target
                    runs[side].append(bench(target, concurrency, interval, args.new_tokens, args.prompt_tokens))
            row: dict[str, Any] = {"stream_interval": interval, "concurrency": concurrency}
            for mode in MODES:
                row[mode] = {key: median_of(runs[mode], key) for key in ("tokens_per_s", "itl_p50_ms", "ttft_p50_ms")}
                row[mode]["errors"] = sum(r["errors"] for r in runs[mode])
            row["process_vs_thread"] = ratio(runs, "process", "thread")
            if args.genai:
                row["genai"] = {"tokens_per_s": median_of(runs["genai"], "tokens_per_s")}
                row["process_vs_genai"] = ratio(runs, "process", "genai")
            rows.append(row)
    return rows


def print_table(result: dict) -> None:
    head = ["interval", "streams", "thread tok/s", "process tok/s", "process/thread (min-max)", "ITL p50 ms t/p"]
    head += ["genai tok/s", "process/genai (min-max)"]
    print("{:>8} {:>8} {:>13} {:>14} {:>25} {:>15} {:>12} {:>24}".format(*head))
    for row in result["rows"]:
        t, p, pt = row["thread"], row["process"], row["process_vs_thread"]
        line = (
            f"{row['stream_interval']:>8} {row['concurrency']:>8} {t['tokens_per_s']['median']:>13,.0f} "
            f"{p['tokens_per_s']['median']:>14,.0f} {pt['median']:>14.2f}x {pt['min']:.2f}-{pt['max']:.2f} "
            f"{t['itl_p50_ms']['median']:>7.2f}/{p['itl_p50_ms']['median']:.2f}"
        )
        if "genai" in row:
            pg, genai = row["process_vs_genai"], row["genai"]["tokens_per_s"]["median"]
            line += f" {genai:>12,.0f} {pg['median']:>13.2f}x {pg['min']:.2f}-{pg['max']:.2f}"
        print(line)


def write_plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['concurrency']} streams\ninterval {r['stream_interval']}" for r in result["rows"]]
    xs = range(len(labels))
    bars = [("thread", "--engine-core thread"), ("process", "--engine-core process")]
    if all("genai" in r for r in result["rows"]):
        bars.append(("genai", "onnxruntime-genai, static batch"))
    width = 0.8 / len(bars)
    for n, (side, label) in enumerate(bars):
        values = [r[side]["tokens_per_s"]["median"] for r in result["rows"]]
        ax.bar([x + (n - (len(bars) - 1) / 2) * width for x in xs], values, width=width, label=label)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("output tokens/s (gRPC: attnserve bench)")
    ax.set_title(f"{result['model']}: engine core process vs thread vs genai")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated streams in flight (genai: batch size)")
    p.add_argument("--stream-interval", default="1,8", help="comma-separated --stream-interval-tokens")
    p.add_argument("--new-tokens", type=int, default=256, help="greedy tokens per request")
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt token ids per request")
    p.add_argument("--repeats", type=int, default=3, help="rounds, the servers alternating; medians reported")
    p.add_argument("--no-genai", action="store_true", help="leave onnxruntime-genai out")
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--plot", help="write a PNG bar chart here")
    args = p.parse_args(argv)
    args.genai = GENAI_PYTHON.exists() and not args.no_genai
    stamp = Stamp.start(provider="cpu")
    flags = ["--provider", "cpu", "--max-batch", "64", "--max-queue", "256"]
    flags += ["--max-new-tokens-cap", str(args.new_tokens)]
    servers = {mode: ServerProcess(args.model, *flags, "--engine-core", mode) for mode in MODES}
    try:
        rows = measure(args, servers)
    finally:
        for server in servers.values():
            server.stop()
    result = {
        "model": args.model,
        "new_tokens": args.new_tokens,
        "prompt_tokens": args.prompt_tokens,
        "repeats": args.repeats,
        "genai": args.genai,
        "rows": rows,
    }
    report(result, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
