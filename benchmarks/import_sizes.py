"""Hugging Face checkpoints at real sizes, made from configs with random weights (GPT-2 small's config,
124M parameters; SmolLM-135M's, a Llama with grouped KV heads), then `attnserve import`, `attnserve
export`, `attnserve serve` and `attnserve bench` on each, every step timed as a whole command: what a
user's first run with a model of that size costs on this machine.

    python -m benchmarks.import_sizes --work runs/sizes --out reports/import-sizes.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from attnserve.report_stamp import Stamp, write_report
from benchmarks.hf_checkpoints import SIZES, save_hf
from benchmarks.tokenizer_serving import start

CLI = [sys.executable, "-m", "attnserve.cli"]


def timed(argv: list[str]) -> float:
    """Seconds a command took; RuntimeError with its stderr's tail if it failed."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return round(time.perf_counter() - start, 1)


def served(model: Path, work: Path, levels: str, requests: int, new_tokens: int) -> dict:
    """Start `attnserve serve` (tokenizer_serving's start: port 0, ready once it says where it listens),
    run `attnserve bench`, stop it."""
    begun = time.perf_counter()
    server, port = start(str(model))
    try:
        ready = round(time.perf_counter() - begun, 1)
        out = work / f"{model.name}-bench.json"
        bench = [*CLI, "bench", "--target", f"127.0.0.1:{port}", "--concurrency", levels, "--requests", str(requests)]
        timed([*bench, "--max-new-tokens", str(new_tokens), "--out", str(out)])
    finally:
        server.terminate()
        server.wait(60)
    report = json.loads(out.read_text())
    rows = [
        {
            "concurrency": level["concurrency"],
            "output_tokens_per_s": level["output_tokens_per_s"],
            "tpot_ms_p50": level["tpot_ms"]["p50"],
            "ttft_ms_p50": level["ttft_ms"]["p50"],
        }
        for level in report["levels"]
    ]
    return {"ready_s": ready, "levels": rows}


def one_size(name: str, work: Path, steps: int, levels: str, requests: int, new_tokens: int) -> dict:
    family, config, vocab = SIZES[name]
    hf, run, model = work / "hf" / name, work / "runs" / name, work / "models" / name
    start = time.perf_counter()
    if not (hf / "config.json").is_file():
        save_hf(hf, family, vocab_size=vocab, draw_all=False, **config)
    row: dict = {"size": name, "family": family, "make_s": round(time.perf_counter() - start, 1)}
    row["import_s"] = timed([*CLI, "import", str(hf), "--out", str(run), "--steps", str(steps)])
    proof = json.loads((run / "import.json").read_text())
    row.update(parameters=proof["parameters"], logits_max_abs_diff=proof["logits"]["max_abs_diff"])
    row["export_s"] = timed([*CLI, "export", str(run / "checkpoint.pt"), "--out", str(model)])  # its gate passed
    row["serve"] = served(model, work, levels, requests, new_tokens)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("runs/sizes"), help="where checkpoints and models go")
    p.add_argument("--sizes", default="gpt2-124m,smollm-135m", help=f"comma-separated, of {', '.join(SIZES)}")
    p.add_argument("--steps", type=int, default=64, help="the import proof's greedy steps per prompt")
    p.add_argument("--concurrency", default="1,4", help="attnserve bench's levels")
    p.add_argument("--requests", type=int, default=8, help="requests per level")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("reports/import-sizes.json"))
    args = p.parse_args(argv)
    stamp = Stamp.start(provider="cpu")
    rows = [
        one_size(name, args.work, args.steps, args.concurrency, args.requests, args.max_new_tokens)
        for name in args.sizes.split(",")
    ]
    result = {"sizes": rows, "stamp": stamp.finish()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_report(args.out, result, title="Hugging Face checkpoints at real sizes: import, export, serve")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
