"""Where a decode step's time goes: ONNX Runtime's profile of the arena decoder's steps at one batch size,
per kind of node, against the step's wall time and the machine's read bandwidth.

For each model directory: the decode step alone (the arena driver the server runs, greedy, `--threads`
intra-op threads, spinning as the server's `auto` chooses: on for a model of 32 MiB or more), timed
without profiling
(the median of `--steps` steps after a warm-up), then profiled over the same steps. Per kind of node:
how many a step runs and their kernel time a step; the kernels' sum against ONNX Runtime's own run
time and the step's wall time (what is neither is the run's per-node overhead and the Python around
it); and each kind's weight bytes (the initializers its nodes read, from the optimized graph) over its
time, against this machine's read bandwidth measured in the same run (benchmarks/bandwidth.py), for the
MatMuls by a weight, by kind and by shape (K x N).

    python -m benchmarks.step_profile models/gpt2-124m-int4 models/gpt2-124m-int8 --batch 1 \\
        --out docs/reports/batch1-profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from attnserve.report_stamp import Stamp, write_report
from benchmarks.bandwidth import read_bandwidth, tensor_bytes, weight_bytes_per_token

PROMPT_TOKENS = 16


def open_decoder(model_dir: Path, threads: int, batch: int, profile_prefix: str | None = None):
    """The server's arena driver over a session of the directory's graph: `profile_prefix` turns
    ONNX Runtime's profiler on."""
    import onnxruntime as ort

    from attnserve.runtime import contract
    from attnserve.runtime.arena_decoder import ArenaDecoder
    from attnserve.runtime.model_sessions import LARGE_MODEL_BYTES, model_bytes
    from attnserve.runtime.ort_session import CPU, session_options

    options = session_options(threads, spinning=model_bytes(model_dir) >= LARGE_MODEL_BYTES)
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    session = ort.InferenceSession(str(model_dir / contract.MODEL_FILE), options, providers=[CPU])
    manifest = contract.read_manifest(model_dir)
    decoder = ArenaDecoder(session, manifest, batch, batch * PROMPT_TOKENS, logits_pass="off")
    return session, decoder


def run_steps(decoder, batch: int, steps: int) -> list[float]:
    """A prefill of `batch` prompts, then `steps` greedy decode steps (ids back, as the server's greedy
    steps): each step's seconds."""
    prompts = [list(range(100 + i, 100 + i + PROMPT_TOKENS)) for i in range(batch)]
    decoder.arena.lengths[:] = 0  # the slots empty again
    tokens = decoder.prefill(0, prompts).argmax(-1)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        tokens = decoder.decode_greedy(tokens)
        times.append(time.perf_counter() - start)
    return times


MATMULS = ("MatMulNBits", "MatMulIntegerToFloat", "MatMulInteger", "MatMul", "FusedMatMul", "Gemm")


def matmul_bytes(model_dir: Path) -> dict[tuple[int, int], int]:
    """The weight bytes a MatMul by a weight reads, by its shape (K, N), from the directory's graph as
    exported (ONNX Runtime's fusions keep a MatMul's weights and shape: MatMulInteger and its scales
    become MatMulIntegerToFloat)."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(model_dir / "model.onnx")).graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    consumers: dict[str, list] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    out: dict[tuple[int, int], int] = {}
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            out[attrs["K"], attrs["N"]] = sum(tensor_bytes(weights[w]) for w in node.input[1:] if w in weights)
        elif node.op_type in MATMULS and len(node.input) > 1 and node.input[1] in weights:
            weight = weights[node.input[1]]
            # its scales and bias, and a MatMulInteger's: the weights of the nodes that take its output
            after = [w for c in consumers[node.output[0]] for w in c.input] if node.op_type == "MatMulInteger" else []
            names = {name for name in [*node.input[1:], *after] if name in weights}
            k, n = (int(d) for d in weight.dims[-2:])
            out[k, n] = sum(tensor_bytes(weights[name]) for name in names)
    return out


def shape_of(args: dict) -> tuple[int, int] | None:
    """A profiled MatMul's (K, N): its first input's last axis and its output's."""
    inputs, outputs = args.get("input_type_shape") or [], args.get("output_type_shape") or []
    first: list = next(iter(inputs[0].values()), []) if inputs else []
    out: list = next(iter(outputs[0].values()), []) if outputs else []
    return (int(first[-1]), int(out[-1])) if first and out else None


