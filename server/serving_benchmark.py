"""Serving benchmark: the two comparisons that say whether the server earns its keep, each
measured in one run over one model directory, reported as ratios.

  batched vs sequential      output tokens/s at concurrency C vs 1 (continuous batching; the
                             same greedy requests), for the engine alone and through gRPC
  gRPC vs in-process         time to first token and per-token latency of one streamed request
                             through `attnserve serve` (a subprocess, as deployed) on 127.0.0.1
                             vs the same request submitted to an engine in this process

Both sides run the same model with the same ONNX Runtime threads, and never at the same time.
Leaves out: sampling (greedy only), TLS and auth, open-loop arrivals (`attnserve bench --rate`
does those against any server). Torch-free. Warms up, then takes the median of --repeats;
prints a table, then one JSON object last.

    python -m attnserve.server.serving_benchmark --model models/small [--concurrency 1,4,16]
        [--new-tokens 96] [--repeats 3] [--out reports/serving.json] [--plot reports/serving.png]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc

from ..protos.attnserve.v1 import generation_pb2 as pb
from ..protos.attnserve.v1 import generation_pb2_grpc as pb_grpc
from .domain import Final, GenerationRequest
from .engine import Engine, EngineLimits
from .model_runner import ModelRunner
from .streaming import ByteTokenizer

PROMPTS = ["The server", "import os\nimport sys\n", "Return the value of", "class Engine:",
           "def main():\n    ", "A list is", "ONNX Runtime", "for i in range("]


def progress(message: str) -> None:
    print(f"[serving-benchmark] {message}", file=sys.stderr, flush=True)


def stream_stats(arrivals: list[float], start: float) -> dict[str, float]:
    """TTFT and mean inter-token gap (ms) of one request's token arrival times."""
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"ttft_ms": 1000 * (arrivals[0] - start), "per_token_ms": 1000 * statistics.fmean(gaps) if gaps else 0.0,
            "tokens": len(arrivals)}


async def grpc_stream(stub, prompt: str, new_tokens: int) -> dict[str, float]:
    """One greedy GenerateStream; a timestamp per token as its message arrives."""
    start, arrivals = time.perf_counter(), []
    async for message in stub.GenerateStream(pb.GenerateRequest(prompt=prompt, max_new_tokens=new_tokens),
                                             timeout=300):
        arrivals += [time.perf_counter()] * len(message.token_ids)
    return stream_stats(arrivals, start)


async def engine_stream(engine: Engine, prompt: str, new_tokens: int) -> dict[str, float]:
    """The same request handed to the engine directly: no protobuf, no socket."""
    request = GenerationRequest("bench", tuple(engine.tokenizer.encode(prompt)), new_tokens)
    start, arrivals = time.perf_counter(), []
    handle = engine.submit(request)
    while True:
        events = await handle.next_events()
        now = time.perf_counter()
        for event in events:
            if isinstance(event, Exception):
                raise event
            arrivals += [now] * len(getattr(event, "token_ids", ()))
        if isinstance(events[-1], Final):
            return stream_stats(arrivals, start)


async def throughput(stream, concurrency: int, requests: int, new_tokens: int) -> dict[str, float]:
    """Closed loop: `concurrency` streams in flight until `requests` are done; output tokens/s.
    `stream(prompt, new_tokens)` is grpc_stream or engine_stream with its first argument bound."""
    queue = list(range(requests))
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while queue:
            i = queue.pop()
            done = await stream(PROMPTS[i % len(PROMPTS)], new_tokens)
            tokens += done["tokens"]                  # after the await: no update is lost

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - start
    return {"concurrency": concurrency, "requests": requests, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds}


