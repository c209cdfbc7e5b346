"""Numbers of `attnserve bench`: per-request records -> per-level statistics, table and plot.

Pure Python (no numpy): percentiles interpolate linearly between closest ranks, as numpy's
default does. matplotlib is imported only when a plot is asked for. Knows nothing about gRPC.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """What one streamed request did, timed on the client (seconds, time.perf_counter)."""

    start: float
    end: float = 0.0
    first_token: float | None = None  # arrival of the first message carrying tokens
    itl: list[float] = field(default_factory=list)  # per token after the first message: the
    #                                                  gap since the previous message / its tokens
    tokens: int = 0  # token ids received, counted here
    messages: int = 0  # stream messages that carried tokens (fewer with a stream interval)
    output_bytes: int = 0  # UTF-8 bytes of the text: compare across tokenizers
    reported_tokens: int | None = None  # usage.completion_tokens of the final message
    prompt_tokens: int | None = None  # usage.prompt_tokens, the server's count
    cached_tokens: int | None = None  # of those, the ones its prefix cache served (usage.cached_tokens)
    finish_reason: str = ""
    status: str = "OK"  # gRPC status name of a failed request ("HTTP 400" over HTTP)
    error: str = ""  # a failed request's message
    kind: str = ""  # the request's kind (bench_mix.Kind's name)

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    @property
    def time_per_output_token(self) -> float | None:
        """(end - first token) / (tokens - 1), as vLLM's TPOT: blind to how tokens were chunked."""
        if self.first_token is None or self.tokens < 2:
            return None
        return (self.end - self.first_token) / (self.tokens - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution_ms(seconds: Sequence[float]) -> dict[str, float | None]:
    """Mean and p50/p90/p99 in milliseconds (None where there are no values, for JSON)."""
    if not seconds:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    stats = {"mean": 1000 * sum(seconds) / len(seconds)}
    stats.update({f"p{q}": 1000 * percentile(seconds, q) for q in PERCENTILES})
    return {k: round(v, 3) for k, v in stats.items()}


def summarize_level(
    records: Sequence[RequestRecord], *, mode: str, concurrency: int | None = None, rate: float | None = None
) -> dict[str, Any]:
    """One level's statistics: throughput over its wall time, latency distributions, errors."""
    done = [r for r in records if r.ok]
    duration = (max(r.end for r in records) - min(r.start for r in records)) if records else 0.0
    tokens = sum(r.tokens for r in done)
    output_bytes = sum(r.output_bytes for r in done)
    per_second = lambda n: round(n / duration, 3) if duration > 0 else None
    return {
        "mode": mode,
        "concurrency": concurrency,
        "rate": rate,
        "requests": len(records),
        "completed": len(done),
        "errors": dict(Counter(r.status for r in records if not r.ok)),
        "duration_s": round(duration, 4),
        "requests_per_s": per_second(len(done)),
        "output_tokens_per_s": per_second(tokens),
        "output_bytes_per_s": per_second(output_bytes),
        "output_tokens": tokens,
        "messages_per_request": round(sum(r.messages for r in done) / len(done), 2) if done else None,
        "output_bytes": output_bytes,
        "reported_completion_tokens": sum(r.reported_tokens or 0 for r in done),
        "token_count_mismatches": sum(r.tokens != r.reported_tokens for r in done),
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in done),
        "cached_prompt_tokens": sum(r.cached_tokens or 0 for r in done),
        "finish_reasons": dict(Counter(r.finish_reason for r in done)),
        "ttft_ms": distribution_ms([r.first_token - r.start for r in done if r.first_token is not None]),
        "itl_ms": distribution_ms([gap for r in done for gap in r.itl]),
        "e2e_ms": distribution_ms([r.end - r.start for r in done]),
        "tpot_ms": distribution_ms([r.time_per_output_token for r in done if r.time_per_output_token is not None]),
        "by_kind": by_kind(records),
    }


