"""A mixed workload closer to real traffic, served through gRPC by `attnserve serve` (continuous
batching) against onnxruntime-genai decoding the same requests in static batches (issue 22 step 6).

The workload (seeded, the same on both sides and every round): --requests requests arrive at once,
each with --prompt-tokens prompt ids (drawn as `attnserve bench` draws its own) and an output length
drawn from an exponential distribution of mean --mean-new-tokens, clipped to --min-new-tokens and
--max-new-tokens.
  attnserve  --in-flight clients send requests through one `attnserve serve` (its engine core in
             a process of its own), each taking the next waiting request as one ends; greedy, each
             request's own max_new_tokens (a request may end earlier at EOS: its tokens are counted
             as produced); --call stream (GenerateStream, a message per token) or unary
             (Generate: the whole completion at its end, as genai's batches give theirs)
  genai      the requests in arrival order, in static batches of --in-flight (what a server built
             on onnxruntime-genai's batch API does): a batch decodes to its longest request's
             length, so the shorter ones' extra tokens are work nobody asked for; each request's
             own length is its useful tokens, and it completes when its batch does
Reported for each side: useful output tokens/s (tokens the requests asked for, or got before EOS,
over the time until the last request completed), and p50 and p99 completion latency (from the
common arrival). Sides alternate within each round (the order flips every round); medians over
--repeats with min and max, and the attnserve/genai ratios per round. genai runs in .venv-genai
(`make test` builds it). Prints a table, then one JSON object last. Torch-free.

    python -m benchmarks.mixed --model models/small-1k-bpe [--requests 64] [--in-flight 16]
        [--call stream|unary] [--prompt-tokens 32] [--mean-new-tokens 128] [--repeats 3] [--out F.json] [--plot F.png]
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
from benchmarks.kv import GENAI_PYTHON, genai_batch
from benchmarks.loadtest.server_process import ServerProcess
from benchmarks.serving import alternating, report, spread

SIDES = ("attnserve", "genai")
TITLE = "Mixed output lengths: attnserve vs onnxruntime-genai's static batches"


def workload(args: argparse.Namespace) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) of every request, in arrival order."""
    manifest = read_manifest(args.model, verify=False)
    specials = {manifest.bos_id, manifest.eos_id, manifest.pad_id}
    ids = [i for i in range(manifest.vocab_size) if i not in specials]
    rng = random.Random(args.seed)
    lengths = [round(rng.expovariate(1.0 / args.mean_new_tokens)) for _ in range(args.requests)]
    clipped = [min(max(n, args.min_new_tokens), args.max_new_tokens) for n in lengths]
    return [(rng.choices(ids, k=args.prompt_tokens), n) for n in clipped]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def outcome(tokens: int, seconds: float, latencies: list[float]) -> dict[str, float]:
    return {
        "useful_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "latency_p50_ms": 1000 * percentile(latencies, 50),
        "latency_p99_ms": 1000 * percentile(latencies, 99),
    }


async def serve_side(
    target: str, requests: list[tuple[list[int], int]], in_flight: int, call: str = "stream"
) -> dict[str, float]:
    """The requests through gRPC, --in-flight calls at a time (streams, or unary Generate calls that
    get each completion whole), all arriving at the start."""
    waiting = list(enumerate(requests))
    latencies: list[float] = [0.0] * len(requests)
    produced = [0] * len(requests)
    async with AsyncClient(target) as client:
        start = time.perf_counter()

        async def worker() -> None:
            while waiting:
                index, (prompt, length) = waiting.pop(0)
                params = GenerationParams(max_new_tokens=length)
                if call == "unary":
                    produced[index] = len((await client.generate(prompt, params, timeout=600)).token_ids)
                else:
                    async with client.stream(prompt, params, timeout=600) as stream:
                        async for delta in stream:
                            produced[index] += len(delta.token_ids)
                latencies[index] = time.perf_counter() - start

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        seconds = time.perf_counter() - start
    return outcome(sum(produced), seconds, latencies)


def genai_side(model: str, requests: list[tuple[list[int], int]], in_flight: int) -> dict[str, float]:
    """The requests in arrival order, in static batches of in_flight, each to its longest length."""
    elapsed, useful, latencies = 0.0, 0, []
    for first in range(0, len(requests), in_flight):
        batch = requests[first : first + in_flight]
        done = genai_batch(model, [prompt for prompt, _ in batch], max(length for _, length in batch))
        elapsed += done["seconds"]
        useful += sum(length for _, length in batch)
        latencies += [elapsed] * len(batch)
    return outcome(useful, elapsed, latencies)


def summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("tokens_per_s", "latency_p50_ms", "latency_p99_ms"):
        out[key] = spread([r[key] for r in runs])
    out["useful_tokens"] = sorted({r["useful_tokens"] for r in runs})
    return out


def measure(args: argparse.Namespace, server: ServerProcess, requests: list[tuple[list[int], int]]) -> dict:
    asyncio.run(serve_side(server.target, requests[: args.in_flight], args.in_flight, args.call))  # warm-up
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for side in alternating(SIDES, args.repeats, "mixed workload"):
        if side == "genai":
            runs[side].append(genai_side(args.model, requests, args.in_flight))
        else:
            runs[side].append(asyncio.run(serve_side(server.target, requests, args.in_flight, args.call)))
    result: dict[str, Any] = {side: summary(runs[side]) for side in SIDES}
    pairs = list(zip(runs["attnserve"], runs["genai"]))
    for key, name in (("tokens_per_s", "throughput"), ("latency_p99_ms", "p99_latency")):
        result[f"{name}_attnserve_vs_genai"] = spread([a[key] / g[key] for a, g in pairs])
    return result


def print_table(result: dict) -> None:
    print(f"{'side':>10} {'useful tok/s':>13} {'p50 ms':>9} {'p99 ms':>9}")
    for side in SIDES:
        s = result[side]
        print(
            f"{side:>10} {s['tokens_per_s']['median']:>13,.0f} {s['latency_p50_ms']['median']:>9,.0f} "
            f"{s['latency_p99_ms']['median']:>9,.0f}"
        )
    t, p = result["throughput_attnserve_vs_genai"], result["p99_latency_attnserve_vs_genai"]
    print(
        f"attnserve ({result['call']} calls) / genai: throughput {t['median']:.2f}x ({t['min']:.2f}-{t['max']:.2f}), ",
        end="",
    )
    print(f"p99 latency {p['median']:.2f}x ({p['min']:.2f}-{p['max']:.2f})")


def write_plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.5))
    labels = [f"attnserve (gRPC, {result['call']})", f"genai (static {result['in_flight']})"]
    left.bar(labels, [result[s]["tokens_per_s"]["median"] for s in SIDES], color=["C1", "C2"])
    left.set_ylabel("useful output tokens/s")
    for n, key in enumerate(("latency_p50_ms", "latency_p99_ms")):
        right.bar(
            [x + 0.4 * n for x in range(2)], [result[s][key]["median"] for s in SIDES], width=0.4, label=key[8:11]
        )
    right.set_xticks([0.2, 1.2], labels)
    right.set_ylabel("completion latency, ms")
    right.legend()
    fig.suptitle(
        f"{result['requests']} requests at once, {result['in_flight']} in flight, "
        f"output ~ exp(mean {result['mean_new_tokens']}) in [{result['min_new_tokens']}, {result['max_new_tokens']}]"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory written by `attnserve export`")
    p.add_argument("--requests", type=int, default=64, help="requests, all arriving at the start")
    p.add_argument("--in-flight", type=int, default=16, help="calls at a time (genai: its static batch size)")
    p.add_argument(
        "--call", choices=("stream", "unary"), default="stream", help="GenerateStream, or Generate (whole completions)"
    )
    p.add_argument("--prompt-tokens", type=int, default=32, help="prompt token ids per request")
    p.add_argument("--mean-new-tokens", type=int, default=128, help="mean of the exponential output lengths")
    p.add_argument("--min-new-tokens", type=int, default=8, help="output lengths are clipped to at least this")
    p.add_argument("--max-new-tokens", type=int, default=512, help="... and to at most this")
    p.add_argument("--seed", type=int, default=0, help="the workload's seed")
    p.add_argument("--repeats", type=int, default=3, help="rounds, the sides alternating; medians reported")
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--plot", help="write a PNG chart here")
    args = p.parse_args(argv)
    if not GENAI_PYTHON.exists():
        p.error(f"{GENAI_PYTHON} is missing: `make test` (or the .venv-genai target) builds it")
    stamp = Stamp.start(provider="cpu")
    requests = workload(args)
    flags = ["--provider", "cpu", "--max-batch", str(args.in_flight), "--max-queue", str(args.requests)]
    server = ServerProcess(args.model, *flags, "--max-new-tokens-cap", str(args.max_new_tokens))
    try:
        measured = measure(args, server, requests)
    finally:
        server.stop()
    result = {
        **{key: getattr(args, key) for key in ("model", "requests", "in_flight", "call", "prompt_tokens", "seed")},
        **{key: getattr(args, key) for key in ("repeats", "mean_new_tokens", "min_new_tokens", "max_new_tokens")},
        "asked_tokens": sum(n for _, n in requests),
        **measured,
    }
    report(result, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
