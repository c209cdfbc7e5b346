"""The size ladder on a CUDA host (issue 44, item 4): GPT-2 small's shape (124M parameters, random
weights, as `make sizes` builds it) in float16 and int4 on ONNX Runtime's CUDA provider, served
tokens/s through gRPC at 1, 16 and 64 streams against the decode step's own ceiling at that batch.

  build    the rung's checkpoint (size_ladder.checkpoint: a transformers config, random weights,
           `attnserve import`), `attnserve export --dtype float16` (its gate on CUDA), and int4: that
           float16 graph's weights in 4-bit blocks (MatMulNBits, GatherBlockQuantized for the
           embedding; float16 activations and scales). `attnserve export --quantize int4` quantizes a
           float32 graph, whose float32 arena never runs on CUDA, so the CUDA int4 is made here, ungated
  placed   each export's nodes as ONNX Runtime's profile places them over a prefill and decode steps:
           Memcpy nodes, and the ops on the CPU provider
  ceiling  the decode step alone at batch B, as the server runs it (open_slot_runner: CUDA graphs, one
           greedy id a row back): B prompts prefilled, then --steps steps; B x 1000 / ms tokens/s
  served   `attnserve serve --provider cuda` (in process, CUDA graphs on) through gRPC at S streams, greedy,
           2 x S requests of --new-tokens a round (gpu_check.serving); tokens/s counts the tokens that
           came, with the median run's time to first token and inter-token latency percentiles, and
           its share of the step's ceiling. --ignore-eos makes every request run to length (greedy with
           EOS banned decodes in the greedy bursts: a row is read only at a step whose argmax is EOS).
           --modes: the servers measured side by side (cuda_graphs: the defaults, which leave run-ahead
           off on a GPU; run_ahead_on: --run-ahead on; wait_16: --max-waiting-steps 16; no_cuda_graphs),
           each after the first as its ratio to the first, round by round ("2nd/1st": the second's)
  kinds    float16 only: each of --kinds (sampled, logprobs ...) at --kinds-streams on the first mode's
           server, against its greedy in the same rounds
  eager    float16 only: ms per token at 1 stream, ONNX Runtime vs PyTorch eager CUDA on the same
           weights (gpu_check.per_token)

The ceiling's and the served sides alternate in rounds; medians with min and max. The batch-1 bound
from bandwidth is each export's weight bytes a token over a device-to-device copy's rate (bytes read
and written). Prints one table last and writes the JSON to --out. Without CUDA, --provider cpu runs
build, ceiling and served on the CPU (a smoke test of the script, not a figure).

    python -m benchmarks.gpu_ladder [--rung gpt2-124m] [--streams 1,16,64,256] [--new-tokens 128]
        [--steps 128] [--repeats 3] [--modes cuda_graphs,wait_16,run_ahead_on]
        [--kinds top_p,top_k,logprobs,repetition,ignore_eos] [--kinds-streams 64] [--exports float16,int4]
        [--work runs/gpu-ladder] [--out reports/gpu-ladder.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from attnserve.report_stamp import Stamp, write_report
from attnserve.runtime import contract
from benchmarks.gpu_check import MODES, cuda_here, machine, per_token, per_token_line, say, serving, spread
from benchmarks.import_sizes import CLI, timed
from benchmarks.size_ladder import checkpoint

PROMPT_TOKENS = 16
# the request kinds of the sampler issue (benchmarks/sampling_kinds.py's), as GenerateRequest fields
KINDS: dict[str, dict[str, Any]] = {
    "top_p": {"temperature": 0.8, "top_p": 0.95},
    "top_k": {"temperature": 1.0, "top_k": 50},
    "logprobs": {"logprobs": 5},
    "repetition": {"temperature": 0.7, "repetition_penalty": 1.1},
    "ignore_eos": {"ignore_eos": True},
}


def float16_export(ckpt: Path, out: Path) -> Path:
    if not (out / contract.MANIFEST_FILE).is_file():
        say(f"attnserve export --dtype float16 -> {out}")
        timed([*CLI, "export", str(ckpt), "--out", str(out), "--dtype", "float16"])
    return out


def int4_of(float16_dir: Path, out: Path) -> Path:
    """The float16 export with its weights in 4-bit blocks (our int4 quantizer on the float16 graph),
    its manifest marked int4 and its files' sha256 renewed. Not gated: measured for speed."""
    from attnserve.export.quantize import INT4_DEFAULTS, quantize

    if (out / contract.MANIFEST_FILE).is_file():
        return out
    say(f"int4 blocks of {INT4_DEFAULTS.block_size} on the float16 graph -> {out}")
    staging = out.with_name(out.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(float16_dir, staging)
    quantize("int4", float16_dir / contract.MODEL_FILE, staging / contract.MODEL_FILE, INT4_DEFAULTS)
    manifest = contract.read_manifest(float16_dir)
    manifest = contract.with_files(staging, replace(manifest, quantization="int4"), list(manifest.files))
    contract.write_manifest(staging, manifest)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staging, out)
    return out


