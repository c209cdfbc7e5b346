"""The refusal ceiling: the front end's CPU time for each call it refuses with RESOURCE_EXHAUSTED,
and how many calls one core of it can refuse a second (1e6 / microseconds a refusal).

A server with one slot and a one-request queue, on an engine slowed to --step-ms a step (the
serve command's test-only step delay: the front end is what is measured); --callers stream the
longest generation the server allows in a closed loop on --connections channels: the two accepted
hold the slot and the queue for seconds, and nearly every other call is refused at once. Over --seconds, the server
process's CPU time (/proc/PID/stat: the front end; the engine core is a process of its own) is
divided by the calls it ended. With --tree-b, the same run against another checkout's server,
the two in turn for --rounds rounds: the ratio B/A of the cost a refusal, and its spread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from typing import Any

import grpc

from attnserve.report_stamp import Stamp, write_report
from attnserve.server.test_switches import TEST_STEP_DELAY_VARIABLE
from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc
from benchmarks.loadtest.server_process import ServerProcess, cpu_seconds

SERVE = ("--provider", "cpu", "--max-batch", "1", "--max-queue", "1", "--threads", "1")


async def knock(stub, stop: asyncio.Event, codes: Counter, max_new_tokens: int) -> None:
    """The longest generation, streamed as one message, in a closed loop: each call's status counted.
    The two accepted at a time hold the slot and the queue for seconds; the rest are refused."""
    request = pb.GenerateRequest(prompt="The ", max_new_tokens=max_new_tokens, ignore_eos=True)
    request.stream_interval_tokens = max_new_tokens
    while not stop.is_set():
        try:
            async for _ in stub.GenerateStream(request, timeout=60):
                pass
            codes["OK"] += 1
        except grpc.aio.AioRpcError as error:
            codes[error.code().name] += 1


async def measure(server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    channels = [grpc.aio.insecure_channel(server.target) for _ in range(args.connections)]
    stubs = [pb_grpc.TextGenerationStub(channel) for channel in channels]
    limits = (await stubs[0].GetModelInfo(pb.GetModelInfoRequest(), timeout=30)).limits
    stop, codes = asyncio.Event(), Counter[str]()
    knockers = [
        asyncio.create_task(knock(stubs[i % len(stubs)], stop, codes, limits.max_new_tokens - 8))
        for i in range(args.callers)
    ]
    await asyncio.sleep(args.warmup)
    before, cpu_before, start = Counter(codes), cpu_seconds(server.pid), time.perf_counter()
    await asyncio.sleep(args.seconds)
    after, cpu_after, elapsed = Counter(codes), cpu_seconds(server.pid), time.perf_counter() - start
    stop.set()
    await asyncio.gather(*knockers)
    for channel in channels:
        await channel.close()
    counted = after - before
    calls = sum(counted.values())
    cpu = cpu_after - cpu_before
    return {
        "calls": calls,
        "statuses": dict(counted),
        "calls_per_s": round(calls / elapsed, 1),
        "front_end_cpu_share": round(cpu / elapsed, 3),
        "us_per_call": round(1e6 * cpu / calls, 1) if calls else None,
        "calls_per_core_s": round(calls / cpu, 1) if cpu else None,
    }


def one_run(model: str, tree: str | None, args: argparse.Namespace) -> dict[str, Any]:
    env = {TEST_STEP_DELAY_VARIABLE: str(args.step_ms)}
    server = ServerProcess(model, *SERVE, *args.serve_arg, env=env, cwd=tree)
    try:
        return asyncio.run(measure(server, args))
    finally:
        server.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model directory `attnserve serve` starts on")
    parser.add_argument("--tree-a", default=None, help="the checkout whose server is A (default: this one)")
    parser.add_argument("--tree-b", default=None, help="a second checkout, B, run in turn with A")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of A then B (default 3)")
    parser.add_argument("--callers", type=int, default=64, help="closed-loop callers (default 64)")
    parser.add_argument("--connections", type=int, default=4, help="channels they share (default 4)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds a run (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring (default 1)")
    parser.add_argument("--step-ms", type=int, default=20, help="the engine's step delay in ms (default 20)")
    parser.add_argument("--serve-arg", action="append", default=[], help="one more `attnserve serve` argument")
    parser.add_argument("--out", default=None, help="write the JSON report here (and its Markdown beside)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stamp = Stamp.start(provider="cpu")
    sides = {"a": args.tree_a, **({"b": args.tree_b} if args.tree_b else {})}
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for round_ in range(args.rounds):
        for side, tree in sides.items():
            runs[side].append(one_run(args.model, tree, args))
            print(f"round {round_ + 1} {side}: {json.dumps(runs[side][-1])}", file=sys.stderr)
    report: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "runs": runs}
    costs = {side: [r["us_per_call"] for r in runs[side]] for side in sides}
    report["us_per_call_median"] = {side: statistics.median(c) for side, c in costs.items()}
    if "b" in sides:
        ratios = [b / a for a, b in zip(costs["a"], costs["b"])]
        report["cost_b_over_a"] = {
            "median": round(statistics.median(ratios), 3),
            "min": min(ratios),
            "max": max(ratios),
        }
    report["stamp"] = stamp.finish()
    if args.out:
        write_report(args.out, report, None, "The refusal ceiling: CPU time a refused call costs the front end")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
