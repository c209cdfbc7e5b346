"""Overload: open-loop arrivals at several times the server's capacity, against a real server.

First the capacity: --max-batch streams back to back (closed loop) for --capacity-seconds, in
requests per second. Then Poisson arrivals at --factor times that (or at --rate calls a second) for
--duration seconds, each a stream of --max-new-tokens tokens, while grpc.health.v1 Check is called
every 100 ms on a connection of its own and /metrics is read every 250 ms. What must hold: the
queue never holds more than --max-queue requests; requests beyond it are refused with
RESOURCE_EXHAUSTED at once; health answers SERVING throughout; and accepted requests get their
first token within a bound set by the queue ahead of them: (max_queue / max_batch + 1) times the
99th percentile of the time an accepted request takes from its first token to its end (its turn
in a slot, under this load).
The report is JSON (last line on stdout; in --out with its Markdown report) and a PNG; exit code 1
if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from typing import Any

import grpc

from attnserve.clients import AsyncClient
from attnserve.clients.bench_report import distribution_ms, percentile
from attnserve.clients.errors import AttnserveError
from attnserve.health.v1 import health_pb2, health_pb2_grpc
from attnserve.report_stamp import Stamp, write_report
from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc
from benchmarks.loadtest.overload_report import write_plot
from benchmarks.loadtest.server_process import ServerProcess, by_label

EXPECTED = ("OK", "RESOURCE_EXHAUSTED")
TIMEOUT = 120.0
PROMPT = "The "


async def request(stub, max_new_tokens: int, interval: int) -> dict[str, Any]:
    """One stream: when it was refused or got its first token, and how it ended."""
    start = time.perf_counter()
    record: dict[str, Any] = {"start": start, "code": "OK", "ttft": None, "refused_after": None}
    message = pb.GenerateRequest(prompt=PROMPT, max_new_tokens=max_new_tokens, stream_interval_tokens=interval)
    try:
        async for reply in stub.GenerateStream(message, timeout=TIMEOUT):
            if record["ttft"] is None and reply.token_ids:
                record["ttft"] = time.perf_counter() - start
    except grpc.aio.AioRpcError as error:
        record["code"] = error.code().name
        if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            record["refused_after"] = time.perf_counter() - start
        else:
            record["details"] = error.details()
    record["end"] = time.perf_counter()
    return record


async def client_request(client, max_new_tokens: int, interval: int) -> dict[str, Any]:
    """One stream through attnserve's own AsyncClient (its retry policy and throttling on)."""
    start = time.perf_counter()
    record: dict[str, Any] = {"start": start, "code": "OK", "ttft": None, "refused_after": None}
    try:
        async for delta in client.stream(PROMPT, max_new_tokens=max_new_tokens, stream_interval_tokens=interval):
            if record["ttft"] is None and delta.token_ids:
                record["ttft"] = time.perf_counter() - start
    except AttnserveError as error:
        record["code"] = error.status
        if error.status == "RESOURCE_EXHAUSTED":
            record["refused_after"] = time.perf_counter() - start
        else:
            record["details"] = error.details
    record["end"] = time.perf_counter()
    return record


def calls_seen(server: ServerProcess | None) -> float | None:
    """GenerateStream calls the server's handlers have seen, every status (retries included; streams
    gRPC core refused before a handler ran are not among them)."""
    if server is None:
        return None
    return by_label(server.metrics(), "attnserve_requests_total", "method").get("GenerateStream", 0.0)


async def capacity(stub, streams: int, seconds: float, max_new_tokens: int, interval: int) -> dict[str, float]:
    """Closed loop at `streams` concurrency: completed requests per second and their mean time."""
    until = time.perf_counter() + seconds
    done: list[dict[str, Any]] = []

    async def loop() -> None:
        while time.perf_counter() < until:
            done.append(await request(stub, max_new_tokens, interval))

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(streams)))
    elapsed = time.perf_counter() - start
    ok = [r for r in done if r["code"] == "OK"]
    return {
        "requests_per_s": len(ok) / elapsed,
        "request_s": sum(r["end"] - r["start"] for r in ok) / len(ok),
        "requests": len(ok),
    }


