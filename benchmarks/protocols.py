"""What each front door costs: the same greedy requests streamed through attnserve.v1's GenerateStream
(gRPC) and through the OpenAI-compatible /v1/completions (HTTP, server-sent events), one server, one
run, reported as ratios (issue 26).

One Server (server/app.py, ports 0, `--http-port 0`, the engine core in a process of its own as
`attnserve serve` runs it) serves both sides; this process is also the clients (grpc.aio, and
httpx2, the HTTP library of OpenAI's Python client), so each side pays its own client's parsing on
the front end's event loop too. At each level, `concurrency` streams stay in flight until
2 x concurrency requests (PROMPTS in turn, --new-tokens each, greedy) are done: output tokens/s, and
per request its time to first token and its per-token latency (from its first token to its last,
over its tokens). The sides alternate within each round; medians over --repeats with min and max;
load average before and after. Prints a table, then one JSON object last. Torch-free.

    python -m benchmarks.protocols --model models/small [--concurrency 1,16] [--new-tokens 64]
        [--repeats 5] [--out F.json] [--plot F.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import grpc
import httpx2

from attnserve.report_stamp import Stamp
from attnserve.server.app import Server
from attnserve.server.config import ServerConfig
from attnserve.v1 import generation_pb2_grpc as pb_grpc
from benchmarks.serving import (
    CALL_TIMEOUT_S,
    alternating,
    closed_loop,
    grpc_stream,
    progress,
    report,
    spread,
)

SIDES = ("grpc", "http")
TITLE = "gRPC streams vs OpenAI HTTP server-sent events, one server"


async def http_stream(client: httpx2.AsyncClient, model: str, prompt: str, new_tokens: int) -> dict[str, float]:
    """One greedy streamed completion; each event with text is stamped as it arrives, the token count
    is the usage the last event gives."""
    body = {"model": model, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    start, tokens = time.perf_counter(), 0
    arrivals: list[float] = []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if chunk["choices"] and (chunk["choices"][0]["text"] or not arrivals):
                arrivals.append(time.perf_counter())  # the first event in any case (EOS first: no text)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    per_token = (arrivals[-1] - arrivals[0]) / (tokens - 1) if tokens > 1 else 0.0
    return {"ttft_ms": 1000 * (arrivals[0] - start), "per_token_ms": 1000 * per_token, "tokens": tokens}


async def one_level(side_streams: dict[str, Any], level: int, new_tokens: int, repeats: int) -> dict[str, Any]:
    """Both sides at `level` streams in flight, alternating: tokens/s and per-request latencies."""
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for side in SIDES:  # warm-up: connections, caches
        await closed_loop(side_streams[side], level, level, new_tokens)
    for side in alternating(SIDES, repeats, f"{level} streams"):
        stats: list[dict] = []

        async def stream(prompt: str, tokens: int, side: str = side, stats: list = stats) -> dict:
            done = await side_streams[side](prompt, tokens)
            stats.append(done)
            return done

        run = await closed_loop(stream, level, 2 * level, new_tokens)
        run["ttft_ms"] = statistics.median(s["ttft_ms"] for s in stats)
        run["per_token_ms"] = statistics.median(s["per_token_ms"] for s in stats)
        runs[side].append(run)
    row: dict[str, Any] = {"concurrency": level}
    for side in SIDES:
        row[side] = {
            key: statistics.median(r[key] for r in runs[side]) for key in ("tokens_per_s", "ttft_ms", "per_token_ms")
        }
        row[side]["tokens"] = sorted({r["tokens"] for r in runs[side]})
    row["http_vs_grpc_tokens_per_s"] = ratios(runs, "tokens_per_s")
    row["http_vs_grpc_per_token_ms"] = ratios(runs, "per_token_ms")
    return row


def ratios(runs: dict[str, list[dict]], key: str) -> dict[str, float] | None:
    """HTTP's `key` over gRPC's, round by round, with their spread; None where no round has a gRPC value
    above 0 (a busy machine can deliver a short request's tokens in one message: no gap between them)."""
    values = [h[key] / g[key] for h, g in zip(runs["http"], runs["grpc"]) if g[key] > 0]
    return spread(values) if values else None


async def measure(model: str, levels: list[int], new_tokens: int, repeats: int) -> list[dict]:
    config = ServerConfig(model=model, port=0, http_port=0, max_batch=max(levels), max_queue=4 * max(levels))
    server = Server(config)
    try:
        await server.start()
        assert server.http is not None
        name = server.info.model_name
        limits = httpx2.Limits(max_connections=max(levels) * 2)
        base = f"http://127.0.0.1:{server.http.port}"
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
            httpx2.AsyncClient(base_url=base, timeout=CALL_TIMEOUT_S, limits=limits) as client,
        ):
            stub = pb_grpc.TextGenerationStub(channel)
            streams = {
                "grpc": lambda prompt, tokens: grpc_stream(stub, prompt, tokens),
                "http": lambda prompt, tokens: http_stream(client, name, prompt, tokens),
            }
            return [await one_level(streams, level, new_tokens, repeats) for level in levels]
    finally:
        await server.stop()


def print_table(result: dict) -> None:
    print(f"{'streams':>8} {'side':>5} {'tok/s':>8} {'TTFT ms':>8} {'per token ms':>13}")
    for row in result["rows"]:
        for side in SIDES:
            s = row[side]
            print(
                f"{row['concurrency']:>8} {side:>5} {s['tokens_per_s']:>8,.0f} {s['ttft_ms']:>8.2f}"
                f" {s['per_token_ms']:>13.3f}"
            )
        shown = [
            f"{name} {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})" if r else f"{name} n/a"
            for name, r in (
                ("tokens/s", row["http_vs_grpc_tokens_per_s"]),
                ("per-token latency", row["http_vs_grpc_per_token_ms"]),
            )
        ]
        print(f"{'':>8} HTTP/gRPC: {', '.join(shown)}")


def write_plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.5))
    labels = [f"{row['concurrency']} stream" + "s" * (row["concurrency"] > 1) for row in result["rows"]]
    for i, side in enumerate(SIDES):
        xs = [j + (i - 0.5) * 0.35 for j in range(len(labels))]
        left.bar(xs, [row[side]["tokens_per_s"] for row in result["rows"]], 0.35, label=side)
        right.bar(xs, [row[side]["per_token_ms"] for row in result["rows"]], 0.35, label=side)
    for ax, title in ((left, "output tokens/s"), (right, "per-token latency (ms)")):
        ax.set_xticks(range(len(labels)), labels)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle("gRPC streams vs OpenAI HTTP server-sent events, one server")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument("--concurrency", default="1,16", help="comma-separated streams in flight")
    p.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per request")
    p.add_argument("--repeats", type=int, default=5, help="rounds, sides alternating; medians reported")
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--plot", help="write a PNG here")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    stamp = Stamp.start(provider="cpu")
    progress(f"serving {args.model}")
    rows = asyncio.run(measure(args.model, levels, args.new_tokens, args.repeats))
    result = {
        "model": args.model,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "rows": rows,
    }
    report(result, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
