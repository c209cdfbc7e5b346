"""The batched logits pass alone, two checkouts against each other: one LogitsPass.run over R rows of
V random logits shaped like a model's (a few likely ids over a long tail; `top_p_flat`: no likely ids,
as a model with random weights has), per request kind; with --host, the host's pick of the same rows
too (engine/sampling.py's pick_row, row by row, in side b's process).

Each side runs in a process of its own with its checkout first on sys.path (so two versions of the
pass compare on one machine), one intra-op thread each by default, spinning off as served. Each
round runs both sides (the order flips every round); each side times --calls runs after a warm-up
and reports the fastest of five such batches. Reports each side's median microseconds per run with
min and max and b/a per round, and how many rows each side picked (the rest go to the host); then
one JSON object last. Torch-free.

    python -m benchmarks.pass_speed --tree-a DIR [--tree-b DIR] [--vocab 50257] [--rows 1,16]
        [--threads 1] [--repeats 5] [--kinds top_k,top_p,...] [--host] [--out F.json]
    python -m benchmarks.pass_speed --dispatch [--vocab 50257] [--threads 1]

--dispatch measures what nodes appended to the model's graph would save against what they would cost
(docs/design/decisions/logits-pass.md): a session run's own cost (a one-node graph through the same
IO-binding calls as the pass) and the narrow pass over one row, in this checkout.

A before/after of a change: `git worktree add /tmp/before COMMIT`, then `--tree-a /tmp/before`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from attnserve.report_stamp import Stamp
from benchmarks.serving import spread

HERE = Path(__file__).resolve().parent.parent
# each kind's PassRow fields (temperature, top_k, top_p, min_p, uniform, bias, top)
KINDS = {
    "top_k": (1.0, 50, 1.0, 0.0, 0.4, (), 0),
    "top_p": (0.8, 0, 0.95, 0.0, 0.4, (), 0),
    "top_p_flat": (0.8, 0, 0.95, 0.0, 0.4, (), 0),
    "logprobs": (0.0, 0, 1.0, 0.0, 0.0, (), 5),
    "ignore_eos": (0.0, 0, 1.0, 0.0, 0.0, ((0, float("-inf")),), 0),
}
TIMING = """
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from attnserve.engine.seam import PassRow
from attnserve.runtime.arena import Device
from attnserve.runtime.logits_pass import LogitsPass
vocab, rows, threads, calls, kind = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
fields = json.loads(sys.argv[7])
fields[5] = tuple(tuple(pair) for pair in fields[5])
host = sys.argv[8] == "host"
rng = np.random.default_rng(0)
flat = kind.endswith("_flat")
logits = rng.normal(0, 0.5 if flat else 1, (rows, 1, vocab)).astype(np.float32)
for row in range(rows if not flat else 0):
    logits[row, 0, rng.integers(0, vocab, 20)] += rng.uniform(6, 12)
plan = [PassRow(*fields)] * rows
p = LogitsPass("float32", Device(), threads=threads, mode="on")
def best_of(run):
    for _ in range(3):
        run()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best
picks = p.run(logits, list(range(rows)), plan)
out = {"us": best_of(lambda: p.run(logits, list(range(rows)), plan)), "picked": sum(x is not None for x in picks)}
if host:
    from attnserve.engine.sampling import pick_row
    out["host_us"] = best_of(lambda: [pick_row(logits[row, 0], plan[row]) for row in range(rows)])
