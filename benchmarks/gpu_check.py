"""`make gpu-check`: the CUDA path proven and measured on a CUDA host, in one command (issue 23).

  1. train   a small BPE model (the `small` preset, 1024-token context) on the GPU for
             --train-seconds, unless --checkpoint names one
  2. export  it in float16 and bfloat16; each parity gate runs on CUDAExecutionProvider
  3. tests   pytest -m gpu (tests/test_gpu.py and the other GPU-marked tests): the session on CUDA,
             the arena and the run inputs on the device, no Memcpy node in ONNX Runtime's profile
             of prefill and decode, no host read of the cache, greedy identity served end to end
  4. latency per token at one stream, ONNX Runtime CUDA (the server's ArenaDecoder, one argmax
             per step) vs PyTorch eager CUDA (attnserve.model.generate.decode, the same weights in
             the same dtype), alternating in --repeats rounds, medians with min and max
  5. serving output tokens/s through gRPC (`attnserve serve --provider cuda`, engine core in a
             process of its own) at --concurrency streams, float16, decode steps replayed as CUDA
             graphs against --no-cuda-graphs, alternating

Prints one table last, with the JSON written to --out. Works on an offline host whose Python has
torch but only the CPU build of onnxruntime once onnxruntime-gpu is on PYTHONPATH (GPU.md); on a
host without CUDA it says in one line what it would run and exits 0.

    python -m benchmarks.gpu_check [--train-seconds 60] [--checkpoint runs/x/checkpoint.pt]
        [--concurrency 1,16,64] [--new-tokens 256] [--repeats 3] [--out reports/gpu-check.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from attnserve.report_stamp import Stamp, write_report

PLAN = (
    "trains a small model on the GPU, exports it in float16 and bfloat16 (gates on CUDA), runs pytest -m gpu, "
    "and times ONNX Runtime CUDA against PyTorch CUDA per token and gRPC at 1, 16 and 64 streams"
)
PROMPT_TOKENS = 16


def say(message: str) -> None:
    print(f"[gpu-check] {message}", file=sys.stderr, flush=True)


def cuda_here() -> str:
    """Why this host cannot run the check ("" when it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    import onnxruntime as ort

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu)"
    return ""


def attnserve(*args: str) -> None:
    """An attnserve command in a subprocess (this Python, this tree), failing the check if it fails."""
    command = [sys.executable, "-m", "attnserve.cli", *args]
    say(" ".join(["attnserve", *args]))
    subprocess.run(command, check=True)


def train(run_dir: Path, seconds: int) -> Path:
    checkpoint = run_dir / "checkpoint.pt"
    if not checkpoint.is_file():
        attnserve(
            "train",
            "--preset",
            "small",
            "--context-length",
            "1024",
            "--batch-size",
            "16",
            "--time-budget",
            str(seconds),
            "--device",
            "cuda",
            "--out",
            str(run_dir),
        )
    return checkpoint


def export(checkpoint: Path, out: Path, dtype: str) -> dict:
    """The export's gate, as its manifest records it."""
    attnserve("export", str(checkpoint), "--out", str(out), "--dtype", dtype)
    manifest = json.loads((out / "attnserve.json").read_text())
    parity = manifest["parity"]
    worst = max(parity["checks"], key=lambda c: c["max_abs_diff"] / c["tolerance"])
    rows = parity["greedy"]["rows"]
    return {
        "dir": str(out),
        "dtype": dtype,
        "gate_provider": parity.get("provider"),
        "passed": parity["passed"],
        "worst_check": {k: worst[k] for k in ("case", "output", "max_abs_diff", "tolerance")},
        "greedy_steps": parity["greedy"]["steps"],
        "greedy_rows_identical": sum(r["first_divergence"] is None for r in rows),
        "greedy_rows": len(rows),
    }


def gpu_tests() -> dict:
    """pytest -m gpu over the GPU-marked test files; the summary line's counts."""
    files = ["tests/test_gpu.py", "tests/test_train_seq2seq.py"]
    say(f"pytest -m gpu {' '.join(files)}")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files],
        capture_output=True,
        text=True,
    )
    print(done.stdout[-6000:], file=sys.stderr)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", done.stdout)}
    return {"returncode": done.returncode, **counts}


