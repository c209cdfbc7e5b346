"""Tracing's cost, and a collector outage under load: the same model served twice at once, once with
tracing off and once with --otlp-traces-endpoint to an OTLP receiver in this process
(benchmarks/otlp_receiver.py), driven in turn by `attnserve bench` (the order flips every round).

Per stream count: each side's output tokens/s (median, min and max of the rounds) and on/off per round;
with --tree-before (a checkout from before tracing, e.g. a git worktree), a third side, that tree's
server, and off/before per round: what tracing costs a server that has it off.
Then the outage: a longer bench run on the traced server, the receiver stopped once the run is under
way; every request must still end OK, and the server's metrics must count the spans lost
(attnserve_trace_spans_dropped_total, both processes). JSON, its Markdown report and a PNG.

    python -m benchmarks.tracing --model models/NAME [--streams 1,16] [--requests-per-stream 4]
        [--prompt-tokens 16] [--new-tokens 64] [--repeats 5] [--tree-before DIR] [--out F.json] [--plot F.png]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from attnserve.report_stamp import Stamp
from benchmarks.loadtest.server_process import ServerProcess
from benchmarks.otlp_receiver import Receiver
from benchmarks.serving import alternating, progress, report, spread

SIDES = ("off", "on")
TITLE = "Tracing on against off, same model, alternating; a collector outage under load"
CLI = [sys.executable, "-m", "attnserve.cli"]
EXPORT_TIMEOUT_S = "2"  # the traced server's OTLP export gives up on a dead collector this soon (the outage)


def bench(target: str, streams: int, requests: int, prompt_tokens: int, new_tokens: int) -> dict:
    """`attnserve bench` at one concurrency: its level's report."""
    command = [*CLI, "bench", "--target", target, "--concurrency", str(streams), "--requests", str(requests)]
    command += ["--prompt-tokens", str(prompt_tokens), "--max-new-tokens", str(new_tokens), "--ignore-eos"]
    done = subprocess.run([*command, "--warmup", "1"], capture_output=True, text=True, timeout=1800, check=True)
    (level,) = json.loads(done.stdout.strip().splitlines()[-1])["levels"]
    return level


def dropped(metrics_url: str) -> dict[str, float]:
    """attnserve_trace_spans_dropped_total by process, from the server's /metrics."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    found = re.findall(r'attnserve_trace_spans_dropped_total\{process="(\w+)"\} (\S+)', text)
    return {process: float(value) for process, value in found}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=Path, help="model directory written by `attnserve export`")
    p.add_argument("--streams", default="1,16", help="comma-separated streams at once")
    p.add_argument("--requests-per-stream", type=int, default=4, help="requests each stream sends in a round")
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="rounds, the sides alternating; medians reported")
    p.add_argument("--outage-requests", type=int, default=256, help="requests of the outage's run (16 at once)")
    p.add_argument("--tree-before", help="a checkout from before tracing: a third side, served from there")
    p.add_argument("--out", help="write the JSON result (and its Markdown report) here")
    p.add_argument("--plot", help="write the PNG here")
    args = p.parse_args(argv)
    streams = [int(s) for s in args.streams.split(",")]
    stamp = Stamp.start(provider="cpu")
    receiver = Receiver().start()
    model = str(args.model.resolve())
    fixed = ["--provider", "cpu", "--max-batch", str(max(streams)), "--max-queue", str(4 * max(streams))]
    fixed += ["--max-new-tokens-cap", str(args.new_tokens), "--log-stats-interval", "0"]
    traced = ["--otlp-traces-endpoint", receiver.endpoint]
    sides = ("before", *SIDES) if args.tree_before else SIDES
    servers = {
        **({"before": ServerProcess(model, *fixed, cwd=args.tree_before)} if args.tree_before else {}),
        "off": ServerProcess(model, *fixed),
        "on": ServerProcess(model, *fixed, *traced, env={"OTEL_EXPORTER_OTLP_TIMEOUT": EXPORT_TIMEOUT_S}),
    }
    rows, outage = [], {}
    try:
        for count in streams:
            requests = count * args.requests_per_stream
            for server in servers.values():
                bench(server.target, count, count, args.prompt_tokens, 4)  # warm-up
            runs: dict[str, list[dict]] = {side: [] for side in sides}
            for side in alternating(sides, args.repeats, f"{count} streams"):
                level = bench(servers[side].target, count, requests, args.prompt_tokens, args.new_tokens)
                assert level["completed"] == level["requests"], level
                runs[side].append(level)
            rows.append(summary(count, requests, runs))
        spans_before = len(receiver.spans)
        outage = run_outage(servers["on"], receiver, args)
        outage["spans_received_before_the_outage"] = spans_before
    finally:
        for server in servers.values():
            server.stop()
        receiver.stop()
    settings = {"model": str(args.model), "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens}
    settings |= {"repeats": args.repeats, "export_timeout_s": float(EXPORT_TIMEOUT_S), "tree_before": args.tree_before}
    report({**settings, "rows": rows, "outage": outage}, stamp, args.out, args.plot, print_table, plot, title=TITLE)
    return 0


def summary(count: int, requests: int, runs: dict[str, list[dict]]) -> dict:
    """One stream count's row: each side's tokens/s and TTFT p50 over the rounds, and on/off per round."""
    row: dict = {"streams": count, "requests_per_round": requests}
    for side in runs:
        row[f"{side}_tokens_per_s"] = spread([r["output_tokens_per_s"] for r in runs[side]])
        row[f"{side}_ttft_p50_ms"] = spread([r["ttft_ms"]["p50"] for r in runs[side]])
    row["on_over_off"] = ratios(runs["on"], runs["off"])
    if "before" in runs:
        row["off_over_before"] = ratios(runs["off"], runs["before"])
    return row


def ratios(sides: list[dict], others: list[dict]) -> dict[str, float]:
    """tokens/s of one side over another's, round by round."""
    return spread([a["output_tokens_per_s"] / b["output_tokens_per_s"] for a, b in zip(sides, others)])