async def watch_health(channel, stop: asyncio.Event, samples: list) -> None:
    """grpc.health.v1 Check every 100 ms: (time, latency, status or error code)."""
    stub = health_pb2_grpc.HealthStub(channel)
    while not stop.is_set():
        start = time.perf_counter()
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5.0)
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.aio.AioRpcError as error:
            status = error.code().name
        samples.append((start, time.perf_counter() - start, status))
        await asyncio.sleep(0.1)


async def watch_queue(server: ServerProcess | None, stop: asyncio.Event, samples: list) -> None:
    """The queue depth gauge every 250 ms (read in a thread: urllib blocks)."""
    while server is not None and not stop.is_set():
        metrics = await asyncio.to_thread(server.metrics)
        samples.append((time.perf_counter(), metrics["attnserve_queue_depth"]))
        await asyncio.sleep(0.25)


async def open_loop(send, rate: float, seconds: float, max_new_tokens: int, interval: int, seed: int) -> list:
    """Poisson arrivals at `rate` per second for `seconds`, each `send(max_new_tokens, interval)`;
    every request's record."""
    rng = random.Random(seed)
    tasks = []
    start = time.perf_counter()
    at = start
    while at < start + seconds:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        tasks.append(asyncio.create_task(send(max_new_tokens, interval)))
        at += rng.expovariate(rate)
    return await asyncio.gather(*tasks)


async def measure(args: argparse.Namespace, target: str, server: ServerProcess | None) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(target) as channel, grpc.aio.insecure_channel(target) as probe:
        stub = pb_grpc.TextGenerationStub(channel)
        limits = (await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)).limits
        cap = await capacity(stub, limits.max_batch_size, args.capacity_seconds, args.max_new_tokens, args.interval)
        rate = args.rate or args.factor * cap["requests_per_s"]
        stop = asyncio.Event()
        health: list = []
        queue: list = []
        watchers = [
            asyncio.create_task(watch_health(probe, stop, health)),
            asyncio.create_task(watch_queue(server, stop, queue)),
        ]
        seen_before = await asyncio.to_thread(calls_seen, server)
        t0 = time.perf_counter()
        if args.client == "attnserve":
            async with AsyncClient(target, timeout=TIMEOUT) as client:
                send = lambda tokens, interval: client_request(client, tokens, interval)
                records = await open_loop(send, rate, args.duration, args.max_new_tokens, args.interval, args.seed)
        else:
            send = lambda tokens, interval: request(stub, tokens, interval)
            records = await open_loop(send, rate, args.duration, args.max_new_tokens, args.interval, args.seed)
        stop.set()
        await asyncio.gather(*watchers)
        seen_after = await asyncio.to_thread(calls_seen, server)
    report = summarize(args, limits, cap, rate, records, health, queue, t0)
    if seen_before is not None and seen_after is not None:
        report["calls_seen_per_call"] = round((seen_after - seen_before) / len(records), 3)
    return report


