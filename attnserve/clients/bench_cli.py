"""`attnserve bench` on the command line: its flags (most from BenchConfig's fields), the config
built back from them and checked before anything is sent, and the outputs (table, JSON, PNG).

What a run does is in bench.py; statistics, table and plot in bench_report.py; the stamp and the
Markdown report beside --out in attnserve/report_stamp.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..flags import add_field_flags, check_output
from ..report_stamp import Stamp, write_report
from .bench import ATTNSERVE, DEFAULT_URL, OPENAI, PROG, BenchConfig, run_bench
from .bench_mix import SAMPLING
from .bench_report import format_table, write_plot
from .channel import DEFAULT_TARGET
from .cli_common import (
    add_client_flags,
    add_stream_interval_flags,
    check_client_flags,
    fail,
    interrupted,
    parse_numbers,
    tls_from_args,
    token_from_args,
)
from .errors import AttnserveError
from .http_events import Endpoint, HttpError
from .types import GenerationParams


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`attnserve bench`'s flags; the defaults are BenchConfig's."""
    p.description = (
        "Warm up, then a closed-loop concurrency sweep (and open-loop Poisson arrivals with --rate) over "
        "streamed requests; throughput in output tokens/s and bytes/s (the fair figure across tokenizers). "
        "Progress goes to stderr; the table, then the JSON report as one line (always last), to stdout."
    )
    levels = ",".join(map(str, BenchConfig.concurrency))
    p.add_argument(
        "--concurrency",
        default=None,
        help=f"comma-separated requests in flight per level (default: {levels}; none with --rate alone)",
    )
    p.add_argument("--rate", default=None, help="comma-separated open-loop request rates per second (Poisson)")
    add_field_flags(p, BenchConfig, only=("backend", "endpoint", "model"))
    add_field_flags(p, BenchConfig, only=("connections", "requests", "prompt_tokens"))
    prompts = p.add_mutually_exclusive_group()
    prompts.add_argument(
        "--prompt-ids",
        dest="prompt_ids",
        action="store_true",
        default=None,
        help="the default with --backend attnserve: prompts as token ids, drawn (from --seed) from the "
        "vocabulary less BOS/EOS/PAD, so every tokenizer gets exactly --prompt-tokens",
    )
    prompts.add_argument(
        "--prompt-text",
        dest="prompt_ids",
        action="store_false",
        help="prompts as ASCII text cut from one English passage (exact lengths with the byte tokenizer only); "
        "the default with --backend openai",
    )
    add_field_flags(p, BenchConfig, only=("max_new_tokens", "ignore_eos", "warmup", "seed", "trace"))
    add_field_flags(p, GenerationParams, only=SAMPLING)
    add_field_flags(p, BenchConfig, only=("mix",))
    add_stream_interval_flags(p)
    p.add_argument("--out", default=None, help="write the JSON report to this file")
    p.add_argument("--plot", default=None, help="write throughput and latency plots to this PNG")
    add_client_flags(p, timeout=BenchConfig.timeout)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """BenchConfig from the command line: without --concurrency, 1,4,16 unless --rate is given."""
    rates = parse_numbers(args.rate, float, "--rate")
    concurrency = parse_numbers(args.concurrency, int, "--concurrency")
    if args.concurrency is None:
        concurrency = () if rates else BenchConfig.concurrency
    given = {
        f.name: getattr(args, f.name) for f in fields(BenchConfig) if f.name not in ("concurrency", "rates", "sampling")
    }
    if args.prompt_ids is None:  # neither --prompt-ids nor --prompt-text: token ids where the server has them
        given["prompt_ids"] = args.backend == ATTNSERVE
    defaults = {f.name: f.default for f in fields(GenerationParams)}
    sampling = tuple((name, getattr(args, name)) for name in SAMPLING if getattr(args, name) != defaults[name])
    config = BenchConfig(**given, concurrency=concurrency, rates=rates, sampling=sampling)
    config.check()
    return config


def check_plotting(path: str) -> None:
    """--plot needs matplotlib, which a client-only install lacks, and a file type it writes: say so
    before the run, not after it."""
    try:
        import matplotlib  # noqa: F401  (the package itself: its submodules may be imported already)
        from matplotlib.figure import Figure

        kinds = Figure().canvas.get_supported_filetypes()
    except ImportError:
        raise ValueError("--plot needs matplotlib (pip install matplotlib), which is not installed") from None
    kind = Path(path).suffix.lstrip(".").lower()
    if kind not in kinds:
        raise ValueError(f"--plot {path}: matplotlib writes {', '.join(sorted(kinds))} files, not {kind or 'none'}")


def write_outputs(report: dict[str, Any], out: str | None, plot: str | None) -> None:
    """The table, the files asked for (the PNG first, for the Markdown report to show), and the JSON
    report as the last line of stdout."""
    print(format_table(report["levels"]), flush=True)
    title = f"{PROG}: {report['model']['model_name']} at {report['target']}"
    for path, write in (
        (plot, lambda p: write_plot(report, p)),
        (out, lambda p: write_report(p, report, plot, title)),
    ):
        if path:
            written = write(path)
            print(f"[{PROG}] wrote {path}" + (f" and {written}" if written else ""), file=sys.stderr)
    print(json.dumps(report), flush=True)


def check_url(args: argparse.Namespace) -> None:
    """--backend openai's --target: a URL (DEFAULT_URL when --target is not given); ValueError naming it."""
    if args.target == DEFAULT_TARGET:
        args.target = DEFAULT_URL
    try:
        endpoint = Endpoint.parse(args.target)
    except ValueError as e:
        raise ValueError(f"--target {args.target} (--backend openai): {e}") from None
    tls = next((flag for flag in ("tls_ca", "tls_cert", "tls_server_name") if getattr(args, flag)), None)
    if tls and not endpoint.secure:
        raise ValueError(f"--{tls.replace('_', '-')} needs an https:// --target, not {args.target}")


def main(args: argparse.Namespace) -> int:
    """CLI entry of `attnserve bench`: 0, or 1 if no request succeeded (or the run failed)."""
    try:
        if args.backend == OPENAI:
            check_url(args)
        check_client_flags(args, targets=args.backend == ATTNSERVE)
        config = config_from_args(args)
        check_output("--out", args.out)
        check_output("--plot", args.plot)
        if args.plot:
            check_plotting(args.plot)
        stamp = Stamp.start()
        report = asyncio.run(run_bench(config, tls_from_args(args), token_from_args(args)))
        stamp.provider = report["model"]["execution_provider"]
        report["stamp"] = stamp.finish()
        write_outputs(report, args.out, args.plot)
    except KeyboardInterrupt:
        return interrupted(PROG)
    except HttpError as error:  # as gRPC's: a request to fix exits 2, a server that failed it 1
        print(f"{PROG}: error: {error}", file=sys.stderr, flush=True)
        return 2 if 400 <= error.status < 500 else 1
    except (AttnserveError, OSError, ValueError) as error:  # OSError, ValueError: files, flags
        return fail(PROG, error)
    return 0 if any(level["completed"] for level in report["levels"]) else 1
