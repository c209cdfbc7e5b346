"""KV cache benchmark: the in-place arena against the concat cache it replaced and against
onnxruntime-genai, on the same weights, in one run, reported as ratios.

  arena vs concat, serving   output tokens/s of greedy requests with C in flight (all arriving at
                             once), on two in-process Servers over two exports of one checkpoint
                             (`--kv-cache arena` and `--kv-cache concat`), through the engine and,
                             for the arena, through gRPC: `attnserve bench` streaming from a
                             process of its own to the server on 127.0.0.1
  arena vs onnxruntime-genai the same prompts decoded by onnxruntime-genai in-process on the same
                             arena directory (its own venv, a subprocess timed from the inside):
                             batch 1, and one static batch of 16
  one decode step            ms per ONNX Runtime step at batch B and past P, arena vs concat graph

Every prompt is 16 tokens (BOS and 15 bytes), so no side pads. Sides alternate within each round;
medians over --repeats are reported with their min and max, and the load average before and
after says whether the machine was busy. Prints a table, then one JSON object last. Torch-free.

    python -m benchmarks.kv --model models/small-1k --concat-model models/small-1k-concat
        [--new-tokens 256,512] [--concurrency 1,4,16,64] [--repeats 3] [--out F.json] [--plot F.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from attnserve.engine.engine import Engine, EngineLimits
from attnserve.report_stamp import Stamp
from attnserve.runtime.model_sessions import ModelSessions, default_threads
from attnserve.runtime.ort_decoder import OrtDecoder
from attnserve.server.app import Server
from attnserve.server.config import ServerConfig
from benchmarks.concat_runner import ConcatRunner
from benchmarks.serving import engine_stream, progress, report

PASSAGE = (
    "The Python documentation describes the language, its standard library and the tools around it. "
    "Each module has a page of its own, with the functions, classes and constants it defines. "
) * 4
ROOT = Path(__file__).resolve().parents[1]  # the checkout: benchmarks/kv.py
GENAI_PYTHON = ROOT / ".venv-genai" / "bin" / "python"  # make test and make kv-bench build it
GENAI_SCRIPT = ROOT / "benchmarks" / "genai_bench.py"
TITLE = "KV cache: arena vs concat vs onnxruntime-genai"
GOALS = {"arena_16_vs_1_grpc_min": 5.0, "arena_16_vs_genai_16_min": 1.5, "arena_1_vs_genai_1_min": 2.0}


def prompts(n: int) -> list[str]:
    """n different 15-byte prompts (16 tokens with BOS)."""
    return [PASSAGE[7 * i : 7 * i + 15] for i in range(n)]


async def wave(stream, texts: list[str], new_tokens: int) -> dict:
    """All requests at once; output tokens/s of the whole wave."""
    start = time.perf_counter()
    done = await asyncio.gather(*(stream(text, new_tokens) for text in texts))
    seconds = time.perf_counter() - start
    tokens = sum(d["tokens"] for d in done)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


async def grpc_wave(port: int, concurrency: int, new_tokens: int) -> dict:
    """`attnserve bench` in a process of its own (a real client), all requests at once, streamed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "attnserve.cli",
        "bench",
        "--target",
        f"127.0.0.1:{port}",
        "--concurrency",
        str(concurrency),
        "--requests",
        str(concurrency),
        "--prompt-tokens",
        "16",
        "--prompt-text",
        "--max-new-tokens",
        str(new_tokens),
        "--warmup",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"attnserve bench failed: {err.decode().strip().splitlines()[-1:]}")
    level = json.loads(out.decode().strip().splitlines()[-1])["levels"][0]
    return {
        "tokens": level["output_tokens"],
        "seconds": level["output_tokens"] / level["output_tokens_per_s"],
        "tokens_per_s": level["output_tokens_per_s"],
    }


def genai_wave(model_dir: str, texts: list[str], new_tokens: int, tokenizer) -> dict:
    """onnxruntime-genai decoding the texts as one static batch (a subprocess in .venv-genai)."""
    return genai_batch(model_dir, [tokenizer.encode_prompt(t) for t in texts], new_tokens)


