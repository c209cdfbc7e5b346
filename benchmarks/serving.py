"""Serving benchmark: the two comparisons that say whether the server earns its keep, each
measured in one run over one model directory and reported as ratios.

  batched vs sequential   output tokens/s of the engine with C greedy requests in flight vs 1
                          (continuous batching; the same requests at every level)
  gRPC vs in-process      time to first token, per-token latency and the whole stream's time of
                          one greedy request streamed through GenerateStream on a real grpc.aio
                          server on 127.0.0.1, vs the same request submitted to that server's
                          engine directly

One Server (server/app.py, port 0) runs in this process; both sides of each comparison use its
engine and ONNX Runtime session, one after the other, so the gRPC figure is the cost of the
gRPC layer alone: validation, protobuf, the servicer, HTTP/2 over loopback and the client's
own decoding (the client shares this process's event loop and GIL with the server).
Leaves out: sampling (greedy only), TLS and auth, throughput through gRPC under load and
open-loop arrivals (`attnserve bench` drives any running server for those). Torch-free.
Warms up, then takes medians over --repeats; prints a table, then one JSON object last.

    python -m benchmarks.serving --model models/small [--concurrency 1,16]
        [--new-tokens 96] [--repeats 3] [--out reports/serving.json] [--plot reports/serving.png]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc

from attnserve.engine.domain import Final, GenerationRequest
from attnserve.engine.engine import EngineCalls
from attnserve.report_stamp import Stamp, write_report
from attnserve.runtime.contract import ModelDirError
from attnserve.runtime.model_sessions import ProviderError
from attnserve.server.app import Server, StartupError
from attnserve.server.config import ServerConfig
from attnserve.tokenizer import Tokenizer
from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc

# Prompts of 10 to 22 tokens (BOS included): a batch's prefill pads them to one length.
PROMPTS = [
    "The server",
    "import os\nimport sys\n",
    "Return the value of",
    "class Engine:",
    "def main():\n    ",
    "A list is",
    "ONNX Runtime",
    "for i in range(",
]
TITLE = "Serving: batched vs sequential, gRPC vs in-process"
GOALS = {"batched_vs_sequential_min": 4.0, "grpc_vs_in_process_per_token_max": 1.10}
CALL_TIMEOUT_S = 300.0
Stream = Callable[[str, int], Awaitable[dict]]  # (prompt, new tokens) -> stream_stats of one request


def progress(message: str) -> None:
    print(f"[serving-benchmark] {message}", file=sys.stderr, flush=True)


def stream_stats(arrivals: list[float], start: float) -> dict:
    """TTFT, per-token latency (ms; mean gap from the first token to the last) and the whole stream's
    time (from the call to its last token) of one request. On a busy machine a reader that falls
    behind gets many tokens in one message or event: its gaps shrink towards 0 while its first token
    comes late, so only the whole stream's time compares two sides whichever of them lagged."""
    per_token = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1) if len(arrivals) > 1 else 0.0
    return {
        "ttft_ms": 1000 * (arrivals[0] - start),
        "per_token_ms": 1000 * per_token,
        "total_ms": 1000 * (arrivals[-1] - start),
        "tokens": len(arrivals),
        "gaps_ms": [1000 * (b - a) for a, b in itertools.pairwise(arrivals)],  # before each token after the first
    }


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p90 and p99 (nearest rank) of `values` (None for none): a run's TTFT or inter-token latency."""
    ranked = sorted(values)
    return {f"p{q}": ranked[min(len(ranked) - 1, len(ranked) * q // 100)] if ranked else None for q in (50, 90, 99)}


async def grpc_stream(
    stub: pb_grpc.TextGenerationStub, prompt: str, new_tokens: int, ignore_eos: bool = False, **fields
) -> dict:
    """One GenerateStream, greedy unless `fields` (GenerateRequest's: temperature, top_p, logprobs ...) say
    otherwise; every token is stamped when its message arrives."""
    start, arrivals = time.perf_counter(), []
    request = pb.GenerateRequest(prompt=prompt, max_new_tokens=new_tokens, ignore_eos=ignore_eos, **fields)
    async for message in stub.GenerateStream(request, timeout=CALL_TIMEOUT_S):
        arrivals += [time.perf_counter()] * len(message.token_ids)
    return stream_stats(arrivals, start)


async def engine_stream(engine: EngineCalls, tokenizer: Tokenizer, prompt: str, new_tokens: int) -> dict[str, float]:
    """The same request handed to the engine directly: no protobuf, no socket, no servicer."""
    request = GenerationRequest("bench", tuple(tokenizer.encode_prompt(prompt)), new_tokens)
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


async def closed_loop(stream: Stream, concurrency: int, requests: int, new_tokens: int) -> dict:
    """`concurrency` requests in flight until `requests` (PROMPTS in turn) are done; output tokens/s, and
    the percentiles of time to first token and of the gaps between tokens (where the stream stamps them)."""
    todo, tokens, ttft, gaps = list(range(requests)), 0, [], []

    async def worker() -> None:
        nonlocal tokens
        while todo:
            i = todo.pop(0)
            done = await stream(PROMPTS[i % len(PROMPTS)], new_tokens)
            tokens += done["tokens"]  # not `tokens += await ...`: that reads tokens before the await
            ttft.append(done["ttft_ms"])
            gaps.extend(done.get("gaps_ms", ()))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - start
    return {
        "concurrency": concurrency,
        "requests": requests,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "ttft_ms": percentiles(ttft),
        "itl_ms": percentiles(gaps),
    }


def median_run(runs: list[dict]) -> dict:
    """The run whose tokens/s is the median (the lower middle one of an even count)."""
    ranked = sorted(runs, key=lambda r: r["tokens_per_s"])
    return ranked[(len(ranked) - 1) // 2]


async def throughput(stream: Stream, levels: list[int], new_tokens: int, repeats: int) -> list[dict]:
    """Median tokens/s at every level over `repeats` rounds (levels interleaved, so drift hits all alike)."""
    requests = max(2 * max(levels), len(PROMPTS))
    runs: dict[int, list[dict]] = {c: [] for c in levels}
    for r in range(repeats):
        for c in levels:
            progress(f"throughput round {r + 1}/{repeats}: {requests} requests, {c} in flight")
            runs[c].append(await closed_loop(stream, c, requests, new_tokens))
    rows = [median_run(runs[c]) for c in levels]
    for row in rows:
        row["vs_sequential"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    return rows


async def latency(sides: dict[str, Stream], new_tokens: int, repeats: int) -> dict[str, dict[str, float]]:
    """Median TTFT and per-token latency of single streams, the two sides alternating request by request."""
    progress(f"single-stream latency: {repeats} x {len(PROMPTS)} requests each way")
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for _ in range(repeats):
        for prompt in PROMPTS:
            for side, stream in sides.items():
                runs[side].append(await stream(prompt, new_tokens))
    return {
        side: {k: statistics.median(run[k] for run in r) for k in ("ttft_ms", "per_token_ms", "total_ms")}
        for side, r in runs.items()
    }


async def round_trip_ms(stub: pb_grpc.TextGenerationStub, calls: int = 20) -> float:
    """Median GetModelInfo round trip: gRPC's fixed cost per call, no engine involved."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=CALL_TIMEOUT_S)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


async def measure(server: Server, levels: list[int], new_tokens: int, repeats: int) -> dict:
    """Warm up both paths, then the latency comparison, then the throughput sweep on the engine."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.TextGenerationStub(channel)
        sides: dict[str, Stream] = {
            "in_process": lambda p, n: engine_stream(server.engine, server.tokenizer, p, n),
            "grpc": lambda p, n: grpc_stream(stub, p, n),
        }
        progress("warming up")
        for stream in sides.values():
            await closed_loop(stream, max(levels), max(levels), new_tokens)
        lat = await latency(sides, new_tokens, repeats)
        lat["grpc"]["unary_round_trip_ms"] = await round_trip_ms(stub)
        rows = await throughput(sides["in_process"], levels, new_tokens, repeats)
    return {
        "latency": lat,
        "throughput": rows,
        "batched_vs_sequential": rows[-1]["vs_sequential"],
        "grpc_vs_in_process_per_token": lat["grpc"]["per_token_ms"] / lat["in_process"]["per_token_ms"],
        "grpc_vs_in_process_ttft": lat["grpc"]["ttft_ms"] / lat["in_process"]["ttft_ms"],
        "grpc_vs_in_process_total": lat["grpc"]["total_ms"] / lat["in_process"]["total_ms"],
    }


def check_fits(server: Server, new_tokens: int) -> None:
    """Every prompt plus `new_tokens` must fit in the model's context (the server would refuse it)."""
    longest = max(len(server.tokenizer.encode_prompt(p)) for p in PROMPTS)
    room = min(server.info.context_length - longest, server.limits.max_new_tokens)
    if not 1 <= new_tokens <= room:
        raise ValueError(
            f"--new-tokens {new_tokens}: prompts of up to {longest} tokens leave room for 1 to "
            f"{room} (context_length {server.info.context_length})"
        )


async def run(
    model: str,
    levels: list[int],
    new_tokens: int = 96,
    repeats: int = 3,
    threads: int = 0,
    provider: str = "cpu",
    engine_core: str = "thread",
) -> dict:
    """Start a Server over `model` on 127.0.0.1 (any free port), measure both comparisons, stop it.
    `engine_core`: thread (the engine in this process, as the README's figures were measured), or
    process (its own; "in-process" then means EngineClient, without gRPC)."""
    progress(f"loading {model}")
    config = ServerConfig(
        model=model,
        port=0,
        provider=provider,
        threads=threads,
        max_batch=max(levels),
        max_queue=4 * max(levels),
        engine_core=engine_core,
    )
    server = Server(config)
    try:
        check_fits(server, new_tokens)
        await server.start()
        result = await measure(server, levels, new_tokens, repeats)
    finally:
        await server.stop()
    return {
        "model": Path(model).resolve().name,
        "provider": server.facts.provider,
        "threads": threads,
        "new_tokens": new_tokens,
        "prompts": len(PROMPTS),
        "repeats": repeats,
        **result,
        "goals": GOALS,
    }


def print_table(result: dict) -> None:
    """The two comparisons as a readable table, each with its ratio and goal."""
    lat, goals = result["latency"], result["goals"]
    print(f"model {result['model']} on {result['provider']}, {result['new_tokens']} greedy tokens per request\n")
    print(f"{'one stream':<12}{'TTFT ms':>10}{'per token ms':>14}{'stream ms':>11}")
    for side in ("in_process", "grpc"):
        print(
            f"{side:<12}{lat[side]['ttft_ms']:>10.3f}{lat[side]['per_token_ms']:>14.3f}{lat[side]['total_ms']:>11.3f}"
        )
    print(f"gRPC unary round trip (GetModelInfo, no engine): {lat['grpc']['unary_round_trip_ms']:.3f} ms")
    print(
        f"gRPC / in-process: TTFT {result['grpc_vs_in_process_ttft']:.2f}x, per token "
        f"{result['grpc_vs_in_process_per_token']:.2f}x (goal <= {goals['grpc_vs_in_process_per_token_max']:.2f}x), "
        f"whole stream {result['grpc_vs_in_process_total']:.2f}x\n"
    )
    print(f"{'in flight':>9}{'requests':>10}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}{'vs 1':>8}")
    for row in result["throughput"]:
        print(
            f"{row['concurrency']:>9}{row['requests']:>10}{row['tokens']:>8}{row['seconds']:>9.2f}"
            f"{row['tokens_per_s']:>10.0f}{row['vs_sequential']:>7.2f}x"
        )
    print(
        f"batched / sequential: {result['batched_vs_sequential']:.2f}x "
        f"(goal >= {goals['batched_vs_sequential_min']:.1f}x)\n"
    )


def write_plot(result: dict, path: str) -> None:
    """Throughput against concurrency, and the single-stream latencies side by side (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    rows = result["throughput"]
    left.plot([r["concurrency"] for r in rows], [r["tokens_per_s"] for r in rows], marker="o")
    left.set_xscale("log", base=2)
    left.set(xlabel="requests in flight", ylabel="output tokens/s", title="continuous batching (engine)")
    left.set_xticks([r["concurrency"] for r in rows], [str(r["concurrency"]) for r in rows])
    left.minorticks_off()
    lat, sides = result["latency"], ("in_process", "grpc")
    x = range(len(sides))
    right.bar([i - 0.2 for i in x], [lat[s]["per_token_ms"] for s in sides], width=0.4, label="per token")
    right.bar([i + 0.2 for i in x], [lat[s]["ttft_ms"] for s in sides], width=0.4, label="first token")
    right.set_xticks(list(x), ["in-process", "gRPC stream"])
    right.set(ylabel="ms", title="one stream: latency")
    right.legend()
    fig.suptitle(f"attnserve serving benchmark: {result['model']} ({result['provider']})")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


T = TypeVar("T")


def alternating(sides: Sequence[T], repeats: int, label: str) -> Iterator[T]:
    """The sides to run, round after round, in turn forwards and backwards (neither side always runs
    first on a machine that warms or cools), with a progress line per round."""
    for r in range(repeats):
        progress(f"{label}, round {r + 1}/{repeats}")
        yield from (sides if r % 2 == 0 else list(reversed(sides)))


S = TypeVar("S")


def launch_orders(sides: Sequence[T], count: int) -> Iterator[Sequence[T]]:
    """The order the sides start in, launch after launch: as given, then reversed, and so on, with a
    progress line per launch."""
    for launch in range(count):
        progress(f"launch {launch + 1}/{count}")
        yield sides if launch % 2 == 0 else list(reversed(sides))


def launches(
    start: Callable[[str], S], close: Callable[[S], None], sides: Sequence[str], count: int
) -> Iterator[dict[str, S]]:
    """Each side's server, started `count` times: in the sides' order, then in reverse, and so on, each launch
    closed before the next. A server's speed can differ from another's of the same flags for its whole life:
    on the 2-core Xeon, GPT-2 124M int8 at one stream, the one started second served 1.11-1.17x the other's
    tokens/s in three runs (docs/reports/start-order.md); so each side starts first as often as second, and
    its rounds span its launches."""
    for order in launch_orders(sides, count):
        servers: dict[str, S] = {}
        try:
            for side in order:
                servers[side] = start(side)
            yield {side: servers[side] for side in sides}
        finally:
            for server in servers.values():
                close(server)


def emit(report: dict, out: str | None) -> int:
    """A benchmark's end: `report` written as JSON to `out` (where given) and printed as the last line; 0."""
    if out:
        Path(out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return 0


def spread(values: list[float]) -> dict[str, float]:
    """The median of alternating rounds with their min and max: how the benchmarks report a figure."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ab_kind(kind: str, per_row: dict[str, list[float]], same: bool) -> dict[str, Any]:
    """An in-process A/B's figures for one kind: each side's microseconds a row (`per_row`, a figure a round)
    as a spread, b/a round by round, and whether the sides picked the same ids; printed as one line."""
    ratio = [b / a for a, b in zip(per_row["a"], per_row["b"])]
    a, b = spread(per_row["a"]), spread(per_row["b"])
    ratios = spread(ratio)
    print(
        f"{kind:11} a {a['median']:7.1f} us/row ({a['min']:.1f}-{a['max']:.1f})  b {b['median']:7.1f} "
        f"({b['min']:.1f}-{b['max']:.1f})  b/a {ratios['median']:.2f}  same ids: {same}"
    )
    return {"kind": kind, "us_per_row": {"a": a, "b": b}, "b_over_a": ratios, "same_ids": same}


def error_bars(spreads: list[dict[str, float]]) -> tuple[list[float], list[list[float]]]:
    """The medians of spreads, and matplotlib's yerr for them: the distances down to each min and up to each max."""
    medians = [s["median"] for s in spreads]
    return medians, [[m - s["min"] for m, s in zip(medians, spreads)], [s["max"] - m for m, s in zip(medians, spreads)]]


def add_sides(p: argparse.ArgumentParser, example: str) -> None:
    """The flags of a served A/B's two sides (each a checkout and `attnserve serve` flags, on one model
    directory) and of the streams they serve; `example`: side a's flags in the help."""
    p.add_argument("--model", required=True, type=Path, help="model directory written by `attnserve export`")
    p.add_argument(
        "--tree-a", help="a checkout side a's server runs from, e.g. a git worktree of the commit before a change"
    )
    p.add_argument("--tree-b", help="side b's checkout (default: this one)")
    p.add_argument("--a", default="", help=f'side a\'s `attnserve serve` flags, one string (e.g. "{example}")')
    p.add_argument("--b", default="", help="side b's flags")
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt ids per stream")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per stream")


def served_ratios(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Two served sides' b/a, pair by pair (a round's or a launch's), as spreads: tokens/s ("b_over_a") and
    time to first token ("ttft_b_over_a")."""
    pairs = list(zip(runs["a"], runs["b"]))
    return {
        "b_over_a": spread([b["tokens_per_s"] / a["tokens_per_s"] for a, b in pairs]),
        "ttft_b_over_a": spread([b["ttft_ms"] / a["ttft_ms"] for a, b in pairs]),
    }


def report(
    result: dict,
    stamp: Stamp,
    out: str | None,
    plot: str | None,
    table: Callable[[dict], None],
    plotter: Callable[[dict, str], None] | None = None,
    *,
    title: str,
) -> None:
    """A benchmark's ending: the stamp, the table and the load average, the PNG, the JSON file and its
    Markdown report if asked for, the JSON object last."""
    result["stamp"] = stamp.finish()
    table(result)
    print(f"load average before {result['stamp']['load_before']}, after {result['stamp']['load_after']}")
    if plot and plotter:
        plotter(result, plot)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_report(out, result, plot if plotter else None, title)
    print(json.dumps(result))


def main(argv: list[str] | None = None) -> int:
    """CLI: measure, print the table, write --out and --plot, print the JSON object last."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument(
        "--concurrency",
        default="1,16",
        help="comma-separated requests in flight; the first is the baseline, the last the batched figure",
    )
    p.add_argument("--new-tokens", type=int, default=96, help="greedy tokens per request (prompts are <= 22 tokens)")
    p.add_argument("--repeats", type=int, default=3, help="rounds; medians are reported")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: the server's default)")
    p.add_argument("--provider", default="cpu", choices=("auto", "cuda", "cpu"))
    p.add_argument(
        "--engine-core",
        default="thread",
        choices=("thread", "process"),
        help="where the server's engine runs (default thread; benchmarks.engine_core compares the two)",
    )
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--plot", help="write a PNG here")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    stamp = Stamp.start()
    try:
        result = asyncio.run(
            run(args.model, levels, args.new_tokens, args.repeats, args.threads, args.provider, args.engine_core)
        )
    except grpc.aio.AioRpcError as e:
        sys.exit(f"serving benchmark: {e.code().name}: {e.details()}")
    except (ModelDirError, ProviderError, StartupError, ValueError) as e:
        sys.exit(f"serving benchmark: {type(e).__name__}: {e}")
    stamp.provider = result["provider"]
    report(result, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