def per_token(model_dir: Path, checkpoint: Path, dtype: str, new_tokens: int, repeats: int) -> dict:
    """Milliseconds per token at one stream (a 16-token prompt, then `new_tokens` greedy steps):
    ONNX Runtime CUDA, decode steps launched node by node (the parity gate's driver) and replayed as
    CUDA graphs (the server's), vs PyTorch eager CUDA, alternating, medians."""
    import numpy as np
    import torch

    from attnserve.export.onnx_export import TORCH_DTYPES, load_model
    from attnserve.model.generate import decode
    from attnserve.runtime.model_sessions import ModelSessions
    from attnserve.runtime.opening import open_slot_runner
    from attnserve.runtime.ort_decoder import OrtDecoder

    runtime = OrtDecoder(model_dir, threads=1, provider="cuda")
    served = open_slot_runner(ModelSessions(model_dir, "cuda", 1), 1, PROMPT_TOKENS).decoder
    model = load_model(checkpoint)[0].to("cuda", TORCH_DTYPES[dtype])
    prompt = list(range(100, 100 + PROMPT_TOKENS))

    def ort_side(decoder) -> list[int]:
        decoder.arena.lengths[:] = 0
        logits, out = decoder.prefill(0, [prompt]), []
        for _ in range(new_tokens):
            out.append(int(logits[0].argmax()))
            logits = decoder.decode(np.array(out[-1:]))
        return out

    def torch_side() -> list[int]:
        tokens = decode(model, [prompt], new_tokens + 1, lambda logits: logits.argmax(-1), runtime.pad_id)
        return tokens[0, :new_tokens].tolist()  # the same work: the prefill and `new_tokens` steps

    def timed(side) -> tuple[float, list[int]]:
        torch.cuda.synchronize()
        start = time.perf_counter()
        tokens = side()
        torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - start) / new_tokens, tokens

    sides = {
        "onnxruntime_cuda": lambda: ort_side(runtime.arena(1, PROMPT_TOKENS)),
        "onnxruntime_cuda_graphs": lambda: ort_side(served),
        "pytorch_cuda": torch_side,
    }
    for side in sides.values():
        side()  # warm-up: kernels, allocator, cuBLAS handles
    times: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, list[int]] = {}
    for r in range(repeats):
        for name in list(sides)[:: 1 if r % 2 == 0 else -1]:
            ms, tokens[name] = timed(sides[name])
            times[name].append(ms)
    ours, theirs = tokens["onnxruntime_cuda_graphs"], tokens["pytorch_cuda"]
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), new_tokens)
    result = {name: spread(values) for name, values in times.items()}
    ratio = result["pytorch_cuda"]["median"] / result["onnxruntime_cuda_graphs"]["median"]
    return {
        "dtype": dtype,
        "new_tokens": new_tokens,
        "ms_per_token": result,
        "ort_speedup": ratio,
        "greedy_tokens_identical_before_divergence": agree,
    }


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


# a served side's name -> its ServerConfig fields besides the defaults (CUDA graphs on, --run-ahead auto)
MODES: dict[str, dict[str, Any]] = {
    "cuda_graphs": {},
    "no_cuda_graphs": {"no_cuda_graphs": True},
    "run_ahead_on": {"run_ahead": "on"},
    "run_ahead_off": {"run_ahead": "off"},  # the defaults on a GPU since 2026-11-30; before, auto ran ahead there
    "wait_16": {"max_waiting_steps": 16},  # arrivals prefilled together (--max-waiting-steps)
}


