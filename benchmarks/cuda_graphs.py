"""Decode steps replayed as CUDA graphs (ONNX Runtime's enable_cuda_graph) against the server's own
decode steps, on one float16 arena directory, at fixed batch sizes (issue 23, step 5: try it).

  now     ArenaDecoder.decode, as `attnserve serve` runs it: the mask is (B, longest + 1) wide and
          logits are bound to host memory
  static  the server's steps under CUDA graphs (runtime/fixed_steps.py) on the same plain session:
          every input and output at one address with one shape on every step, the mask as wide as
          the context, logits in device memory read back after the run, but nothing to replay
  graph   the same on a second session of the graph with enable_cuda_graph (`attnserve serve`'s
          default on CUDA): each batch size's first steps are captured, the rest replayed

Each side has its own arena, prefilled by the plain session; all decode greedily from the same
prompts and the tokens must agree; then each side is fed `now`'s tokens and its logits compared.
Sides alternate in rounds; medians with min and max, milliseconds per step. CUDA (--provider cpu
runs the first two sides, a smoke test); prints a table and one JSON object last.

    python -m benchmarks.cuda_graphs --model DIR [--batch 1,16,64] [--steps 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from attnserve.report_stamp import Stamp, write_report
from attnserve.runtime import contract
from attnserve.runtime.arena import device_of
from attnserve.runtime.arena_decoder import ArenaDecoder
from attnserve.runtime.ort_session import create_session

PROMPT_TOKENS = 16


def graph_session(path: str, stream: int) -> ort.InferenceSession:
    """The graph on CUDA with enable_cuda_graph, computing on `stream` (the plain session's)."""
    return create_session(path, "cuda", 1, stream, cuda_graph=True)


def decode(decoder: ArenaDecoder, prompts: list[list[int]], steps: int) -> tuple[float, list[list[int]]]:
    """Prefill, then `steps` greedy steps; (ms per step, tokens)."""
    decoder.arena.lengths[:] = 0
    logits = decoder.prefill(0, prompts)
    out = []
    start = time.perf_counter()
    for _ in range(steps):
        tokens = logits.argmax(-1)
        out.append(tokens)
        logits = decoder.decode(tokens)
    ms = 1000 * (time.perf_counter() - start) / steps
    return ms, np.stack(out, 1).tolist()


def forced(decoder: ArenaDecoder, prompts: list[list[int]], tokens: np.ndarray) -> list[np.ndarray]:
    """Each step's logits (B, V) when every side is fed the same tokens (B, steps)."""
    decoder.arena.lengths[:] = 0
    logits = [decoder.prefill(0, prompts)]
    for s in range(tokens.shape[1] - 1):
        logits.append(np.array(decoder.decode(tokens[:, s]), copy=True))
    return logits


def differences(sides: dict[str, ArenaDecoder], prompts: list[list[int]], tokens: list) -> dict:
    """Teacher-forced on `now`'s tokens: each side's largest logit difference from `now`, and the
    steps where its argmax differs, with `now`'s top-2 margin there (a near-tie, or a real change)."""
    fed = np.array(tokens)
    reference = forced(sides["now"], prompts, fed)
    out = {}
    for name in [n for n in sides if n != "now"]:
        got = forced(sides[name], prompts, fed)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(reference, got))
        flips = []
        for s, (a, b) in enumerate(zip(reference, got)):
            for row in np.flatnonzero(a.argmax(-1) != b.argmax(-1)):
                top = np.sort(a[row])[-2:]
                flips.append({"step": s, "row": int(row), "margin": float(top[1] - top[0])})
        out[name] = {"max_abs_logit_diff": diff, "argmax_flips": flips[:8], "flip_count": len(flips)}
    return out


def measure(model_dir: str, batch: int, steps: int, repeats: int, provider: str = "cuda") -> dict:
    manifest = contract.read_manifest(model_dir)
    path = str(Path(model_dir) / contract.MODEL_FILE)
    plain = create_session(path, provider, 1)
    arena = lambda graphs=None: ArenaDecoder(plain, manifest, batch, PROMPT_TOKENS * batch, device_of(plain), graphs)
    sides = {"now": arena(), "static": arena(plain)}  # fixed steps on the plain session: no graph to replay
    row: dict = {"batch": batch}
    try:
        sides["graph"] = arena(graph_session(path, sides["now"].device.stream))
    except Exception as e:  # noqa: BLE001 - what ONNX Runtime says CUDA graphs need is the finding
        row["graph_error"] = f"{type(e).__name__}: {e}"
    prompts = [list(range(100 + i, 100 + i + PROMPT_TOKENS)) for i in range(batch)]
    times: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, list] = {}
    for name in list(sides):  # warm-up (and the graphs' capture)
        try:
            decode(sides[name], prompts, 8)
        except Exception as e:  # noqa: BLE001
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            del sides[name], times[name]
    for r in range(repeats):
        for name in list(sides)[:: 1 if r % 2 == 0 else -1]:
            ms, tokens[name] = decode(sides[name], prompts, steps)
            times[name].append(ms)
    row["ms_per_step"] = {n: {"median": statistics.median(t), "min": min(t), "max": max(t)} for n, t in times.items()}
    row["tokens_agree_with_now"] = {n: t == tokens["now"] for n, t in tokens.items()}
    row["teacher_forced"] = differences(sides, prompts, tokens["now"])
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a float16 (or bfloat16) arena directory")
    p.add_argument("--batch", default="1,16,64")
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--provider", default="cuda", help="cpu runs the first two sides only (a smoke test)")
    p.add_argument("--out")
    args = p.parse_args(argv)
    stamp = Stamp.start(provider=args.provider)
    rows = [measure(args.model, int(b), args.steps, args.repeats, args.provider) for b in args.batch.split(",")]
    for row in rows:
        cells = ", ".join(
            f"{n} {t['median']:.3f} ms ({t['min']:.3f}-{t['max']:.3f})" for n, t in row["ms_per_step"].items()
        )
        print(f"batch {row['batch']:>3}: {cells}; tokens agree {row['tokens_agree_with_now']}")
        for name, d in row["teacher_forced"].items():
            flips = ", ".join(f"step {f['step']} row {f['row']} margin {f['margin']:.3g}" for f in d["argmax_flips"])
            print(
                f"  {name} vs now, same tokens fed: max logit diff {d['max_abs_logit_diff']:.3g}; "
                f"{d['flip_count']} argmax flips{': ' + flips if flips else ''}"
            )
        for key in [k for k in row if k.endswith("error")]:
            print(f"  {key}: {row[key]}")
    result = {"model": args.model, "steps": args.steps, "repeats": args.repeats, "rows": rows, "stamp": stamp.finish()}
    if args.out:
        write_report(args.out, result, title="Decode steps as CUDA graphs vs launched node by node")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