print(json.dumps(out))
"""


def timed(tree: str, vocab: int, rows: int, threads: int, calls: int, kind: str, host: bool = False) -> dict:
    """One side's run in a process of its own: microseconds per call, rows picked (and with `host`, the
    host's microseconds for the same rows)."""
    argv = [tree, str(vocab), str(rows), str(threads), str(calls), kind, json.dumps(KINDS[kind]), "host" * host]
    out = subprocess.run([sys.executable, "-c", TIMING, *argv], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def dispatch(vocab: int, threads: int) -> dict:
    """Median microseconds of a one-node graph's run through IO binding (what a second session run costs
    beyond its work) and of the narrow pass over one row of `vocab` ids (top-k 50), 300 runs each."""
    import tempfile
    import time

    import numpy as np
    from onnx import TensorProto, helper

    from attnserve.engine.seam import PassRow
    from attnserve.runtime.arena import Device
    from attnserve.runtime.logits_pass import NARROW, LogitsPass
    from attnserve.runtime.ort_session import create_session

    column = lambda name: helper.make_tensor_value_info(name, TensorProto.INT64, ["R"])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "one_node", [column("x")], [column("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    with tempfile.NamedTemporaryFile(suffix=".onnx") as file:
        file.write(model.SerializeToString())
        file.flush()
        session = create_session(Path(file.name), "cpu", threads, 0)

    def one_node() -> None:
        binding = session.io_binding()
        binding.bind_cpu_input("x", np.zeros(16, np.int64))
        binding.bind_output("y", "cpu")
        session.run_with_iobinding(binding)
        binding.get_outputs()[0].numpy()

    logits = np.random.default_rng(0).normal(0, 1, (1, 1, vocab)).astype(np.float32)
    narrow = LogitsPass("float32", Device(), threads=threads, mode="on")
    row = [PassRow(1.0, 50, 1.0, 0.0, 0.3)]

    def median_us(call) -> float:
        for _ in range(20):
            call()
        times = []
        for _ in range(300):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return float(np.median(times) * 1e6)

    return {
        "one_node_run_us": median_us(one_node),
        "narrow_one_row_us": median_us(lambda: narrow.run_width(NARROW, logits, [0], row)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree-a", help="side a's checkout, e.g. a git worktree of the commit before")
    p.add_argument("--tree-b", default=str(HERE), help="side b's checkout (default: this one)")
    p.add_argument("--vocab", type=int, default=50257, help="ids per row")
    p.add_argument("--rows", default="1,16", help="comma-separated rows per run")
    p.add_argument("--threads", type=int, default=1, help="the pass's intra-op threads")
    p.add_argument("--calls", type=int, default=30, help="runs per timed batch")
    p.add_argument("--repeats", type=int, default=5, help="rounds, the sides alternating; medians reported")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--host", action="store_true", help="time the host's pick of the same rows too, in side b")
    p.add_argument("--dispatch", action="store_true", help="measure a session run's own cost instead (see above)")
    p.add_argument("--out", help="write the JSON result here")
    args = p.parse_args(argv)
    if args.dispatch:
        print(json.dumps({"vocab": args.vocab, "threads": args.threads, **dispatch(args.vocab, args.threads)}))
        return 0
    if not args.tree_a:
        p.error("--tree-a is required (or --dispatch)")
    stamp = Stamp.start(provider="cpu")
    trees = {"a": str(Path(args.tree_a).resolve()), "b": str(Path(args.tree_b).resolve())}
    results = []
    for rows in [int(r) for r in args.rows.split(",")]:
        for kind in args.kinds.split(","):
            runs: dict[str, list[dict]] = {"a": [], "b": []}
            for round_ in range(args.repeats):
                for side in "ab" if round_ % 2 == 0 else "ba":
                    host = args.host and side == "b"
                    runs[side].append(timed(trees[side], args.vocab, rows, args.threads, args.calls, kind, host))
            us = {side: [run["us"] for run in runs[side]] for side in runs}
            row = {
                "rows": rows,
                "kind": kind,
                "us": {side: spread(values) for side, values in us.items()},
                "picked": {side: runs[side][-1]["picked"] for side in runs},
                "b_over_a": spread([b / a for a, b in zip(us["a"], us["b"])]),
            }
            if args.host:
                host_us = [run["host_us"] for run in runs["b"]]
                row["host_us"] = spread(host_us)
                row["b_over_host"] = spread([b / h for b, h in zip(us["b"], host_us)])
            results.append(row)
            a, b, r, picked = row["us"]["a"], row["us"]["b"], row["b_over_a"], row["picked"]
            host_text = f"  host {row['host_us']['median']:>7,.0f} us" if args.host else ""
            print(
                f"{rows:>3} rows {kind:<10} a {a['median']:>7,.0f} us  b {b['median']:>7,.0f} us  "
                f"b/a {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})  picked a {picked['a']} b {picked['b']}"
                f"{host_text}",
                flush=True,
            )
    settings = {"trees": trees, "vocab": args.vocab, "threads": args.threads, "calls": args.calls}
    result = {
        "title": "The batched logits pass alone, two checkouts",
        "stamp": stamp.finish(),
        "settings": settings,
        "results": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