def summarize(args, limits, cap, rate, records, health, queue, t0) -> dict[str, Any]:
    accepted = [r for r in records if r["code"] == "OK"]
    refused = [r for r in records if r["code"] == "RESOURCE_EXHAUSTED"]
    span = max(r["start"] for r in records) - min(r["start"] for r in records)
    # A request accepted behind a full queue waits while the max_queue requests ahead of it take their
    # turns in max_batch slots, each turn one request's decode time under this very load (first token
    # to end; its 99th percentile here), and then for its own prefill (one more turn, generously).
    decode_s = [r["end"] - r["start"] - r["ttft"] for r in accepted if r["ttft"] is not None]
    turn_s = percentile(decode_s, 99) if decode_s else 0.0
    bound_s = (limits.max_queue_size / limits.max_batch_size + 1) * turn_s
    ttft = [r["ttft"] for r in accepted if r["ttft"] is not None]
    health_failures = [h for h in health if h[2] != "SERVING"]
    max_queue_seen = max((q for _, q in queue), default=None)
    checks = {
        "no_unexpected_statuses": all(r["code"] in EXPECTED for r in records),
        "refusals_happened": bool(refused),
        "queue_bound_held": max_queue_seen is None or max_queue_seen <= limits.max_queue_size,
        "health_always_serving": bool(health) and not health_failures,
        "accepted_ttft_p99_within_bound": bool(ttft) and percentile(ttft, 99) <= bound_s,
    }
    return {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "plot")},
        "max_batch": limits.max_batch_size,
        "max_queue": limits.max_queue_size,
        "capacity_requests_per_s": round(cap["requests_per_s"], 2),
        "request_s_at_capacity": round(cap["request_s"], 4),
        "offered_rate": round(rate, 2),
        "achieved_rate": round((len(records) - 1) / span, 2) if span > 0 else None,
        "requests": len(records),
        "accepted": len(accepted),
        "refused": len(refused),
        "statuses": dict(Counter(r["code"] for r in records)),
        "unexpected_examples": [r for r in records if r["code"] not in EXPECTED][:5],
        "refusal_ms": distribution_ms([r["refused_after"] for r in refused]),
        "accepted_ttft_ms": distribution_ms(ttft),
        "accepted_decode_ms": distribution_ms(decode_s),
        "ttft_bound_ms": round(1000 * bound_s, 1),
        "health_ms": distribution_ms([h[1] for h in health]),
        "health_checks": len(health),
        "health_failures": Counter(h[2] for h in health_failures),
        "max_queue_depth_seen": max_queue_seen,
        "timeline": [(round(r["start"] - t0, 3), r["code"], r["ttft"]) for r in records],
        "health_timeline": [(round(t - t0, 3), latency) for t, latency, _ in health],
        "checks": checks,
        "passed": all(checks.values()),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model", help="start `attnserve serve` on this model directory")
    where.add_argument("--target", help="or load a running server at HOST:PORT (no queue gauge then)")
    parser.add_argument("--factor", type=float, default=4.0, help="offered load, times capacity (default 4)")
    parser.add_argument("--rate", type=float, default=None, help="offered load in calls/s (instead of --factor)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of open-loop arrivals (default 30)")
    parser.add_argument("--capacity-seconds", type=float, default=10.0, help="seconds of the capacity run")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per request (default 64)")
    parser.add_argument("--interval", type=int, default=8, help="stream interval in tokens (default 8)")
    parser.add_argument("--serve-arg", action="append", default=[], help="one more `attnserve serve` argument")
    parser.add_argument(
        "--client",
        choices=("grpc", "attnserve"),
        default="grpc",
        help="grpc: a plain grpc.aio channel, default options (default); attnserve: attnserve's AsyncClient, "
        "its retries and their throttling on",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the JSON report here")
    parser.add_argument("--plot", default=None, help="write arrivals, TTFT and health latency to this PNG")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stamp = Stamp.start(provider="cpu" if args.model else None)
    server = ServerProcess(args.model, "--provider", "cpu", *args.serve_arg) if args.model else None
    try:
        report = asyncio.run(measure(args, server.target if server else args.target, server))
    finally:
        if server is not None:
            server.stop()
    report["stamp"] = stamp.finish()
    if args.plot:
        write_plot(report, args.plot)
    if args.out:
        write_report(args.out, report, args.plot, "Overload: open-loop arrivals above capacity")
    shown = (
        "capacity_requests_per_s",
        "offered_rate",
        "achieved_rate",
        "accepted",
        "refused",
        "refusal_ms",
        "statuses",
    )
    print(json.dumps({k: report[k] for k in (*shown, "accepted_ttft_ms", "checks")}, indent=1), file=sys.stderr)
    print(json.dumps(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