def placed(model_dir: Path, provider: str, work: Path) -> dict:
    """ONNX Runtime's profile of a prefill and 8 decode steps: Memcpy nodes, and ops on the CPU."""
    import onnxruntime as ort

    from attnserve.runtime.arena import device_of
    from attnserve.runtime.arena_decoder import ArenaDecoder
    from attnserve.runtime.ort_session import CPU, CUDA, new_cuda_stream, session_options

    options = session_options(1)
    options.enable_profiling = True
    options.profile_file_prefix = str(work / f"profile-{model_dir.name}")
    providers: list = [CPU]
    if provider == "cuda":  # on a stream of ours, as create_session opens it, so the arena is on the device
        providers = [(CUDA, {"device_id": "0", "user_compute_stream": str(new_cuda_stream())}), CPU]
    session = ort.InferenceSession(str(model_dir / contract.MODEL_FILE), options, providers=providers)
    decoder = ArenaDecoder(session, contract.read_manifest(model_dir), 2, 64, device_of(session))
    tokens = decoder.prefill(0, [list(range(100, 100 + PROMPT_TOKENS))] * 2).argmax(-1)
    for _ in range(8):
        tokens = decoder.decode_greedy(tokens)
    events = json.loads(Path(session.end_profiling()).read_text())
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    ops = {e["args"].get("op_name", "") for e in nodes}
    on_cpu = {e["args"].get("op_name", "") for e in nodes if e["args"].get("provider") == "CPUExecutionProvider"}
    return {
        "memcpy_nodes": sorted({e["name"] for e in nodes if "Memcpy" in e["name"]}),
        "ops_on_cpu": sorted(on_cpu) if provider == "cuda" else [],
        "providers": session.get_providers(),
        "quantized_ops": sorted(ops & {"MatMulNBits", "GatherBlockQuantized"}),
    }


def ceiling_side(model_dir: Path, provider: str, batch: int):
    """A timed run of the decode step alone at `batch` (the server's arena runner, its CUDA graphs):
    () -> (ms per step, the first row's tokens)."""
    from attnserve.runtime.model_sessions import ModelSessions
    from attnserve.runtime.opening import open_slot_runner

    decoder = open_slot_runner(ModelSessions(model_dir, provider, 1), batch, batch * PROMPT_TOKENS).decoder
    prompts = [list(range(100 + i, 100 + i + PROMPT_TOKENS)) for i in range(batch)]

    def run(steps: int) -> tuple[float, list[int]]:
        for slot in range(batch):
            decoder.clear(slot)
        tokens = decoder.prefill(0, prompts).argmax(-1)
        out = [tokens]
        start = time.perf_counter()
        for _ in range(steps):
            tokens = decoder.decode_greedy(tokens)
            out.append(tokens)
        return 1000 * (time.perf_counter() - start) / steps, [int(t[0]) for t in out]

    return run


def ceiling(model_dir: Path, provider: str, batches: list[int], steps: int, repeats: int) -> list[dict]:
    """Milliseconds per decode step at each batch, rounds alternating over the batches' arenas."""
    runs = {b: ceiling_side(model_dir, provider, b) for b in batches}
    for run in runs.values():
        run(8)  # warm-up: the graph of each batch size is captured here
    times: dict[int, list[float]] = {b: [] for b in batches}
    first: dict[int, list[int]] = {}
    for r in range(repeats):
        for b in batches[:: 1 if r % 2 == 0 else -1]:
            ms, first[b] = runs[b](steps)
            times[b].append(ms)
    rows = []
    for b in batches:
        ms = spread(times[b])
        rows.append({"batch": b, "ms_per_step": ms, "tokens_per_s": 1000 * b / ms["median"], "first_row": first[b]})
        say(f"{model_dir.name}: decode step at batch {b}: {ms['median']:.3f} ms, {rows[-1]['tokens_per_s']:,.0f} tok/s")
    return rows