def median_of(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


async def sweep(stream, levels: list[int], new_tokens: int, repeats: int) -> list[dict]:
    """Throughput at every level (the run nearest the median of `repeats`), and its ratio to the first."""
    rows = []
    for c in levels:
        runs = [await throughput(stream, c, max(2 * c, len(PROMPTS)), new_tokens) for _ in range(repeats)]
        rows.append(min(runs, key=lambda r: abs(r["tokens_per_s"] - median_of(runs, "tokens_per_s"))))
    for row in rows:
        row["vs_first_level"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    return rows


async def measure(engine: Engine, target: str, levels: list[int], new_tokens: int, repeats: int) -> dict:
    """Warm up, then both comparisons; medians over `repeats`."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.TextGenerationStub(channel)
        sides = {"grpc": lambda prompt, n: grpc_stream(stub, prompt, n),
                 "in_process": lambda prompt, n: engine_stream(engine, prompt, n)}
        progress("warming up")
        for stream in sides.values():
            await throughput(stream, max(levels), max(levels), new_tokens)
        progress(f"single-stream latency, {repeats} x {len(PROMPTS)} requests each way")
        runs = {side: [] for side in sides}
        for _ in range(repeats):
            for prompt in PROMPTS:          # alternate, so that drift hits both sides alike
                for side, stream in sides.items():
                    runs[side].append(await stream(prompt, new_tokens))
        rows = {}
        for side in ("in_process", "grpc"):
            progress(f"throughput at concurrency {levels}, {side}")
            rows[side] = await sweep(sides[side], levels, new_tokens, repeats)
    latency = {side: {k: median_of(r, k) for k in ("ttft_ms", "per_token_ms")} for side, r in runs.items()}
    return {"latency": latency,
            "grpc_vs_in_process_per_token": latency["grpc"]["per_token_ms"] / latency["in_process"]["per_token_ms"],
            "throughput": rows}


def print_table(result: dict) -> None:
    lat = result["latency"]
    print(f"{'one stream':<14}{'TTFT ms':>10}{'per token ms':>14}")
    for side in ("in_process", "grpc"):
        print(f"{side:<14}{lat[side]['ttft_ms']:>10.3f}{lat[side]['per_token_ms']:>14.3f}")
    print(f"gRPC / in-process per token: {result['grpc_vs_in_process_per_token']:.3f}x\n")
    print(f"{'path':<12}{'concurrency':>12}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}{'vs first':>10}")
    for side, rows in result["throughput"].items():
        for row in rows:
            print(f"{side:<12}{row['concurrency']:>12}{row['tokens']:>8}{row['seconds']:>9.2f}"
                  f"{row['tokens_per_s']:>10.0f}{row['vs_first_level']:>9.1f}x")


def write_plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for side, rows in result["throughput"].items():
        left.plot([r["concurrency"] for r in rows], [r["tokens_per_s"] for r in rows], marker="o",
                  label=side.replace("_", "-"))
    left.set(xscale="log", xlabel="concurrent streams", ylabel="output tokens/s",
             title="continuous batching: throughput")
    left.legend()
    lat = result["latency"]
    right.bar(["in-process", "gRPC stream"], [lat["in_process"]["per_token_ms"], lat["grpc"]["per_token_ms"]])
    right.set(ylabel="ms per token", title="one stream: per-token latency")
    fig.suptitle(f"attnserve serving benchmark: {result['model']}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


class ServeProcess:
    """`attnserve serve` over the model on 127.0.0.1, any free port; stopped with SIGTERM."""

    def __init__(self, model: str, max_batch: int, threads: int):
        command = [sys.executable, "-m", "attnserve.cli", "serve", "--model", model, "--port", "0",
                   "--provider", "cpu", "--threads", str(threads), "--max-batch", str(max_batch),
                   "--max-queue", str(4 * max_batch)]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in self.proc.stdout:
            match = re.search(r"listening on (\S+:\d+)", line)
            if match:
                self.target = match.group(1)
                return
        raise RuntimeError(f"attnserve serve exited with {self.proc.wait()} before listening")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def run(model: str, levels: list[int], new_tokens: int, repeats: int, threads: int = 0) -> dict:
    """Start the server subprocess and an in-process engine over `model`, measure, stop both."""
    progress(f"starting attnserve serve --model {model}")
    server = ServeProcess(model, max(levels), threads)
    runner = ModelRunner(model, "cpu", threads)
    engine = Engine(runner, ByteTokenizer.from_manifest(runner.manifest), EngineLimits(max(levels), 4 * max(levels)))
    engine.start()
    try:
        result = await measure(engine, server.target, levels, new_tokens, repeats)
    finally:
        engine.stop()
        server.stop()
    return {"model": Path(model).resolve().name, "new_tokens": new_tokens, "repeats": repeats,
            "threads": threads, **result}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated levels; the first is the baseline")
    p.add_argument("--new-tokens", type=int, default=96, help="greedy tokens per request (prompts are <= 22 tokens)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: one per core)")
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--plot", help="write a PNG here")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    try:
        result = asyncio.run(run(args.model, levels, args.new_tokens, args.repeats, args.threads))
    except grpc.aio.AioRpcError as e:
        sys.exit(f"serving benchmark: {e.code().name}: {e.details()}")
    except RuntimeError as e:
        sys.exit(f"serving benchmark: {e}")
    print_table(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        write_plot(result, args.plot)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