def run_outage(server: ServerProcess, receiver: Receiver, args) -> dict:
    """A 16-stream bench on the traced server; the receiver stops once a third of it is done (by the
    spans it has received); every request must end OK and the losses must be counted."""
    requests = args.outage_requests
    command = [*CLI, "bench", "--target", server.target, "--concurrency", "16", "--requests", str(requests)]
    command += ["--prompt-tokens", str(args.prompt_tokens), "--max-new-tokens", str(args.new_tokens)]
    command += ["--ignore-eos", "--warmup", "0", "--trace"]
    progress(f"outage: {requests} requests, 16 at once; the receiver stops a third of the way")
    before = len(receiver.spans)
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # each request leaves 2 spans: its door's and the engine core's
    while len(receiver.spans) - before < 2 * requests // 3 and run.poll() is None:
        time.sleep(0.05)
    received = len(receiver.spans) - before
    receiver.stop()
    stopped_at = time.monotonic()
    out, _ = run.communicate(timeout=1800)
    (level,) = json.loads(out.strip().splitlines()[-1])["levels"]
    counts: dict[str, float] = {}
    for _ in range(60):  # the exports fail after the exporter's retries; the core's count comes with a step
        counts = dropped(server.metrics_url)
        if counts.get("front_end", 0) > 0 and counts.get("engine_core", 0) > 0:
            break
        bench(server.target, 1, 1, args.prompt_tokens, 2)
        time.sleep(1)
    return {
        "requests": requests,
        "completed": level["completed"],
        "errors": level.get("errors", {}),
        "spans_received_before_stop": received,
        "spans_dropped": counts,
        "seconds_until_counted": round(time.monotonic() - stopped_at, 1),
        "tokens_per_s": level["output_tokens_per_s"],
    }


def print_table(result: dict) -> None:
    for row in result["rows"]:
        r = row["on_over_off"]
        print(
            f"{row['streams']:>3} streams: off {row['off_tokens_per_s']['median']:,.1f} tokens/s, on "
            f"{row['on_tokens_per_s']['median']:,.1f}, on/off {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})"
            + (f"; off/before {row['off_over_before']['median']:.3f}" if "off_over_before" in row else "")
        )
    o = result["outage"]
    print(
        f"outage: {o['completed']} of {o['requests']} requests completed, errors {o['errors'] or 'none'}; "
        f"spans dropped {o['spans_dropped']}"
    )


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 4))
    sides = [side for side in ("before", *SIDES) if f"{side}_tokens_per_s" in rows[0]]
    width = 0.8 / len(sides)
    for i, side in enumerate(sides):
        xs = [k + (i - (len(sides) - 1) / 2) * width for k in range(len(rows))]
        values = [row[f"{side}_tokens_per_s"] for row in rows]
        medians = [v["median"] for v in values]
        errors = [[m - v["min"] for m, v in zip(medians, values)], [v["max"] - m for m, v in zip(medians, values)]]
        label = "before tracing" if side == "before" else f"tracing {side}"
        ax.bar(xs, medians, width, yerr=errors, capsize=4, label=label)
    for k, row in enumerate(rows):
        ax.annotate(
            f"on/off {row['on_over_off']['median']:.3f}", (k, 0), xytext=(0, 4), textcoords="offset points", ha="center"
        )
    ax.set_xticks(range(len(rows)), [f"{row['streams']} streams" for row in rows])
    ax.set_ylabel("output tokens/s (median, min-max)")
    ax.set_title("attnserve serve, tracing off and on (same run)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
