"""`make soak`: many streams for a long time, with misbehaving clients, against a real server.

The driver starts `attnserve serve` (server_process.py) and worker processes (soak_worker.py)
holding --streams streams in all. Each stream sends requests back to back, each with a behavior
drawn by weight: streams read to the end, unary calls, streams cancelled at a random point,
deadlines likely to pass, bytes that are not a request, fields beyond their limits. Every
--kill-every seconds one worker is SIGKILLed mid-stream and replaced. Meanwhile the server's RSS
is sampled every second and its /metrics every two.

It passes when: no request ended with a status outside its behavior's set (client side) and the
server counted no INTERNAL or UNKNOWN; after the load, nothing is left in flight, in the batch or
in the queue; the server's RSS grew by at most --rss-growth-limit-mb from the end of the warm-up
(the first --warmup-fraction of the run; medians of up to 10 samples on each side) to the end; and the
server drained and exited 0. It proves it can fail: --test-leak-bytes starts the server with a
test-only leak passed in (attnserve/server/test_switches.py's LeakInterceptor), and the RSS verdict
catches it. A failed run's report carries the server's last 60 log lines (server_log_tail). The
JSON report is the last line on stdout (in --out with its Markdown report); exit code 0 on pass, 1 on fail.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import threading
import time
from array import array
from typing import Any

from attnserve.report_stamp import Stamp, write_report
from benchmarks.loadtest.server_process import ServerProcess, by_label
from benchmarks.loadtest.soak_report import summarize, write_plot


class Workers:
    """The client processes, their records, and the kills."""

    def __init__(self, args: argparse.Namespace, target: str, until: float):
        self.args, self.target, self.until = args, target, until
        self.records: list[dict[str, Any]] = []
        self.gaps = array("d")
        self.procs: list[subprocess.Popen] = []
        self.kills = 0
        self.started = 0
        self.lock = threading.Lock()

    def spawn(self, streams: int) -> subprocess.Popen:
        command = [sys.executable, "-m", "benchmarks.loadtest.soak_worker", "--target", self.target]
        command += ["--streams", str(streams), "--seed", str(self.args.seed * 100 + self.started)]
        command += ["--max-new-tokens", str(self.args.max_new_tokens), "--until", str(self.until)]
        self.started += 1
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        return proc

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            record = json.loads(line)
            gaps = record.pop("gaps")
            with self.lock:
                self.records.append(record)
                if record["behavior"] == "complete" and record["code"] == "OK":
                    self.gaps.extend(gaps)  # inter-token gaps of streams read to their end

    def start(self) -> None:
        """The workers, the streams shared out among them."""
        n, workers = self.args.streams, self.args.workers
        self.shares = [n // workers + (i < n % workers) for i in range(workers)]
        self.procs = [self.spawn(streams) for streams in self.shares]

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL one worker mid-stream and start a replacement with its streams."""
        i = rng.randrange(len(self.procs))
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()
        self.kills += 1
        self.procs[i] = self.spawn(self.shares[i])

    def wait(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()


def sample(server: ServerProcess, t0: float, rss: list, gauges: list, stop: threading.Event) -> None:
    """RSS every second, the in-flight, batch and queue gauges every two, until `stop`."""
    tick = 0
    while not stop.wait(1.0):
        t = round(time.monotonic() - t0, 2)
        rss.append((t, server.rss_bytes()))
        tick += 1
        if tick % 2 == 0:
            gauges.append((t, *in_flight(server)))


def in_flight(server: ServerProcess) -> tuple[float, float, float]:
    """Calls in flight, requests in the batch and in the queue, now."""
    m = server.metrics()
    return m["attnserve_requests_in_flight"], m["attnserve_batch_size"], m["attnserve_queue_depth"]


def settle(server: ServerProcess, timeout: float = 30.0) -> tuple[float, float, float]:
    """Wait for the server to be idle after the load; what was left at the end."""
    end = time.monotonic() + timeout
    while (left := in_flight(server)) != (0.0, 0.0, 0.0) and time.monotonic() < end:
        time.sleep(0.2)
    return left


def server_entry(leak_bytes: int) -> tuple[str, ...]:
    """`attnserve serve`, or with --test-leak-bytes the same server with a LeakInterceptor passed in."""
    if not leak_bytes:
        return ("attnserve.cli", "serve")
    return ("attnserve.server.test_switches", "--leak-bytes", str(leak_bytes))


def run(args: argparse.Namespace) -> dict[str, Any]:
    serve_args = ["--provider", "cpu", "--max-batch", str(args.max_batch), "--max-queue", str(4 * args.streams)]
    server = ServerProcess(args.model, *serve_args, *args.serve_arg, entry=server_entry(args.test_leak_bytes))
    rss: list[tuple[float, int]] = []
    gauges: list[tuple[float, float, float, float]] = []
    stop = threading.Event()
    rng = random.Random(args.seed)
    try:
        t0 = time.monotonic()
        workers = Workers(args, server.target, time.time() + args.duration)
        sampler = threading.Thread(target=sample, args=(server, t0, rss, gauges, stop), daemon=True)
        sampler.start()
        workers.start()
        next_kill = args.kill_every
        while (elapsed := time.monotonic() - t0) < args.duration:
            time.sleep(min(1.0, args.duration - elapsed))
            if args.kill_every and time.monotonic() - t0 >= next_kill and time.monotonic() - t0 < args.duration - 1:
                workers.kill_one(rng)
                next_kill += args.kill_every
        workers.wait(timeout=150.0)
        left = settle(server)
        stop.set()
        sampler.join()
        rss.append((round(time.monotonic() - t0, 2), server.rss_bytes()))
        server_codes = by_label(server.metrics(), "attnserve_requests_total", "code")
    finally:
        stop.set()
        exit_code = server.stop()
    report = summarize(args, workers, rss, gauges, left, server_codes, exit_code)
    if not report["passed"]:
        report["server_log_tail"] = server.lines[-60:]  # what the server said, for a failure's cause
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model directory to serve, e.g. models/small")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams in all (default 64)")
    parser.add_argument("--workers", type=int, default=4, help="client processes sharing the streams (default 4)")
    parser.add_argument("--kill-every", type=float, default=30.0, help="seconds between worker SIGKILLs; 0: none")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="most tokens per request (8 to this)")
    parser.add_argument("--max-batch", type=int, default=16, help="the server's --max-batch (default 16)")
    parser.add_argument("--warmup-fraction", type=float, default=0.2, help="share of the run that is warm-up")
    parser.add_argument("--rss-growth-limit-mb", type=float, default=20.0, help="RSS growth allowed after warm-up")
    parser.add_argument("--test-leak-bytes", type=int, default=0, help="negative control: the server leaks N per call")
    parser.add_argument("--serve-arg", action="append", default=[], help="one more `attnserve serve` argument")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the JSON report here")
    parser.add_argument("--plot", default=None, help="write RSS, in-flight and latency over time to this PNG")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stamp = Stamp.start(provider="cpu")
    report = {**run(args), "stamp": stamp.finish()}
    if args.plot:
        write_plot(report, args.plot)
    if args.out:
        write_report(args.out, report, args.plot, "Soak: misbehaving streams for a long time")
    print(json.dumps(report["verdicts"], indent=1), file=sys.stderr)
    print(json.dumps(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
