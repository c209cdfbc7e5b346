"""Direct `attnserve serve` against the same model through Ray Serve's gRPC proxy (`attnserve ray-serve`).

Both run at once, one engine each with the same flags (the Ray side: one replica); `attnserve bench`
drives them in alternating rounds (the side that goes first swaps each round), at each stream
interval: one stream's time per output token and time to first token, and 16 streams' output
tokens/s. Writes JSON (raw rounds, medians, spread, the stamp) with its Markdown report, and a PNG;
prints the summary last.

    .venv/bin/python benchmarks/ray_bench.py --model models/small --rounds 3 --intervals 1,4,8,16 \\
        --out reports/ray.json --plot reports/ray.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnserve.report_stamp import Stamp, write_report

ROOT = Path(__file__).resolve().parents[1]
ATTNSERVE = [sys.executable, "-m", "attnserve.cli"]
SIDES = ("direct", "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], ready: str, log: Path, timeout: float = 180.0) -> subprocess.Popen:
    """A subcommand in a session of its own, its output in `log`, once `ready` appears there."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*ATTNSERVE, *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
    end = time.monotonic() + timeout
    while ready not in log.read_text():
        if proc.poll() is not None or time.monotonic() > end:
            stop(proc)
            sys.exit(f"{args[0]} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def session_cpu_s(session: int) -> float:
    """CPU seconds used so far by the processes of a session (Ray's head and workers live in one)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        if int(fields[3]) == session:  # fields from state on: ppid, pgrp, session, ..., utime (12), stime (13)
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def idle_cores(session: int, seconds: float = 10.0) -> float:
    """Cores an idle session keeps busy: the cost of Ray's background, paid by both sides' rounds."""
    before = session_cpu_s(session)
    time.sleep(seconds)
    return (session_cpu_s(session) - before) / seconds


def bench(target: str, interval: int, a: argparse.Namespace) -> dict:
    """One `attnserve bench` run at concurrency 1 and 16: the numbers this comparison reports."""
    command = [
        *ATTNSERVE,
        *("bench", "--target", target, "--concurrency", "1,16", "--requests", str(a.requests)),
        *("--prompt-tokens", "16", "--prompt-text", "--max-new-tokens", str(a.max_new_tokens), "--warmup", "4"),
        *("--stream-interval-tokens", str(interval)),
    ]
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    one, many = json.loads(out.strip().splitlines()[-1])["levels"]
    assert not one["errors"] and not many["errors"], (one["errors"], many["errors"])
    return {
        "tpot_ms_c1": one["tpot_ms"]["p50"],
        "ttft_ms_c1": one["ttft_ms"]["p50"],
        "tokens_per_s_c16": many["output_tokens_per_s"],
        "messages_per_request_c16": many["messages_per_request"],
    }


def summarize(rounds: list[dict], intervals: list[int]) -> dict:
    """Per side and interval: median, min and max over rounds; Ray / direct per round, then its median."""
    summary: dict = {}
    for interval in intervals:
        for side in SIDES:
            runs = [r[side][str(interval)] for r in rounds]
            summary[f"{side}/{interval}"] = {
                key: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                for key in runs[0]
                for v in [[run[key] for run in runs]]
            }
        ratios = [
            {k: r["ray"][str(interval)][k] / r["direct"][str(interval)][k] for k in r["ray"][str(interval)]}
            for r in rounds
        ]
        summary[f"ray_over_direct/{interval}"] = {k: statistics.median(x[k] for x in ratios) for k in ratios[0]}
    return summary


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    intervals, summary = report["intervals"], report["summary"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = [
        ("tpot_ms_c1", "one stream: time per output token (ms)"),
        ("ttft_ms_c1", "one stream: time to first token (ms)"),
        ("tokens_per_s_c16", "16 streams: output tokens/s"),
    ]
    width = 0.38
    for ax, (key, title) in zip(axes, panels):
        for i, side in enumerate(SIDES):
            stats = [summary[f"{side}/{n}"][key] for n in intervals]
            med = [s["median"] for s in stats]
            err = [[m - s["min"] for m, s in zip(med, stats)], [s["max"] - m for m, s in zip(med, stats)]]
            xs = [x + (i - 0.5) * width for x in range(len(intervals))]
            ax.bar(xs, med, width, yerr=err, capsize=3, label="direct" if side == "direct" else "Ray Serve proxy")
        ax.set_xticks(range(len(intervals)), [str(n) for n in intervals])
        ax.set_xlabel("stream interval (tokens per message)")
        ax.set_title(title, fontsize=10)
    axes[0].legend()
    fig.suptitle(f"{report['model']}: direct attnserve serve vs Ray Serve's gRPC proxy (median, min-max of rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="models/small")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--intervals", default="1,4,8,16", help="stream intervals in tokens, comma-separated")
    p.add_argument("--requests", type=int, default=48, help="requests per concurrency level and run")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads of each engine")
    p.add_argument("--out", default="reports/ray.json")
    p.add_argument("--plot", default="reports/ray.png")
    a = p.parse_args()
    intervals = [int(n) for n in a.intervals.split(",")]
    engine = ["--model", a.model, "--threads", str(a.threads), "--max-batch", "16"]
    logs = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    direct_port, ray_port = free_port(), free_port()
    procs = []
    try:
        procs.append(start(["serve", *engine, "--port", str(direct_port)], "listening on", logs / "serve.log"))
        ray_args = ["ray-serve", *engine, "--replicas", "1", "--grpc-port", str(ray_port)]
        procs.append(start([*ray_args, "--http-port", str(free_port())], "through Ray", logs / "ray.log"))
        targets = {"direct": f"127.0.0.1:{direct_port}", "ray": f"127.0.0.1:{ray_port}"}
        ray_idle = idle_cores(procs[1].pid)
        stamp = Stamp.start()  # here: the load average before the rounds, Ray already idling
        rounds: list[dict[str, dict]] = []
        for r in range(a.rounds):
            order = SIDES if r % 2 == 0 else SIDES[::-1]
            rounds.append({side: {} for side in SIDES})
            for side in order:
                for interval in intervals:
                    rounds[-1][side][str(interval)] = result = bench(targets[side], interval, a)
                    print(f"round {r + 1} {side:6} interval {interval:2}: {result}", file=sys.stderr, flush=True)
    finally:
        for proc in procs:
            stop(proc)
    report = {
        "model": Path(a.model).name,
        "machine": "shared: server, Ray and the load generator on the same cores; "
        f"Ray's processes, idle, kept {ray_idle:.2f} cores busy (measured over 10 s before the rounds)",
        "engine_flags": " ".join(engine[2:]),
        "bench": f"attnserve bench --concurrency 1,16 --requests {a.requests} --prompt-tokens 16 --prompt-text "
        f"--max-new-tokens {a.max_new_tokens} --warmup 4 --stream-interval-tokens N",
        "intervals": intervals,
        "rounds": rounds,
        "summary": summarize(rounds, intervals),
        "stamp": stamp.finish(),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    if a.plot:
        plot(report, a.plot)
    write_report(a.out, report, a.plot, "attnserve serve vs Ray Serve's gRPC proxy")
    print(json.dumps(report["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
