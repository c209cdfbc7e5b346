"""Decode-speed benchmark on CPU, same weights on both sides of every comparison:

  ONNX Runtime with KV cache  vs  PyTorch eager with KV cache     (per-token latency ratio)
  ONNX Runtime with KV cache  vs  ONNX Runtime recomputing all    (at 256 and 512 new tokens)

Greedy generation from a 16-token prompt. Warms up first, then takes the median of --repeats
runs; prints a table, then one JSON object last.

    .venv/bin/python -m benchmarks.decode [--checkpoint runs/small/checkpoint.pt] [--tokens 256,512]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnserve.export.onnx_export import export_checkpoint
from attnserve.model.checkpoint import LanguageModel, build_model, load_checkpoint, save_checkpoint
from attnserve.model.config import preset
from attnserve.model.generate import decode
from attnserve.report_stamp import Stamp, write_report
from attnserve.runtime.ort_decoder import OrtDecoder


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def model_for(checkpoint: str | None, longest: int, workdir: Path) -> tuple[LanguageModel, Path]:
    """The checkpoint's model, or the `small` preset with random weights and a long enough context."""
    if checkpoint:
        model = load_checkpoint(checkpoint)
        if model.config.max_len < longest:
            sys.exit(f"the checkpoint's context ({model.config.max_len}) is shorter than {longest} tokens")
        return model, Path(checkpoint)
    torch.manual_seed(0)
    model = build_model(preset("small", max_len=max(longest, 256))).eval()
    save_checkpoint(workdir / "checkpoint.pt", model)
    return model, workdir / "checkpoint.pt"


def run(checkpoint: str | None, tokens: list[int], prompt_len: int, repeats: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        model, ckpt = model_for(checkpoint, prompt_len + max(tokens), Path(tmp))
        print(f"exporting {model.num_parameters():,}-parameter model (parity gate included) ...", file=sys.stderr)
        export_checkpoint(ckpt, Path(tmp) / "model", parity_steps=16)
        runtime = OrtDecoder(Path(tmp) / "model", threads=threads)
        prompt = [runtime.bos_id, *range(65, 65 + prompt_len - 1)]  # BOS, then ASCII letters' ids
        argmax = lambda logits: logits.argmax(-1)
        rows = []
        for n in tokens:
            print(f"measuring {n} new tokens ...", file=sys.stderr)
            ort_kv = median_seconds(lambda n=n: runtime.greedy([prompt], n), repeats) / n
            torch_kv = median_seconds(lambda n=n: decode(model, [prompt], n, argmax, runtime.pad_id), repeats) / n
            recompute_once = lambda n=n: runtime.greedy([prompt], n, recompute=True)
            recompute = median_seconds(recompute_once, max(1, repeats // 2)) / n
            rows.append(
                {
                    "new_tokens": n,
                    "ort_kv_ms": ort_kv * 1e3,
                    "torch_kv_ms": torch_kv * 1e3,
                    "ort_recompute_ms": recompute * 1e3,
                    "ort_vs_torch": torch_kv / ort_kv,
                    "kv_vs_recompute": recompute / ort_kv,
                }
            )
    return {
        "benchmark": "decode",
        "prompt_tokens": prompt_len,
        "threads": threads,
        "repeats": repeats,
        "parameters": model.num_parameters(),
        "config": model.config.to_dict(),
        "rows": rows,
    }


def print_table(result: dict) -> None:
    print(
        f"{'new tokens':>10} {'ORT+KV ms/tok':>14} {'torch+KV ms/tok':>16} {'ORT recompute':>14} "
        f"{'ORT vs torch':>13} {'KV vs recompute':>16}"
    )
    for r in result["rows"]:
        print(
            f"{r['new_tokens']:>10} {r['ort_kv_ms']:>14.3f} {r['torch_kv_ms']:>16.3f} {r['ort_recompute_ms']:>14.3f} "
            f"{r['ort_vs_torch']:>12.2f}x {r['kv_vs_recompute']:>15.2f}x"
        )


def plot(result: dict, path: str) -> None:
    """Per-token latency of the three ways of decoding against the number of new tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = [r["new_tokens"] for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for key, label in [
        ("ort_kv_ms", "ONNX Runtime + KV cache"),
        ("torch_kv_ms", "PyTorch eager + KV cache"),
        ("ort_recompute_ms", "ONNX Runtime, recomputing"),
    ]:
        ax.plot(tokens, [r[key] for r in result["rows"]], marker="o", label=label)
    ax.set_xlabel("new tokens (16-token prompt)")
    ax.set_ylabel("ms per token (median)")
    ax.set_yscale("log")
    ax.set_title(f"Greedy decoding, {result['parameters']:,} parameters, {result['threads']} thread(s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=None, help="default: the small preset with random weights")
    p.add_argument("--tokens", default="256,512", help="comma-separated numbers of new tokens")
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--threads", type=int, default=1, help="intra-op threads on both sides (1: least per-op overhead at batch 1)"
    )
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--plot", default=None, help="write a PNG of latency against new tokens")
    args = p.parse_args()
    stamp = Stamp.start(provider="cpu")
    result = run(
        args.checkpoint, [int(t) for t in args.tokens.split(",")], args.prompt_tokens, args.repeats, args.threads
    )
    result["stamp"] = stamp.finish()
    print_table(result)
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(result, args.plot)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_report(args.out, result, args.plot, "Decode speed: ONNX Runtime vs PyTorch, KV cache vs recomputing")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