def by_kind(records: Sequence[RequestRecord]) -> dict[str, dict[str, Any]]:
    """Each kind's share of a level that sent more than one ({} otherwise): its requests, output tokens
    and latencies. Its tokens/s would be its tokens over a wall time every kind shares, so there is
    none; its share of the level's output tokens says as much."""
    kinds = list(dict.fromkeys(r.kind for r in records))
    if len(kinds) < 2:
        return {}
    total = sum(r.tokens for r in records if r.ok) or 1
    out = {}
    for kind in kinds:
        done = [r for r in records if r.kind == kind and r.ok]
        out[kind] = {
            "requests": sum(r.kind == kind for r in records),
            "completed": len(done),
            "output_tokens": sum(r.tokens for r in done),
            "output_token_share": round(sum(r.tokens for r in done) / total, 4),
            "ttft_ms": distribution_ms([r.first_token - r.start for r in done if r.first_token is not None]),
            "itl_ms": distribution_ms([gap for r in done for gap in r.itl]),
            "e2e_ms": distribution_ms([r.end - r.start for r in done]),
            "tpot_ms": distribution_ms([r.time_per_output_token for r in done if r.time_per_output_token is not None]),
        }
    return out


def level_label(level: dict[str, Any]) -> str:
    """ "c=4" for a closed-loop level, "rate=2/s" for an open-loop one."""
    if level["mode"] == "closed":
        return f"c={level['concurrency']}"
    return f"rate={level['rate']:g}/s"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _triple(stats: dict[str, float | None]) -> str:
    return "/".join(_fmt(stats[f"p{q}"]) for q in PERCENTILES)


def format_table(levels: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table, one row per level (and under it one per kind of a mix, with its share of the
    output tokens); output bytes/s beside tokens/s; latencies in ms."""
    header = (
        "level",
        "ok",
        "err",
        "req/s",
        "out tok/s",
        "out B/s",
        "TTFT ms p50/p90/p99",
        "ITL ms p50/p90/p99",
        "E2E ms p50/p90/p99",
    )
    rows = [header]
    for lv in levels:
        rows.append(
            (
                level_label(lv),
                str(lv["completed"]),
                str(lv["requests"] - lv["completed"]),
                _fmt(lv["requests_per_s"], 2),
                _fmt(lv["output_tokens_per_s"]),
                _fmt(lv["output_bytes_per_s"]),
                _triple(lv["ttft_ms"]),
                _triple(lv["itl_ms"]),
                _triple(lv["e2e_ms"]),
            )
        )
        rows += [  # a mix's kinds, each under its level: its share of the tokens instead of a rate
            (
                f"{kind}:",
                str(k["completed"]),
                str(k["requests"] - k["completed"]),
                "",
                f"{100 * k['output_token_share']:.0f}%",
                "",
                _triple(k["ttft_ms"]),
                _triple(k["itl_ms"]),
                _triple(k["e2e_ms"]),
            )
            for kind, k in lv.get("by_kind", {}).items()
        ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _plot_mode(axes, levels: list[dict[str, Any]], x_key: str, x_label: str) -> None:
    """Throughput (left) and latency (right) against one load axis."""
    xs = [lv[x_key] for lv in levels]
    throughput, latency = axes
    for key, name in (("output_tokens_per_s", "output tokens/s"), ("output_bytes_per_s", "output bytes/s")):
        throughput.plot(xs, [lv[key] or 0 for lv in levels], "o-", label=name)
    throughput.set_ylabel("output per second")
    throughput.set_ylim(bottom=0)
    throughput.grid(True, alpha=0.3)
    throughput.legend(fontsize="small")
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        (line,) = latency.plot(xs, [lv[key]["p50"] for lv in levels], "o-", label=f"{name} p50")
        latency.plot(xs, [lv[key]["p99"] for lv in levels], "--", color=line.get_color(), label=f"{name} p99")
    latency.set_ylabel("latency (ms)")
    latency.set_yscale("log")
    latency.grid(True, which="both", alpha=0.3)
    latency.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5))
    for ax in axes:
        ax.set_xlabel(x_label)
        if x_key == "concurrency":
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])


def write_plot(report: dict[str, Any], path: str) -> None:
    """A PNG: throughput and latency against concurrency (and against rate, if measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [
        (m, key, label)
        for m, key, label in (
            ("closed", "concurrency", "concurrency (requests in flight)"),
            ("poisson", "rate", "offered load (requests/s, Poisson)"),
        )
        if any(lv["mode"] == m for lv in report["levels"])
    ]
    fig, grid = plt.subplots(len(modes), 2, figsize=(12, 4 * len(modes)), squeeze=False)
    for row, (mode, key, label) in zip(grid, modes):
        _plot_mode(row, [lv for lv in report["levels"] if lv["mode"] == mode], key, label)
    model = report.get("model", {}).get("model_name", "")
    fig.suptitle(
        f"attnserve bench: {model} at {report['target']}, "
        f"{report['config']['prompt_tokens']} prompt + "
        f"{report['config']['max_new_tokens']} new tokens"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