def genai_batch(model_dir: str, ids: list[list[int]], new_tokens: int) -> dict:
    """onnxruntime-genai decoding prompts of token ids (one length) as one static batch, exactly
    new_tokens each (a subprocess in .venv-genai): tokens, seconds, tokens_per_s."""
    proc = subprocess.run(
        [
            str(GENAI_PYTHON),
            str(GENAI_SCRIPT),
            model_dir,
            "--prompts",
            json.dumps(ids),
            "--new-tokens",
            str(new_tokens),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode:
        raise RuntimeError(f"onnxruntime-genai failed: {proc.stderr.strip().splitlines()[-1:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {k: result[k] for k in ("tokens", "seconds", "tokens_per_s")}


def summary(runs: list[dict]) -> dict:
    rates = [r["tokens_per_s"] for r in runs]
    return {
        "tokens_per_s": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "tokens": runs[0]["tokens"],
        "runs": len(runs),
    }


def concat_engine(model_dir: str, threads: int, max_batch: int, tokenizer) -> Engine:
    """The engine before the arena, over a concat directory (attnserve serve no longer runs one)."""
    model = ModelSessions(model_dir, "cpu", threads)
    runner = ConcatRunner(model, max_batch, model.manifest.pad_id)
    engine = Engine(runner, tokenizer, EngineLimits(max_batch, 4 * max_batch, 0, None, "off", 0))
    engine.start()
    return engine


async def serving(
    arena: Server, concat: Engine, model_dir: str, levels: list[int], new_tokens: int, repeats: int, genai: bool
) -> dict:
    """Tokens/s per side and concurrency, sides alternating inside every round."""
    sides = {
        "arena": lambda p, n: engine_stream(arena.engine, arena.tokenizer, p, n),
        "concat": lambda p, n: engine_stream(concat, concat.tokenizer, p, n),
    }
    for stream in sides.values():  # warm-up
        await wave(stream, prompts(max(levels)), 8)
    await grpc_wave(arena.port, max(levels), 8)
    runs: dict[str, dict[int, list]] = {
        side: {c: [] for c in levels} for side in ("arena", "arena_grpc", "concat", "genai")
    }
    for r in range(repeats):
        for c in levels:
            progress(f"{new_tokens} new tokens, round {r + 1}/{repeats}, {c} in flight")
            runs["arena_grpc"][c].append(await grpc_wave(arena.port, c, new_tokens))
            for side, stream in sides.items():
                runs[side][c].append(await wave(stream, prompts(c), new_tokens))
            if genai and c in (1, 16):
                runs["genai"][c].append(genai_wave(model_dir, prompts(c), new_tokens, arena.tokenizer))
    return {side: {str(c): summary(r) for c, r in by_c.items() if r} for side, by_c in runs.items()}


def step_ms(
    arena_dir: str, concat_dir: str, batch: int, past: int, repeats: int, threads: int, steps: int = 20
) -> dict:
    """Median ms of one decode step at (batch, past), arena vs concat graph, alternating in rounds."""
    arena_rt, concat_rt = OrtDecoder(arena_dir, threads), OrtDecoder(concat_dir, threads)
    rng = np.random.default_rng(0)
    decoder = arena_rt.arena(batch, batch * past)
    decoder.prefill(0, [list(rng.integers(0, 256, past)) for _ in range(batch)])
    tokens = rng.integers(0, 256, batch)
    shape = (batch, concat_rt.n_kv_heads, past, concat_rt.head_dim)
    cache = [rng.standard_normal(shape).astype(concat_rt.dtype) for _ in range(2 * concat_rt.n_layers)]
    mask, positions = np.ones((batch, past + 1), np.int64), np.full((batch, 1), past, np.int64)

    def arena_step():
        decoder.decode(tokens)
        decoder.arena.lengths[:batch] = past  # stay at past P

    def concat_step():
        concat_rt.run(tokens[:, None], mask, positions, cache)

    times: dict[str, list[float]] = {"arena": [], "concat": []}
    for _ in range(repeats + 1):
        for side, fn in (("arena", arena_step), ("concat", concat_step)):
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            times[side].append(1000 * (time.perf_counter() - start) / steps)
    arena_t, concat_t = statistics.median(times["arena"][1:]), statistics.median(times["concat"][1:])
    return {
        "batch": batch,
        "past": past,
        "arena_ms": arena_t,
        "concat_ms": concat_t,
        "speedup": concat_t / arena_t,
        "arena_spread_ms": [min(times["arena"][1:]), max(times["arena"][1:])],
        "concat_spread_ms": [min(times["concat"][1:]), max(times["concat"][1:])],
    }


def ratios(serve: dict, levels: list[int]) -> dict:
    """The headline ratios of one new-tokens setting (those whose sides were measured)."""
    rate = lambda side, c: serve.get(side, {}).get(str(c), {}).get("tokens_per_s")
    out = {f"arena_vs_concat_at_{c}": rate("arena", c) / rate("concat", c) for c in levels}
    if 16 in levels and 1 in levels:
        out["arena_grpc_16_vs_1"] = rate("arena_grpc", 16) / rate("arena_grpc", 1)
        out["arena_16_vs_1"] = rate("arena", 16) / rate("arena", 1)
    if rate("genai", 1):
        out["arena_grpc_1_vs_genai_1"] = rate("arena_grpc", 1) / rate("genai", 1)
    if rate("genai", 16):
        out["arena_grpc_16_vs_genai_16"] = rate("arena_grpc", 16) / rate("genai", 16)
    return out


async def run(args) -> dict:
    levels = [int(c) for c in args.concurrency.split(",")]
    common = dict(
        port=0,
        provider="cpu",
        threads=args.threads,
        max_batch=max(levels),
        max_queue=4 * max(levels),
        max_new_tokens_cap=max(args.new_tokens),
        engine_core="thread",  # the arena's runner is read below; the concat engine runs in this process too
    )
    arena = Server(ServerConfig(model=args.model, **common))
    concat = concat_engine(args.concat_model, args.threads, max(levels), arena.tokenizer)
    genai = GENAI_PYTHON.exists() and not args.no_genai
    result = {
        "model": Path(args.model).resolve().name,
        "context_length": arena.facts.manifest.context_length,
        "threads": args.threads or default_threads(),
        "cores": os.cpu_count(),
        "repeats": args.repeats,
        "prompt_tokens": 16,
        "concurrency": levels,
        "genai": genai,
        "goals": GOALS,
        "serving": {},
    }
    try:
        await arena.start()
        for n in args.new_tokens:
            serve = await serving(arena, concat, args.model, levels, n, args.repeats, genai)
            result["serving"][str(n)] = {"sides": serve, "ratios": ratios(serve, levels)}
    finally:
        await arena.stop()
        concat.stop()
    progress("one decode step, arena vs concat")
    context = result["context_length"]
    shapes = [(1, 128), (16, 128), (16, 512), (64, 512)] if context > 512 else [(1, context // 2), (16, context // 2)]
    result["step"] = [
        step_ms(args.model, args.concat_model, b, p, args.repeats, args.threads or default_threads()) for b, p in shapes
    ]
    return result


def print_table(result: dict) -> None:
    print(
        f"model {result['model']} (context {result['context_length']}), {result['threads']} ORT thread(s) "
        f"on {result['cores']} cores"
    )
    for n, block in result["serving"].items():
        print(f"\n{n} new tokens: output tokens/s (median [min, max] of {result['repeats']})")
        for side, by_c in block["sides"].items():
            cells = "  ".join(
                f"C={c}: {s['tokens_per_s']:.0f} [{s['min']:.0f}, {s['max']:.0f}]" for c, s in by_c.items()
            )
            print(f"  {side:<11}{cells}")
        print("  " + ", ".join(f"{k} {v:.2f}x" for k, v in block["ratios"].items()))
    print(
        "\none decode step (ms): "
        + "; ".join(
            f"B{s['batch']} P{s['past']}: arena {s['arena_ms']:.2f}, concat {s['concat_ms']:.2f} ({s['speedup']:.2f}x)"
            for s in result["step"]
        )
    )


def write_plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = list(result["serving"].items())
    fig, axes = plt.subplots(1, len(blocks) + 1, figsize=(5.5 * (len(blocks) + 1), 4.2))
    for ax, (n, block) in zip(axes, blocks):
        for side, by_c in block["sides"].items():
            cs = [int(c) for c in by_c]
            ax.plot(cs, [by_c[str(c)]["tokens_per_s"] for c in cs], marker="o", label=side)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="requests in flight (genai: static batch)", ylabel="output tokens/s", title=f"{n} new tokens")
        ax.legend()
    steps = result["step"]
    x = np.arange(len(steps))
    axes[-1].bar(x - 0.2, [s["concat_ms"] for s in steps], 0.4, label="concat")
    axes[-1].bar(x + 0.2, [s["arena_ms"] for s in steps], 0.4, label="arena")
    axes[-1].set_xticks(x, [f"B{s['batch']} P{s['past']}" for s in steps])
    axes[-1].set(ylabel="ms per decode step", title="one ONNX Runtime step")
    axes[-1].legend()
    fig.suptitle(f"attnserve KV arena: {result['model']}, context {result['context_length']}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="arena model directory (attnserve export, the default)")
    p.add_argument("--concat-model", required=True, help="the same checkpoint exported with --kv-cache concat")
    p.add_argument("--new-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[256, 512])
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: the server's default)")
    p.add_argument("--no-genai", action="store_true", help="skip onnxruntime-genai (.venv-genai: make genai-check)")
    p.add_argument("--out")
    p.add_argument("--plot")
    args = p.parse_args(argv)
    stamp = Stamp.start(provider="cpu")
    result = asyncio.run(run(args))
    report(result, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
