"""Prefix caching on and off (issue 25): the same requests through gRPC to two `attnserve serve`
processes over one model directory, one started with --prefix-cache on, one with --prefix-cache off.

Two workloads, each --requests requests of --new-tokens greedy tokens (ignore_eos: every request
produces them all), --in-flight streams at a time (each client takes the next request as one
ends), all arriving at the start:
  shared    a --preamble-tokens preamble (random ids) followed by a different --question-tokens
            question each: the shape of a system prompt or a few-shot preamble
  distinct  prompts of the same length with nothing in common: what the cache costs when it never hits
Each round draws a fresh preamble (seeded by the round), so every round starts with a cold cache,
and runs both servers on it, the order flipping every round. Reported per workload and side: time
to first token p50 and p99 (from the request's send), output tokens/s over the workload, and the
on/off ratios per round (TTFT off/on: how many times faster; throughput on/off), medians over
--repeats with min and max; with the load averages, to say whether the machine was busy. Prints a
table, then one JSON object last. Torch-free.

    python -m benchmarks.prefix_cache --model models/small-1k-bpe [--requests 64] [--in-flight 16]
        [--preamble-tokens 900] [--question-tokens 16] [--new-tokens 32] [--repeats 3]
        [--out F.json] [--plot F.png]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

from attnserve.clients.aio import AsyncClient
from attnserve.clients.types import GenerationParams
from attnserve.report_stamp import Stamp
from attnserve.runtime.contract import read_manifest
from benchmarks.loadtest.server_process import ServerProcess
from benchmarks.mixed import percentile
from benchmarks.serving import alternating, report, spread

SIDES = ("on", "off")
WORKLOADS = ("shared", "distinct")
TITLE = "Prefix cache on vs off"


def prompts(args: argparse.Namespace, workload: str, round_: int) -> list[list[int]]:
    """The round's prompts: one preamble and different questions, or nothing shared."""
    manifest = read_manifest(args.model, verify=False)
    specials = {manifest.bos_id, manifest.eos_id, manifest.pad_id}
    ids = [i for i in range(manifest.vocab_size) if i not in specials]
    rng = random.Random(f"{args.seed}-{workload}-{round_}")
    preamble = rng.choices(ids, k=args.preamble_tokens)
    if workload == "shared":
        return [preamble + rng.choices(ids, k=args.question_tokens) for _ in range(args.requests)]
    return [rng.choices(ids, k=args.preamble_tokens + args.question_tokens) for _ in range(args.requests)]


async def run_workload(target: str, requests: list[list[int]], in_flight: int, new_tokens: int) -> dict[str, Any]:
    """The requests through gRPC, `in_flight` streams at a time; TTFTs, tokens and the cached share."""
    waiting = list(requests)
    ttfts: list[float] = []
    produced = cached = 0
    params = GenerationParams(max_new_tokens=new_tokens, ignore_eos=True)
    async with AsyncClient(target) as client:
        start = time.perf_counter()

        async def worker() -> None:
            nonlocal produced, cached
            while waiting:
                prompt = waiting.pop(0)
                sent = time.perf_counter()
                first = None
                async with client.stream(prompt, params, timeout=600) as stream:
                    async for delta in stream:
                        first = first or time.perf_counter()
                        produced += len(delta.token_ids)
                    result = await stream.result()
                assert first is not None and result.usage is not None, "every request produces its tokens"
                ttfts.append(first - sent)
                cached += result.usage.cached_tokens

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        seconds = time.perf_counter() - start
    return {
        "ttft_p50_ms": 1000 * percentile(ttfts, 50),
        "ttft_p99_ms": 1000 * percentile(ttfts, 99),
        "tokens_per_s": produced / seconds,
        "seconds": seconds,
        "cached_tokens": cached,
    }