def serving(
    model_dir: Path,
    levels: list[int],
    new_tokens: int,
    repeats: int,
    modes: tuple[str, ...] = ("cuda_graphs", "no_cuda_graphs"),
    provider: str = "cuda",
    ignore_eos: bool = False,
    kinds: dict[str, dict] | None = None,
) -> list[dict]:
    """Output tokens/s through gRPC at each concurrency (the engine core in a process of its own) on a
    server per mode (MODES: the defaults, decode steps replayed as CUDA graphs; launched node by node;
    run-ahead on, or off; arrivals held up to 16 steps): the servers up side by side, measured in
    alternating rounds after a warm-up at every level (which also captures the graphs of the batch sizes
    it reaches), each run's time to first token and inter-token latency percentiles kept (the median
    run's), each mode after the first as its ratio to the first round by round (`vs_first`).
    `ignore_eos`: every request decodes exactly `new_tokens`. `kinds`: request kinds (a name ->
    GenerateRequest fields) also sent to the first mode's server in the same rounds, each with its ratio
    to that server's greedy round by round."""
    import grpc

    from attnserve.server.app import Server
    from attnserve.server.config import ServerConfig
    from attnserve.v1 import generation_pb2_grpc as pb_grpc
    from benchmarks.serving import closed_loop

    kinds = kinds or {}
    sides = [(m, "greedy") for m in modes] + [(modes[0], kind) for kind in kinds]

    async def measure() -> list[dict]:
        servers: dict = {}
        channels: dict = {}
        try:
            for mode in modes:
                config = ServerConfig(
                    model=str(model_dir), port=0, provider=provider, max_batch=max(levels),
                    max_queue=4 * max(levels), **MODES[mode],
                )  # fmt: skip
                servers[mode] = Server(config)
                await servers[mode].start()
                channels[mode] = grpc.aio.insecure_channel(f"127.0.0.1:{servers[mode].port}")
            stubs = {m: pb_grpc.TextGenerationStub(c) for m, c in channels.items()}
            streams = {(m, k): stub_stream(stubs[m], ignore_eos, kinds.get(k, {})) for m, k in sides}
            for stream in streams.values():
                for level in levels:
                    await closed_loop(stream, level, level, new_tokens)
            runs: dict = {(side, level): [] for side in sides for level in levels}
            for r in range(repeats):
                for side in sides[:: 1 if r % 2 == 0 else -1]:
                    for level in levels:
                        runs[side, level].append(await closed_loop(streams[side], level, 2 * level, new_tokens))
            rows = [served_row(level, modes, list(kinds), runs) for level in levels]
            for row in rows:
                say(
                    f"gRPC {row['concurrency']} streams: "
                    + ", ".join(f"{row[m]['median']:,.0f} tokens/s {m}" for m in modes)
                )
            return rows
        finally:
            for channel in channels.values():
                await channel.close()
            for server in servers.values():
                await server.stop()

    return asyncio.run(measure())


def served_row(level: int, modes: tuple[str, ...], kinds: list[str], runs: dict) -> dict:
    """serving()'s row of one concurrency from its closed_loop runs by ((mode, kind), level)."""
    from benchmarks.serving import median_run

    rate = {side: [run["tokens_per_s"] for run in got] for (side, at), got in runs.items() if at == level}
    row: dict = {"concurrency": level, **{m: spread(rate[m, "greedy"]) for m in modes}}
    row["latency"] = {
        m: {key: median_run(runs[(m, "greedy"), level])[key] for key in ("ttft_ms", "itl_ms")} for m in modes
    }
    if {"cuda_graphs", "no_cuda_graphs"} <= set(modes):
        row["cuda_graphs_speedup"] = row["cuda_graphs"]["median"] / row["no_cuda_graphs"]["median"]
    greedy = rate[modes[0], "greedy"]
    row["vs_first"] = {m: spread([x / g for x, g in zip(rate[m, "greedy"], greedy)]) for m in modes[1:]}
    row["kinds"] = {k: spread([x / g for x, g in zip(rate[modes[0], k], greedy)]) for k in kinds}
    return row


def stub_stream(stub, ignore_eos: bool = False, fields: dict | None = None):
    """A closed_loop stream over `stub`: greedy unless `fields` (GenerateRequest's) say otherwise, stopping
    at EOS unless `ignore_eos` (or fields' own)."""
    from benchmarks.serving import grpc_stream

    return lambda prompt, n: grpc_stream(stub, prompt, n, **{"ignore_eos": ignore_eos, **(fields or {})})


