"""Decode steps replayed as CUDA graphs (ONNX Runtime's enable_cuda_graph) against the server's own
decode steps, on one float16 arena directory, at fixed batch sizes (issue 23, step 5: try it).

  now     ArenaDecoder.decode, as `attnserve serve` runs it: the mask is (B, longest + 1) wide and
          logits are bound to host memory
  static  the same session and arena, every input and output at one address with one shape on
          every step: the mask as wide as the context (GroupQueryAttention reads each row's length
          from it; total_sequence_length becomes the context), logits in device memory copied to
          the host after the run
  graph   `static` on a second session of the same graph with enable_cuda_graph: each batch size's
          first steps are captured (gpu_graph_id = B), the rest replayed as one launch

All three decode greedily from the same prompts, prefilled by the plain session into one arena;
the tokens must agree. Sides alternate in rounds; medians with min and max, milliseconds per step.
CUDA only; prints a table and one JSON object last.

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

from attnserve.runtime import contract
from attnserve.runtime.arena import device_of
from attnserve.runtime.arena_decoder import ArenaDecoder
from attnserve.runtime.ort_session import CPU, CUDA, HOST_DTYPES, create_session, session_options, to_float32

PROMPT_TOKENS = 16


def graph_session(path: str, stream: int) -> ort.InferenceSession:
    """The graph on CUDA with enable_cuda_graph, computing on `stream` (the plain session's)."""
    options = {"device_id": "0", "user_compute_stream": str(stream), "enable_cuda_graph": "1"}
    return ort.InferenceSession(path, session_options(1), providers=[(CUDA, options), CPU])


class StaticSteps:
    """Decode steps over slots [0, B) of `decoder`'s arena with every binding fixed: what a CUDA graph needs."""

    def __init__(self, session: ort.InferenceSession, decoder: ArenaDecoder, batch: int, graph: bool):
        self.session, self.decoder, self.batch = session, decoder, batch
        self.device, v = decoder.device, decoder.vocab_size
        self.host = HOST_DTYPES[decoder.dtype]
        self.logits = self.device.allocate((batch, 1, v), decoder.arena.dtype)
        self.nbytes = batch * v * np.dtype(self.host).itemsize
        self.binding = session.io_binding()
        decoder.arena.bind(self.binding, 0, batch)
        self.binding.bind_output(
            contract.LOGITS, self.device.kind, 0, decoder.arena.dtype, [batch, 1, v], self.logits.data_ptr()
        )
        self.options = ort.RunOptions()
        self.options.add_run_config_entry("gpu_graph_id", str(batch) if graph else "-1")

    def step(self, tokens: np.ndarray) -> np.ndarray:
        d, b = self.decoder, self.batch
        held = d.arena.lengths[:b]
        mask = (np.arange(d.context)[None, :] <= held[:, None]).astype(np.int64)  # (B, L): one shape always
        d.inputs.bind(self.binding, contract.INPUT_IDS, tokens.reshape(b, 1))
        d.inputs.bind(self.binding, contract.ATTENTION_MASK, mask)
        d.inputs.bind(self.binding, contract.POSITION_IDS, held.reshape(b, 1))
        self.session.run_with_iobinding(self.binding, self.options)
        d.arena.lengths[:b] += 1
        raw = self.device.download(self.logits.data_ptr(), self.nbytes).view(self.host)
        return to_float32(raw.reshape(b, -1), d.dtype)


def decode(decoder: ArenaDecoder, step, prompts: list[list[int]], steps: int) -> tuple[float, list[list[int]]]:
    """Prefill, then `steps` greedy steps through `step`; (ms per step, tokens)."""
    decoder.arena.lengths[:] = 0
    logits = decoder.prefill(0, prompts)
    out = []
    start = time.perf_counter()
    for _ in range(steps):
        tokens = logits.argmax(-1)
        out.append(tokens)
        logits = step(tokens)
    ms = 1000 * (time.perf_counter() - start) / steps
    return ms, np.stack(out, 1).tolist()


def measure(model_dir: str, batch: int, steps: int, repeats: int, provider: str = "cuda") -> dict:
    manifest = contract.read_manifest(model_dir)
    path = str(Path(model_dir) / contract.MODEL_FILE)
    plain = create_session(path, provider, 1)
    decoder = ArenaDecoder(plain, manifest, batch, PROMPT_TOKENS * batch, device_of(plain))
    sides = {"now": decoder.decode, "static": StaticSteps(plain, decoder, batch, graph=False).step}
    row: dict = {"batch": batch}
    try:
        sides["graph"] = StaticSteps(graph_session(path, decoder.device.stream), decoder, batch, graph=True).step
    except Exception as e:  # noqa: BLE001 - what ONNX Runtime says CUDA graphs need is the finding
        row["graph_error"] = f"{type(e).__name__}: {e}"
    prompts = [list(range(100 + i, 100 + i + PROMPT_TOKENS)) for i in range(batch)]
    times: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, list] = {}
    for name in list(sides):  # warm-up (and the graphs' capture)
        try:
            decode(decoder, sides[name], prompts, 8)
        except Exception as e:  # noqa: BLE001
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            del sides[name], times[name]
    for r in range(repeats):
        for name in list(sides)[:: 1 if r % 2 == 0 else -1]:
            ms, tokens[name] = decode(decoder, sides[name], prompts, steps)
            times[name].append(ms)
    row["ms_per_step"] = {n: {"median": statistics.median(t), "min": min(t), "max": max(t)} for n, t in times.items()}
    row["tokens_agree_with_now"] = {n: t == tokens["now"] for n, t in tokens.items()}
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
    rows = [measure(args.model, int(b), args.steps, args.repeats, args.provider) for b in args.batch.split(",")]
    for row in rows:
        cells = ", ".join(
            f"{n} {t['median']:.3f} ms ({t['min']:.3f}-{t['max']:.3f})" for n, t in row["ms_per_step"].items()
        )
        print(f"batch {row['batch']:>3}: {cells}; tokens agree {row['tokens_agree_with_now']}")
        for key in [k for k in row if k.endswith("error")]:
            print(f"  {key}: {row[key]}")
    result = {"model": args.model, "steps": args.steps, "repeats": args.repeats, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
