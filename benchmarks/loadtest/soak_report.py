"""The soak's report: statuses by code, unexpected ones, RSS growth, latencies, verdicts; and its PNG.

Pure bookkeeping over what soak.py collected; matplotlib is imported only to draw.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from attnserve.clients.bench_report import distribution_ms
from benchmarks.loadtest.soak_worker import expected

MB = 2**20
WINDOW = 10  # RSS samples whose median is one end of the growth


def rss_growth(rss: list[tuple[float, int]], warmup_s: float) -> tuple[float, float]:
    """Median RSS of the first samples after the warm-up, and of the last ones, in bytes: WINDOW
    samples each, fewer in a short run, so that the two ends never share a sample."""
    after = [value for t, value in rss if t >= warmup_s] or [value for _, value in rss]
    window = max(1, min(WINDOW, len(after) // 3))
    return statistics.median(after[:window]), statistics.median(after[-window:])


def summarize(args, workers, rss, gauges, left, server_codes: dict[str, float], exit_code: int) -> dict[str, Any]:
    records = workers.records
    unexpected = [r for r in records if r["code"] not in expected(r["behavior"])]
    by_behavior: dict[str, Counter] = {}
    for r in records:
        by_behavior.setdefault(r["behavior"], Counter())[r["code"]] += 1
    complete = [r for r in records if r["behavior"] == "complete" and r["code"] == "OK"]
    start, end = rss_growth(rss, args.warmup_fraction * args.duration)
    growth_mb = (end - start) / MB
    server_bad = {code: n for code, n in server_codes.items() if code in ("INTERNAL", "UNKNOWN") and n}
    verdicts = {
        "no_unexpected_statuses": not unexpected and not server_bad,
        "nothing_left_in_flight": list(left) == [0.0, 0.0, 0.0],
        "rss_growth_within_limit": growth_mb <= args.rss_growth_limit_mb,
        "drained_and_exited_0": exit_code == 0,
    }
    return {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "plot")},
        "requests": len(records),
        "completed_streams": len(complete),
        "tokens": sum(r["tokens"] for r in records),
        "statuses": dict(Counter(r["code"] for r in records)),
        "statuses_by_behavior": {b: dict(c) for b, c in sorted(by_behavior.items())},
        "server_statuses": server_codes,
        "unexpected": len(unexpected),
        "unexpected_examples": unexpected[:5],
        "server_unexpected": server_bad,
        "workers_killed": workers.kills,
        "rss_mb": {
            "first": rss[0][1] / MB if rss else None,
            "after_warmup": start / MB,
            "end": end / MB,
            "growth": growth_mb,
            "limit": args.rss_growth_limit_mb,
        },
        "left_after_load": {"in_flight": left[0], "batch": left[1], "queue": left[2]},
        "ttft_ms": distribution_ms([r["ttft"] for r in complete if r["ttft"] is not None]),
        "inter_token_ms": distribution_ms(workers.gaps),
        "server_exit_code": exit_code,
        "rss_samples": rss,
        "gauge_samples": gauges,
        "verdicts": verdicts,
        "passed": all(verdicts.values()),
    }


def write_plot(report: dict[str, Any], path: str) -> None:
    """RSS over time with the warm-up and the limit; calls in flight and the batch over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (memory, load) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    config, rss = report["config"], report["rss_mb"]
    times = [t for t, _ in report["rss_samples"]]
    memory.plot(times, [v / MB for _, v in report["rss_samples"]], label="server RSS")
    warmup = config["warmup_fraction"] * config["duration"]
    memory.axvline(warmup, color="grey", linestyle=":", label="end of warm-up")
    memory.axhline(rss["after_warmup"] + rss["limit"], color="red", linestyle="--", label="growth limit")
    memory.set_ylabel("MB")
    memory.set_title(
        f"soak: {config['streams']} streams, {config['duration']:.0f} s, {report['requests']} requests, "
        f"{report['unexpected']} unexpected, RSS +{rss['growth']:.1f} MB: {'pass' if report['passed'] else 'FAIL'}"
    )
    memory.legend()
    gauges = report["gauge_samples"]
    load.plot([g[0] for g in gauges], [g[1] for g in gauges], label="calls in flight")
    load.plot([g[0] for g in gauges], [g[2] for g in gauges], label="batch")
    load.plot([g[0] for g in gauges], [g[3] for g in gauges], label="queue")
    load.set_xlabel("seconds")
    load.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