def copy_bandwidth() -> float:
    """Bytes a second a device-to-device copy moves on CUDA (read plus written), the best of 10."""
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    best = 0.0
    for _ in range(11):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = max(best, 2 * src.numel() / (time.perf_counter() - start))
    return best


def smoke() -> int:
    """onnxruntime-gpu loads and runs a float16 MatMul, LayerNorm and Softmax on CUDA, with no CPU fallback."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    f16 = TensorProto.FLOAT16
    nodes = [
        helper.make_node("MatMul", ["x", "x"], ["y"]),
        helper.make_node("LayerNormalization", ["y", "g", "g"], ["z"], axis=-1),
        helper.make_node("Softmax", ["z"], ["out"], axis=-1),
    ]
    g = helper.make_tensor("g", f16, [64], np.ones(64, np.float16).tobytes(), raw=True)
    graph = helper.make_graph(
        nodes, "smoke", [helper.make_tensor_value_info("x", f16, [64, 64])],
        [helper.make_tensor_value_info("out", f16, [64, 64])], [g],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CUDAExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float16) / 8
    got = session.run(None, {"x": x})[0].astype(np.float32)
    y = x.astype(np.float32) @ x.astype(np.float32)
    z = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5) + 1
    want = np.exp(z - z.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    error = float(np.abs(got - want).max())
    facts = f"onnxruntime {ort.__version__} on {session.get_providers()}, onnx {onnx.__version__}"
    print(f"smoke: {facts}: largest difference {error:.2g}")
    return 0 if error < 1e-2 else 1


def measure(name: str, model_dir: Path, args, bandwidth: float | None) -> dict:
    from benchmarks.bandwidth import weight_bytes_per_token

    weights = weight_bytes_per_token(model_dir)
    row: dict = {"export": name, "dir": str(model_dir), "weight_mb_per_token": round(weights / 1e6, 1)}
    if bandwidth:
        row["bandwidth_tokens_per_s_batch1"] = bandwidth / 2 / weights  # the copy counted bytes twice
    row["placed"] = placed(model_dir, args.provider, args.work)
    say(f"{name}: {row['placed']}")
    row["ceiling"] = ceiling(model_dir, args.provider, args.streams, args.steps, args.repeats)
    modes = tuple(args.modes)
    row["served"] = serving(
        model_dir, args.streams, args.new_tokens, args.repeats, modes, args.provider, args.ignore_eos
    )
    for ceil, served in zip(row["ceiling"], row["served"]):
        served["share_of_ceiling"] = served[modes[0]]["median"] / ceil["tokens_per_s"]
        served["shares_of_ceiling"] = {m: served[m]["median"] / ceil["tokens_per_s"] for m in modes}
    if name == "float16" and args.kinds:
        kinds = {kind: KINDS[kind] for kind in args.kinds}
        (row["kinds"],) = serving(
            model_dir,
            [args.kinds_streams],
            args.new_tokens,
            args.repeats,
            modes[:1],
            args.provider,
            args.ignore_eos,
            kinds,
        )
    return row


def attempt(name: str, run, *args):
    """run(*args), or the error that stopped it as a row (the other export's figures still count)."""
    try:
        return run(*args)
    except Exception as e:  # noqa: BLE001 - reported in the table and the JSON
        say(f"{name}: {type(e).__name__}: {e}")
        return {"export": name, "dtype": name, "error": f"{type(e).__name__}: {str(e)[:2000]}"}


def print_table(result: dict) -> None:
    m = result["machine"]
    print(
        f"gpu-ladder: {result['rung']} ({result['parameters']:,} parameters) on {m.get('gpu', m['cpu_cores'])} "
        f"(onnxruntime {m['onnxruntime']}, torch {m['torch']}); tokens/s, median (min-max) of {result['repeats']}"
    )
    print(
        f"{'export':<8} {'B/S':>4} {'step ms':>20} {'step ceiling':>12} {'served':>24} {'share':>6} "
        f"{'2nd/1st':>9} {'TTFT p50':>9} {'ITL p50':>8} {'ITL p99':>8}"
    )
    for row in [r for r in result["exports"] if "error" not in r]:
        first = result["modes"][0]
        for ceil, served in zip(row["ceiling"], row["served"]):
            ms, s, late = ceil["ms_per_step"], served[first], served["latency"][first]
            second: dict = next(iter(served.get("vs_first", {}).values()), {})
            ratio = second.get("median")
            print(
                f"{row['export']:<8} {ceil['batch']:>4} {ms['median']:>7.3f} ({ms['min']:.3f}-{ms['max']:.3f}) "
                f"{ceil['tokens_per_s']:>12,.0f} {s['median']:>9,.0f} ({s['min']:,.0f}-{s['max']:,.0f}) "
                f"{served['share_of_ceiling']:>6.0%} {f'{ratio:.2f}x' if ratio else '-':>9} "
                f"{late['ttft_ms']['p50']:>9.1f} {late['itl_ms']['p50']:>8.2f} {late['itl_ms']['p99']:>8.2f}"
            )
        for mode in result["modes"][1:]:
            ratios = [(served["concurrency"], served["vs_first"][mode]) for served in row["served"]]
            print(
                f"  {row['export']} {mode} / {first}: "
                + ", ".join(f"{s} streams {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})" for s, r in ratios)
            )
        if "kinds" in row:
            got = row["kinds"]["kinds"]
            print(
                f"  {row['export']} at {row['kinds']['concurrency']} streams, each kind / greedy: "
                + ", ".join(f"{kind} {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})" for kind, r in got.items())
            )
    for row in result["exports"] + result.get("per_token", []):
        if "error" in row:
            print(f"  {row['export']}: FAILED: {row['error'][:300]}")
    for row in [r for r in result["exports"] if "error" not in r]:
        bound = row.get("bandwidth_tokens_per_s_batch1")
        p = row["placed"]
        print(
            f"  {row['export']}: {row['weight_mb_per_token']} MB of weights a token"
            + (f", bandwidth bound at batch 1 {bound:,.0f} tok/s" if bound else "")
            + f"; Memcpy nodes {p['memcpy_nodes'] or 'none'}; ops on the CPU {p['ops_on_cpu'] or 'none'}"
        )
    for p in [r for r in result.get("per_token", []) if "error" not in r]:
        print(per_token_line(p))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rung", default="gpt2-124m", help="a size_ladder SIZES name (default: gpt2-124m)")
    p.add_argument("--streams", default="1,16,64,256", help="streams served, and the decode step's batch sizes")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens per served request (default: 128)")
    p.add_argument("--steps", type=int, default=128, help="decode steps a ceiling round (default: 128)")
    p.add_argument("--repeats", type=int, default=3, help="rounds; medians (default: 3)")
    p.add_argument("--provider", default="cuda", help="cpu: a smoke test of the script")
    p.add_argument("--work", type=Path, default=Path("runs/gpu-ladder"), help="checkpoints and exports go here")
    p.add_argument("--out", type=Path, default=Path("reports/gpu-ladder.json"))
    p.add_argument("--ignore-eos", action="store_true", help="served requests mask EOS (every one runs to length)")
    p.add_argument(
        "--modes", default="cuda_graphs,wait_16,run_ahead_on", help=f"servers side by side, of: {', '.join(MODES)}"
    )
    p.add_argument("--kinds", default=",".join(KINDS), help=f"request kinds at --kinds-streams, of: {', '.join(KINDS)}")
    p.add_argument("--kinds-streams", type=int, default=64, help="streams the kinds are served at (default: 64)")
    p.add_argument("--exports", default="float16,int4", help="which exports to measure: float16, int4 or both")
    p.add_argument("--smoke", action="store_true", help="only check that onnxruntime runs on CUDA (seconds)")
    p.add_argument("--plot-from", type=Path, help="only draw a JSON this wrote (beside it, as .png)")
    args = p.parse_args(argv)
    if args.smoke:
        return smoke()
    if args.plot_from:
        write_plot(json.loads(args.plot_from.read_text()), args.plot_from.with_suffix(".png"))
        return 0
    args.streams = [int(s) for s in args.streams.split(",")]
    args.modes, args.exports = args.modes.split(","), args.exports.split(",")
    args.kinds = [k for k in args.kinds.split(",") if k]
    for flag, given, known in (("--modes", args.modes, MODES), ("--kinds", args.kinds, KINDS)):
        if unknown := [g for g in given if g not in known]:
            p.error(f"{flag}: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    if not set(args.exports) <= {"float16", "int4"}:
        p.error(f"--exports: float16, int4 or both, not {','.join(args.exports)}")
    if args.provider == "cuda" and (why := cuda_here()):
        print(f"gpu-ladder: no CUDA here ({why}); --provider cpu runs a smoke test")
        return 0
    stamp = Stamp.start(provider=args.provider)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rung = checkpoint(args.rung, args.work, 0)
    fp16 = float16_export(rung.checkpoint, args.work / "models" / f"{args.rung}-float16")
    int4 = (
        attempt("int4", int4_of, fp16, args.work / "models" / f"{args.rung}-int4") if "int4" in args.exports else None
    )
    cuda = args.provider == "cuda"
    bandwidth = copy_bandwidth() if cuda else None
    result: dict = {"rung": args.rung, "parameters": count(rung.checkpoint), "machine": host(cuda)}
    settings = (
        "streams",
        "new_tokens",
        "steps",
        "repeats",
        "provider",
        "ignore_eos",
        "modes",
        "kinds",
        "kinds_streams",
    )
    result.update({k: getattr(args, k) for k in settings})
    result["copy_bandwidth_gb_per_s"] = bandwidth and bandwidth / 1e9
    result["exports"] = []
    for name, model_dir in [(n, d) for n, d in (("float16", fp16), ("int4", int4)) if n in args.exports]:
        made = isinstance(model_dir, Path)  # or the error that stopped it
        result["exports"].append(attempt(name, measure, name, model_dir, args, bandwidth) if made else model_dir)
        args.out.with_suffix(".partial.json").write_text(json.dumps(result))  # what a timeout leaves
    if cuda:
        eager = attempt("float16", per_token, fp16, rung.checkpoint, "float16", 2 * args.new_tokens, args.repeats)
        result["per_token"] = [eager]
    result["stamp"] = stamp.finish()
    write_report(args.out, result, title="The size ladder on a GPU: served tokens/s against the decode step's ceiling")
    write_plot(result, args.out.with_suffix(".png"))
    print_table(result)
    return 0


def write_plot(result: dict, path: Path) -> None:
    """Per export, tokens/s against streams: the decode step's ceiling and each mode's served median,
    round-to-round min and max as error bars; the kinds' ratios to greedy in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["exports"] if "error" not in r]
    fig, axes = plt.subplots(1, len(rows), figsize=(6.5 * len(rows), 4.4), squeeze=False)
    for ax, row in zip(axes[0], rows):
        streams = [c["batch"] for c in row["ceiling"]]
        ax.plot(streams, [c["tokens_per_s"] for c in row["ceiling"]], "k--", marker="o", label="decode step's ceiling")
        for i, mode in enumerate(result["modes"]):
            got = [s[mode] for s in row["served"]]
            medians = [g["median"] for g in got]
            errors = [[m - g["min"] for m, g in zip(medians, got)], [g["max"] - m for m, g in zip(medians, got)]]
            ax.errorbar(streams, medians, yerr=errors, marker="o", capsize=3, color=f"C{i}", label=f"served, {mode}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("streams (batch)")
        ax.set_ylabel("tokens/s")
        kinds = row.get("kinds", {}).get("kinds", {})
        said = ", ".join(f"{k} {r['median']:.2f}x" for k, r in kinds.items())
        title = f"{result['rung']} {row['export']} on {result['machine'].get('gpu', result['provider'])}"
        ax.set_title(
            title + (f"\nat {row['kinds']['concurrency']} streams, / greedy: {said}" if said else ""), fontsize=8
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def count(ckpt: Path) -> int:
    from benchmarks.size_ladder import count_parameters

    return count_parameters(ckpt)


def host(cuda: bool) -> dict:
    if cuda:
        return machine()
    import platform

    import onnxruntime as ort

    return {"cpu_cores": os.cpu_count(), "python": platform.python_version(), "onnxruntime": ort.__version__,
            "torch": "-"}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
