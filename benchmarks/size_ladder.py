"""The size ladder (issue 44): models from the lectures' `small` to GPT-2 small's and SmolLM-135M's
shapes, each exported in float32, int8 and int4, decoded side by side by attnserve served through
gRPC, the plain loop over attnserve's arena driver, onnxruntime-genai on the same directory, PyTorch
eager on the same weights and CTranslate2 on the same weights converted, at 1, 16 and 64 streams.

Rungs (made once under --work, reused after): `small` is `attnserve train --preset small` for
--train-budget seconds; the others are Hugging Face checkpoints made from configs with random weights
(benchmarks/hf_checkpoints.py SIZES: gpt2-30m, gpt2-124m, smollm-135m), `attnserve import`ed. Each is
exported with `attnserve export` (its gate passing) plain, `--quantize int8` and `--quantize int4`;
the Hugging Face ones are converted for CTranslate2 with ct2-transformers-converter (float32; its int8
is quantized as it loads).

Every side decodes the same kind of work: at S streams, S prompts of --prompt-tokens ids, exactly
--new-tokens greedy tokens each (attnserve bench --ignore-eos for the served side; the others force a
minimum length); tokens/s is S x new tokens over the whole time, prefill included. The sampled column
is the served side's server sent what production sends instead, at the same length (`attnserve bench
--mix production`: 70% temperature 0.7 with top_p 0.9, 20% greedy, 10% greedy with 5 logprobs). Time to first
token is the same prompts with one new token (the served side: `attnserve bench`'s p50). The sides
without a server run in processes of their own (benchmarks/ladder_sides.py) that keep their model
loaded; all use --threads intra-op threads. Rounds alternate the sides (the order flips every round);
medians with min and max. onnxruntime-genai decodes static batches of at most 32 (its limit with
this export), so 64 streams are two batches one after the other. PyTorch runs the float32 rows only;
CTranslate2 float32 and int8 (it has no int4 on CPUs) of the Hugging Face rungs. RSS: the peak of the
side's process (the served side: the server's processes' resident set after the level). After each
rung, the machine's read bandwidth over each export's weight bytes a token is its batch-1 limit
(bandwidth.py), and every side's batch-1 share of it is reported. Prints a table and the issue's
checks, then one JSON object last.

    python -m benchmarks.size_ladder [--rungs small,gpt2-30m,gpt2-124m,smollm-135m]
        [--quantizations float32,int8,int4] [--sides served,sampled,plain,genai,torch,ct2] [--streams 1,16,64]
        [--new-tokens 64] [--repeats 3] [--threads 2] [--work runs/ladder]
        [--out reports/size-ladder.json] [--plot reports/size-ladder.png]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attnserve.report_stamp import Stamp
from benchmarks.bandwidth import read_bandwidth, weight_bytes_per_token
from benchmarks.engine_core import GENAI_MAX_BATCH, genai_prompts
from benchmarks.hf_checkpoints import SIZES, save_hf
from benchmarks.import_sizes import CLI, timed
from benchmarks.kv import GENAI_PYTHON, ROOT
from benchmarks.loadtest.server_process import ServerProcess
from benchmarks.serving import alternating, progress, report, spread

RUNGS = ("small", "gpt2-30m", "gpt2-124m", "smollm-135m")
QUANTIZATIONS = ("float32", "int8", "int4")
SIDES = ("served", "sampled", "plain", "genai", "torch", "ct2")
SAMPLED = ("--ignore-eos", "--mix", "production")  # the sampled column's requests: what production sends
SERVER_SIDES = {"served", "sampled"}  # one server each row, both measured on it
TITLE = "The size ladder: attnserve, onnxruntime-genai, PyTorch and CTranslate2 from 1M to 135M parameters"
CT2_CONVERTER = Path(sys.executable).parent / "ct2-transformers-converter"


@dataclass
class Rung:
    """One model size: its checkpoint (and Hugging Face directory), its exports, its CTranslate2 copy."""

    name: str
    checkpoint: Path
    hf: Path | None = None
    exports: dict[str, Path] = field(default_factory=dict)
    ct2: Path | None = None
    parameters: int = 0


def checkpoint(name: str, work: Path, train_budget: int) -> Rung:
    """The rung's checkpoint (and Hugging Face directory), made once (kept under `work`)."""
    run = work / "runs" / name
    if name == "small":
        rung = Rung(name, run / "checkpoint.pt")
        if not rung.checkpoint.is_file():
            progress(f"{name}: attnserve train --preset small, {train_budget} s")
            timed([*CLI, "train", "--preset", "small", "--time-budget", str(train_budget), "--out", str(run)])
        return rung
    family, config, vocab = SIZES[name]
    hf = work / "hf" / name
    rung = Rung(name, run / "checkpoint.pt", hf=hf)
    if not (hf / "config.json").is_file():
        save_hf(hf, family, vocab_size=vocab, draw_all=False, **config)
    if not rung.checkpoint.is_file():
        progress(f"{name}: attnserve import")
        timed([*CLI, "import", str(hf), "--out", str(run), "--steps", "16"])
    return rung