def profile(model_dir: Path, threads: int, batch: int, steps: int, warmup: int) -> dict:
    """One directory's table: per kind of node, and the step's totals."""
    _, decoder = open_decoder(model_dir, threads, batch)
    run_steps(decoder, batch, warmup)
    wall = statistics.median(run_steps(decoder, batch, steps))
    with tempfile.TemporaryDirectory() as work:
        session, decoder = open_decoder(model_dir, threads, batch, str(Path(work) / "profile"))
        run_steps(decoder, batch, warmup + steps)
        events = json.loads(Path(session.end_profiling()).read_text())
    weights = matmul_bytes(model_dir)
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    timed = runs[-steps:]  # the decode steps after the warm-up (the prefill and warm-up runs come first)
    first = timed[0]["ts"]
    kinds: dict[str, dict] = defaultdict(lambda: {"nodes": 0, "us": 0.0, "weight_bytes": 0})
    by_shape: dict[str, dict] = defaultdict(lambda: {"nodes": 0, "us": 0.0, "weight_bytes": 0})
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time") or event["ts"] < first:
            continue
        op = event["args"].get("op_name", "?")
        shape = shape_of(event["args"]) if op in MATMULS else None
        read = weights.get(shape, 0) if shape else 0
        keyed = [(op, kinds)] + ([(f"{op} {shape[0]} x {shape[1]}", by_shape)] if shape and read else [])
        for key, table in keyed:
            table[key]["nodes"] += 1
            table[key]["us"] += event["dur"]
            table[key]["weight_bytes"] += read
    table, matmuls = (per_step(t, steps) for t in (kinds, by_shape))
    kernels = sum(k["us_a_step"] for k in table.values())
    return {
        "model": str(model_dir),
        "kinds": table,
        "matmuls": matmuls,
        "nodes_a_step": sum(k["nodes_a_step"] for k in table.values()),
        "kernel_us_a_step": kernels,
        "run_us_a_step": float(np.median([run["dur"] for run in timed])),
        "wall_us_a_step": wall * 1e6,
        "weight_bytes_a_step": weight_bytes_per_token(model_dir),
    }


def per_step(totals: dict[str, dict], steps: int) -> dict[str, dict]:
    """Totals over `steps` steps, a step's, the most time first; with the weights' read rate."""
    return {
        key: {
            "nodes_a_step": k["nodes"] / steps,
            "us_a_step": k["us"] / steps,
            "weight_bytes_a_step": k["weight_bytes"] / steps,
            "bytes_per_s": k["weight_bytes"] / (k["us"] * 1e-6) if k["weight_bytes"] and k["us"] else None,
        }
        for key, k in sorted(totals.items(), key=lambda item: -item[1]["us"])
    }


def print_table(result: dict) -> None:
    bandwidth = result["read_bytes_per_s"]
    print(f"read bandwidth: {bandwidth / 1e9:.1f} GB/s")
    for model in result["models"]:
        wall, run, kernels = model["wall_us_a_step"], model["run_us_a_step"], model["kernel_us_a_step"]
        limit = model["weight_bytes_a_step"] / bandwidth * 1e6
        print(
            f"\n{model['model']}: a step {wall:.0f} us wall, {run:.0f} us in ONNX Runtime's run, {kernels:.0f} us "
            f"in {model['nodes_a_step']:.0f} kernels; {model['weight_bytes_a_step'] / 1e6:.1f} MB of weights: "
            f"{limit:.0f} us at the bandwidth ({limit / wall:.0%} of the wall)"
        )
        for table in (model["kinds"], model["matmuls"]):
            print("| node | a step | us a step | share of the kernels | weight MB | GB/s | of the bandwidth |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for op, k in table.items():
                rate = k["bytes_per_s"]
                read = f"{rate / 1e9:.1f} | {rate / bandwidth:.0%}" if rate else "- | -"
                print(
                    f"| {op} | {k['nodes_a_step']:.0f} | {k['us_a_step']:.0f} | {k['us_a_step'] / kernels:.1%} | "
                    f"{k['weight_bytes_a_step'] / 1e6:.1f} | {read} |"
                )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", type=Path, help="model directories (decoder-only, arena)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=64, help="decode steps timed and profiled")
    p.add_argument("--warmup", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="JSON (and its Markdown beside it)")
    args = p.parse_args(argv)
    stamp = Stamp.start("CPUExecutionProvider")
    result: dict = {"settings": {k: str(v) for k, v in vars(args).items()}}
    result["read_bytes_per_s"] = read_bandwidth(args.threads)
    result["models"] = [profile(m, args.threads, args.batch, args.steps, args.warmup) for m in args.models]
    result["stamp"] = stamp.finish()
    if args.out:
        write_report(args.out, result, None, "Where a decode step's time goes")
    print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