def measure(args: argparse.Namespace, servers: dict[str, ServerProcess]) -> dict[str, Any]:
    warm = prompts(args, "distinct", -1)[: args.in_flight]
    for server in servers.values():
        asyncio.run(run_workload(server.target, warm, args.in_flight, args.new_tokens))
    result: dict[str, Any] = {}
    for workload in args.workloads.split(","):
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        for n, side in enumerate(alternating(SIDES, args.repeats, f"{workload} prefixes")):
            requests = prompts(args, workload, n // 2)
            runs[side].append(
                asyncio.run(run_workload(servers[side].target, requests, args.in_flight, args.new_tokens))
            )
        out: dict[str, Any] = {
            side: {key: spread([r[key] for r in runs[side]]) for key in runs[side][0]} for side in SIDES
        }
        pairs = list(zip(runs["on"], runs["off"]))
        out["ttft_p50_off_over_on"] = spread([off["ttft_p50_ms"] / on["ttft_p50_ms"] for on, off in pairs])
        out["throughput_on_over_off"] = spread([on["tokens_per_s"] / off["tokens_per_s"] for on, off in pairs])
        result[workload] = out
    return result


def print_table(result: dict) -> None:
    print(f"{'workload':>9} {'cache':>5} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'tok/s':>8} {'cached tokens':>14}")
    for workload in (w for w in WORKLOADS if w in result):
        for side in SIDES:
            s = result[workload][side]
            print(
                f"{workload:>9} {side:>5} {s['ttft_p50_ms']['median']:>12,.1f} {s['ttft_p99_ms']['median']:>12,.1f} "
                f"{s['tokens_per_s']['median']:>8,.0f} {s['cached_tokens']['median']:>14,.0f}"
            )
        t, r = result[workload]["ttft_p50_off_over_on"], result[workload]["throughput_on_over_off"]
        print(f"{workload}: TTFT p50 off/on {t['median']:.2f}x ({t['min']:.2f}-{t['max']:.2f}), ", end="")
        print(f"throughput on/off {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})")


def write_plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.5))
    for n, side in enumerate(SIDES):
        at = [x + 0.4 * n for x in range(len(WORKLOADS))]
        left.bar(at, [result[w][side]["ttft_p50_ms"]["median"] for w in WORKLOADS], width=0.4, label=f"cache {side}")
        right.bar(at, [result[w][side]["tokens_per_s"]["median"] for w in WORKLOADS], width=0.4, label=f"cache {side}")
    for axis, label in ((left, "time to first token p50, ms"), (right, "output tokens/s")):
        axis.set_xticks([0.2, 1.2], [f"{w} prefixes" for w in WORKLOADS])
        axis.set_ylabel(label)
        axis.legend()
    left.set_yscale("log")
    fig.suptitle(
        f"{result['requests']} requests, {result['in_flight']} in flight, {result['preamble_tokens']} + "
        f"{result['question_tokens']} prompt tokens, {result['new_tokens']} new"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument("--requests", type=int, default=64, help="requests per workload, all arriving at the start")
    p.add_argument("--in-flight", type=int, default=16, help="streams at a time (and each server's --max-batch)")
    p.add_argument("--preamble-tokens", type=int, default=900, help="prompt ids shared by the shared workload")
    p.add_argument("--question-tokens", type=int, default=16, help="prompt ids of each request's own")
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per request (EOS ignored)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="which of shared,distinct to run")
    p.add_argument("--seed", type=int, default=0, help="the workloads' seed")
    p.add_argument("--repeats", type=int, default=3, help="rounds, the sides alternating; medians reported")
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--plot", help="write a PNG chart here")
    args = p.parse_args(argv)
    stamp = Stamp.start(provider="cpu")
    flags = ["--provider", "cpu", "--max-batch", str(args.in_flight), "--max-queue", str(args.requests)]
    servers: dict[str, ServerProcess] = {}
    try:
        for side in SIDES:
            servers[side] = ServerProcess(args.model, *flags, "--prefix-cache", side)
        measured = measure(args, servers)
    finally:
        for server in servers.values():
            server.stop()
    keys = ("model", "requests", "in_flight", "preamble_tokens", "question_tokens", "new_tokens", "seed", "repeats")
    result = {**{key: getattr(args, key) for key in keys}, **measured}
    report(result, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