def machine() -> dict:
    import onnxruntime as ort
    import torch

    return {
        "gpu": torch.cuda.get_device_name(0),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "cuda": torch.version.cuda,
    }


def per_token_line(p: dict) -> str:
    """One line of per_token's figures."""
    ms = p["ms_per_token"]
    g, o, q = ms["onnxruntime_cuda_graphs"], ms["onnxruntime_cuda"], ms["pytorch_cuda"]
    return (
        f"  per token, 1 stream, {p['dtype']}: onnxruntime CUDA graphs {g['median']:.3f} ms "
        f"({g['min']:.3f}-{g['max']:.3f}), node by node {o['median']:.3f} ms, PyTorch eager CUDA "
        f"{q['median']:.3f} ms ({q['min']:.3f}-{q['max']:.3f}): {p['ort_speedup']:.2f}x PyTorch's speed"
    )


def print_table(result: dict) -> None:
    print(
        f"gpu-check on {result['machine']['gpu']} (onnxruntime {result['machine']['onnxruntime']}, "
        f"torch {result['machine']['torch']})"
    )
    for e in result["exports"]:
        w = e["worst_check"]
        print(
            f"  export {e['dtype']:<9} gate on {e['gate_provider']}: {'passed' if e['passed'] else 'FAILED'}; "
            f"worst {w['output']} diff {w['max_abs_diff']:.4g} (tolerance {w['tolerance']:.4g}); greedy "
            f"{e['greedy_rows_identical']}/{e['greedy_rows']} rows identical over {e['greedy_steps']} steps"
        )
    t = result["tests"]
    print(f"  pytest -m gpu: {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, {t.get('skipped', 0)} skipped")
    for p in result["per_token"]:
        print(per_token_line(p))
    for row in result["serving"]:
        g, n = row["cuda_graphs"], row["no_cuda_graphs"]
        print(
            f"  gRPC, {row['concurrency']:>3} streams, float16: {g['median']:,.0f} output tokens/s with CUDA graphs "
            f"({g['min']:,.0f}-{g['max']:,.0f}), {n['median']:,.0f} without ({n['min']:,.0f}-{n['max']:,.0f}): "
            f"{row['cuda_graphs_speedup']:.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-seconds", type=int, default=60, help="training budget on the GPU (default: 60)")
    p.add_argument("--checkpoint", type=Path, help="export this checkpoint instead of training one")
    p.add_argument("--work", type=Path, default=Path("gpu-check"), help="where runs and models go (default: gpu-check)")
    p.add_argument("--concurrency", default="1,16,64", help="gRPC streams (default: 1,16,64)")
    p.add_argument("--new-tokens", type=int, default=256, help="greedy tokens per request (default: 256)")
    p.add_argument("--repeats", type=int, default=3, help="rounds; medians (default: 3)")
    p.add_argument("--skip-tests", action="store_true", help="only the exports and the figures")
    p.add_argument("--out", type=Path, default=Path("reports/gpu-check.json"))
    args = p.parse_args(argv)
    why = cuda_here()
    if why:
        print(f"gpu-check: no CUDA here ({why}); on a CUDA host it {PLAN}")
        return 0
    stamp = Stamp.start(provider="cuda")
    checkpoint = args.checkpoint or train(args.work / "run", args.train_seconds)
    dirs = {dtype: args.work / f"model-{dtype}" for dtype in ("float16", "bfloat16")}
    result: dict = {"machine": machine(), "exports": [export(checkpoint, d, dtype) for dtype, d in dirs.items()]}
    result["tests"] = {} if args.skip_tests else gpu_tests()
    result["per_token"] = [per_token(d, checkpoint, dtype, args.new_tokens, args.repeats) for dtype, d in dirs.items()]
    levels = [int(c) for c in args.concurrency.split(",")]
    result["serving"] = serving(dirs["float16"], levels, min(args.new_tokens, 128), args.repeats)
    result["stamp"] = stamp.finish()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_report(args.out, result, title="gpu-check: the CUDA path proven and measured")
    print_table(result)
    print(json.dumps(result))
    failed = result["tests"].get("returncode", 0) != 0 or not all(e["passed"] for e in result["exports"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