def build(name: str, work: Path, quantizations: list[str], train_budget: int) -> Rung:
    """The rung's checkpoint, exports and CTranslate2 copy, each made once (kept under `work`)."""
    rung = checkpoint(name, work, train_budget)
    if rung.hf is not None:
        rung.ct2 = ct2 = work / "ct2" / name
        if not (ct2 / "model.bin").is_file():
            progress(f"{name}: ct2-transformers-converter")
            timed([str(CT2_CONVERTER), "--model", str(rung.hf), "--output_dir", str(ct2), "--force"])
    for quantization in quantizations:
        out = work / "models" / f"{name}-{quantization}"
        if not (out / "attnserve.json").is_file():
            progress(f"{name}: attnserve export {quantization}")
            flags = [] if quantization == "float32" else ["--quantize", quantization]
            timed([*CLI, "export", str(rung.checkpoint), "--out", str(out), *flags])
        rung.exports[quantization] = out
    rung.parameters = count_parameters(rung.checkpoint)
    return rung


def count_parameters(checkpoint: Path) -> int:
    """The model's parameters, a tied embedding counted once."""
    from attnserve.model.checkpoint import load_checkpoint

    return sum(p.numel() for p in load_checkpoint(checkpoint).parameters())


class Worker:
    """A ladder_sides process of one side, its model loaded, answering a batch at a time."""

    def __init__(self, side: str, model: Path, threads: int, compute_type: str = "float32"):
        python = str(GENAI_PYTHON) if side == "genai" else sys.executable
        command = [python, "-m", "benchmarks.ladder_sides", side, "--model", str(model), "--threads", str(threads)]
        self.side = side
        self.proc = subprocess.Popen(
            [*command, "--compute-type", compute_type],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"},
        )
        self.ask_line()  # {"ready": true}

    def ask_line(self, request: dict | None = None) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if request is not None:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.side} side exited ({self.proc.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the {self.side} side: {answer['error']}")
        return answer

    def run(self, prompts: list[list[int]], new_tokens: int) -> dict:
        """Decode the prompts (genai: in batches of at most GENAI_MAX_BATCH, one after the other)."""
        step = GENAI_MAX_BATCH if self.side == "genai" else len(prompts)
        answers = [
            self.ask_line({"prompts": prompts[i : i + step], "new_tokens": new_tokens})
            for i in range(0, len(prompts), step)
        ]
        return {
            "seconds": sum(a["seconds"] for a in answers),
            "tokens": answers[0]["tokens"],
            "rss_bytes": max(a["rss_bytes"] for a in answers),
        }

    def measure(self, prompts: list[list[int]], new_tokens: int) -> dict:
        first = self.run(prompts, 1)
        done = self.run(prompts, new_tokens)
        return {
            "tokens_per_s": len(prompts) * new_tokens / done["seconds"],
            "ttft_ms": 1000 * first["seconds"],
            "rss_bytes": done["rss_bytes"],
            "tokens": done["tokens"],
        }

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


class Served:
    """`attnserve serve` on the export, driven by `attnserve bench` from a process of its own."""

    side = "served"

    def __init__(
        self,
        model: Path,
        threads: int,
        max_streams: int,
        new_tokens: int,
        *flags: str,
        tree: str | None = None,
        provider: str = "cpu",
    ):
        """The server with `threads` intra-op threads, room for `max_streams` and `new_tokens`, and
        any other `attnserve serve` flags; `tree`: the checkout it runs from (default: this one)."""
        fixed = ["--provider", provider, "--threads", str(threads), "--max-batch", str(max_streams)]
        fixed += ["--max-queue", str(4 * max_streams), "--max-new-tokens-cap", str(new_tokens)]
        self.server = ServerProcess(str(Path(model).resolve()), *fixed, *flags, cwd=tree)

    def measure(
        self, prompts: list[list[int]], new_tokens: int, kind: Sequence[str] = ("--ignore-eos",), waves: int = 1
    ) -> dict:
        """`attnserve bench`: one stream per prompt (its length; bench draws its own ids), all at once,
        each request of the `kind` bench's flags say (default: fixed length, greedy); each stream sends
        `waves` requests, one after another."""
        streams, requests = str(len(prompts)), str(len(prompts) * waves)
        command = [*CLI, "bench", "--target", self.server.target, "--concurrency", streams, "--requests", requests]
        command += ["--prompt-tokens", str(len(prompts[0])), "--max-new-tokens", str(new_tokens), *kind]
        done = subprocess.run([*command, "--warmup", "1"], capture_output=True, text=True, timeout=1800, check=True)
        (level,) = json.loads(done.stdout.strip().splitlines()[-1])["levels"]
        if level["completed"] != level["requests"]:
            raise RuntimeError(f"served: {level['requests'] - level['completed']} of {streams} requests failed")
        return {
            "tokens_per_s": level["output_tokens_per_s"],
            "ttft_ms": level["ttft_ms"]["p50"],
            "rss_bytes": self.server.tree_rss_bytes(),
        }

    def close(self) -> None:
        self.server.stop()


class Sampled:
    """The sampled column: the served side's server, sent the production mix (attnserve bench --mix
    production: 70% temperature 0.7 with top_p 0.9, 20% greedy, 10% greedy with 5 logprobs) at the same
    fixed length, so that greedy's column has what production sends beside it."""

    side = "sampled"

    def __init__(self, served: Served):
        self.served = served

    def measure(self, prompts: list[list[int]], new_tokens: int) -> dict:
        return self.served.measure(prompts, new_tokens, SAMPLED)

    def close(self) -> None:
        self.served.close()


Side = Worker | Served | Sampled


def open_sides(rung: Rung, quantization: str, args) -> dict[str, Side]:
    """The sides that run this row: torch on float32 only, ct2 on float32 and int8 of the Hugging Face
    rungs, genai where .venv-genai exists."""
    model = rung.exports[quantization]
    sides: dict[str, Side] = {}
    served = Served(model, args.threads, max(args.streams), args.new_tokens) if SERVER_SIDES & {*args.sides} else None
    for side in args.sides:
        if side == "served" and served is not None:
            sides[side] = served
        elif side == "sampled" and served is not None:
            sides[side] = Sampled(served)
        elif side == "plain" or (side == "genai" and GENAI_PYTHON.exists()):
            sides[side] = Worker(side, model, args.threads)
        elif side == "torch" and quantization == "float32":
            sides[side] = Worker(side, rung.hf or rung.checkpoint, args.threads)
        elif side == "ct2" and rung.ct2 is not None and quantization in ("float32", "int8"):
            sides[side] = Worker(side, rung.ct2, args.threads, compute_type=quantization)
    return sides


def measure_row(rung: Rung, quantization: str, args) -> list[dict]:
    """Every side at every stream count of one (rung, quantization), the sides alternating in rounds."""
    sides = open_sides(rung, quantization, args)
    rows = []
    try:
        for streams in args.streams:
            prompts = genai_prompts(str(rung.exports[quantization]), streams, args.prompt_tokens)
            for opened in sides.values():  # warm-up, at the full width (the plain loop's arena is made here)
                opened.measure(prompts, 4)
            runs: dict[str, list[dict]] = {side: [] for side in sides}
            label = f"{rung.name} {quantization}, {streams} streams"
            for side in alternating(list(sides), args.repeats, label):
                runs[side].append(sides[side].measure(prompts, args.new_tokens))
            rows += [row(rung, quantization, streams, side, runs[side], runs.get("plain")) for side in sides]
    finally:
        for opened in sides.values():
            opened.close()
    return rows


def row(rung: Rung, quantization: str, streams: int, side: str, runs: list[dict], plain: list[dict] | None) -> dict:
    """One table row: a side's medians (min, max) at one stream count, its peak RSS, and whether its
    first sequence's tokens were the plain loop's (None where the side returns no tokens)."""
    rate, ttft = spread([r["tokens_per_s"] for r in runs]), spread([r["ttft_ms"] for r in runs])
    same = None
    if plain and "tokens" in runs[0]:
        same = all(r["tokens"] == p["tokens"] for r, p in zip(runs, plain))
    return {
        "rung": rung.name,
        "parameters": rung.parameters,
        "quantization": quantization,
        "streams": streams,
        "side": side,
        "tokens_per_s": round(rate["median"], 1),
        "tokens_per_s_min": round(rate["min"], 1),
        "tokens_per_s_max": round(rate["max"], 1),
        "ttft_ms": round(ttft["median"], 1),
        "rss_mib": round(max(r["rss_bytes"] for r in runs) / 2**20),
        "same_tokens_as_plain": same,
    }


def limits(rung: Rung, rows: list[dict], bandwidth_mib: int, threads: int) -> list[dict]:
    """Per export: its weight bytes a token and batch-1 limit at the bandwidth measured now; every
    batch-1 row gets its share of the limit of its quantization."""
    bandwidth = read_bandwidth(threads=max(2, threads), mib=bandwidth_mib)
    out = []
    for quantization, model in rung.exports.items():
        size = weight_bytes_per_token(model)
        limit = bandwidth / size
        out.append(
            {
                "rung": rung.name,
                "quantization": quantization,
                "read_gb_per_s": round(bandwidth / 1e9, 2),
                "weight_mb_per_token": round(size / 1e6, 1),
                "tokens_per_s_limit": round(limit, 1),
            }
        )
        for r in rows:
            if r["rung"] == rung.name and r["quantization"] == quantization and r["streams"] == 1:
                r["share_of_limit"] = round(r["tokens_per_s"] / limit, 3)
    return out


def lookup(rows: list[dict], rung: str, where: tuple) -> float | None:
    """A figure of one row: where = (quantization, streams, side[, key]), key tokens_per_s by default."""
    quantization, streams, side, key = (*where, "tokens_per_s")[:4]
    for r in rows:
        if (r["rung"], r["quantization"], r["streams"], r["side"]) == (rung, quantization, streams, side):
            return r.get(key)
    return None


# The goals at ~90-125M parameters: (what, the figure, what it is divided by or None, its bound).
CHECKS = [
    ("int4 / float32 at 1 stream (plain loop)", ("int4", 1, "plain"), ("float32", 1, "plain"), 3.0),
    ("int4's share of the bandwidth limit at 1 stream (plain loop)", ("int4", 1, "plain", "share_of_limit"), None, 0.6),
    ("int4 / int8 at 16 streams (plain loop)", ("int4", 16, "plain"), ("int8", 16, "plain"), 1.0),
    ("int4 served / plain loop at 1 stream", ("int4", 1, "served"), ("int4", 1, "plain"), 0.95),
    ("int4 served / genai at 1 stream", ("int4", 1, "served"), ("int4", 1, "genai"), 1.0),
    ("int4 served / genai at 16 streams", ("int4", 16, "served"), ("int4", 16, "genai"), 1.0),
    ("int8 production mix / greedy served at 16 streams", ("int8", 16, "sampled"), ("int8", 16, "served"), 0.9),
]
BIG_RUNGS = ("gpt2-124m", "smollm-135m")


def checks(rows: list[dict]) -> list[dict]:
    """Each goal of CHECKS on each ~90-125M rung measured: the figure, its bound, whether it is met."""
    out = []
    for rung in BIG_RUNGS:
        for name, figure, over, goal in CHECKS:
            value, base = lookup(rows, rung, figure), lookup(rows, rung, over) if over else 1.0
            if value is not None and base:
                value = round(value / base, 3)
                out.append({"rung": rung, "check": name, "value": value, "goal": f">= {goal}", "met": value >= goal})
    return out


def print_table(result: dict) -> None:
    print(
        f"{'rung':<12} {'quant':<7} {'streams':>7} {'side':<7} {'tokens/s (min-max)':>26} {'TTFT ms':>9} "
        f"{'RSS MiB':>8} {'limit share':>11} same"
    )
    for r in result["rows"]:
        share = f"{r['share_of_limit']:.0%}" if "share_of_limit" in r else ""
        span = f"{r['tokens_per_s']:,.1f} ({r['tokens_per_s_min']:,.1f}-{r['tokens_per_s_max']:,.1f})"
        print(
            f"{r['rung']:<12} {r['quantization']:<7} {r['streams']:>7} {r['side']:<7} {span:>26} "
            f"{r['ttft_ms']:>9,.1f} {r['rss_mib']:>8,} {share:>11} {r['same_tokens_as_plain']}"
        )
    for limit in result["limits"]:
        print(
            f"{limit['rung']} {limit['quantization']}: {limit['weight_mb_per_token']:,.1f} MB a token at "
            f"{limit['read_gb_per_s']} GB/s: at most {limit['tokens_per_s_limit']:,.1f} tokens/s at 1 stream"
        )
    for check in result["checks"]:
        print(
            f"{check['rung']}: {check['check']}: {check['value']} (goal {check['goal']}): "
            f"{'met' if check['met'] else 'NOT met'}"
        )


def write_plot(result: dict, path: str) -> None:
    """One panel per (rung, quantization): tokens/s against streams, a line per side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rungs = list(dict.fromkeys(r["rung"] for r in result["rows"]))
    quantizations = list(dict.fromkeys(r["quantization"] for r in result["rows"]))
    fig, axes = plt.subplots(
        len(rungs), len(quantizations), figsize=(4 * len(quantizations), 3 * len(rungs)), squeeze=False
    )
    for i, rung in enumerate(rungs):
        for j, quantization in enumerate(quantizations):
            ax = axes[i][j]
            mine = [r for r in result["rows"] if r["rung"] == rung and r["quantization"] == quantization]
            for side in SIDES:
                points = [(r["streams"], r["tokens_per_s"]) for r in mine if r["side"] == side]
                if points:
                    ax.plot(*zip(*points), marker="o", label=side, color=f"C{SIDES.index(side)}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{rung} {quantization}", fontsize=9)
            ax.set_xlabel("streams", fontsize=8)
            ax.set_ylabel("tokens/s", fontsize=8)
            ax.legend(fontsize=7)
    fig.suptitle(f"size ladder: greedy decode tokens/s, {result['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rungs", default=",".join(RUNGS), help=f"comma-separated, of {', '.join(RUNGS)}")
    p.add_argument("--quantizations", default=",".join(QUANTIZATIONS), help="comma-separated exports")
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated, of " + ", ".join(SIDES))
    p.add_argument(
        "--streams", default="1,16,64", help="comma-separated streams (a batch for the sides without a server)"
    )
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt ids per stream")
    p.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per stream")
    p.add_argument("--repeats", type=int, default=3, help="rounds, the sides alternating; medians reported")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of every side")
    p.add_argument("--train-budget", type=int, default=60, help="seconds of training for the small rung")
    p.add_argument("--bandwidth-mib", type=int, default=1024, help="MiB read to measure read bandwidth")
    p.add_argument("--work", type=Path, default=Path("runs/ladder"), help="where checkpoints and exports go")
    p.add_argument("--out", help="write the JSON result (and its Markdown report) here")
    p.add_argument("--plot", help="write a PNG here")
    args = p.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    args.streams = [int(s) for s in args.streams.split(",")]
    quantizations = args.quantizations.split(",")
    stamp = Stamp.start(provider="cpu")
    rows: list[dict] = []
    bounds: list[dict] = []
    for name in args.rungs.split(","):
        rung = build(name, args.work, quantizations, args.train_budget)
        mine = [r for quantization in quantizations for r in measure_row(rung, quantization, args)]
        bounds += limits(rung, mine, args.bandwidth_mib, args.threads)
        rows += mine
    settings = {k: getattr(args, k) for k in ("sides", "streams", "prompt_tokens", "new_tokens", "repeats", "threads")}
    result = {**settings, "rows": rows, "limits": bounds, "checks": checks(rows)}
    report(result, stamp, args.out, args.plot, print_table, write_plot, title=TITLE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
