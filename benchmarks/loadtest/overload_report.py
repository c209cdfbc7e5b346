"""The overload run's PNG: arrivals accepted and refused over time, TTFT of the accepted against
its bound, and health check latency. matplotlib is imported only to draw."""

from __future__ import annotations

from typing import Any


def write_plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (arrivals, ttft, health) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    timeline = report["timeline"]
    for code, color in (("OK", "tab:blue"), ("RESOURCE_EXHAUSTED", "tab:red")):
        times = [t for t, c, _ in timeline if c == code]
        arrivals.hist(times, bins=60, alpha=0.6, color=color, label=f"{code} ({len(times)})")
    arrivals.set_ylabel("requests per bin")
    arrivals.set_title(
        f"overload: {report['offered_rate']:.0f} req/s offered = {report['config']['factor']:g} x capacity "
        f"({report['capacity_requests_per_s']:.0f} req/s); {'pass' if report['passed'] else 'FAIL'}"
    )
    arrivals.legend()
    accepted = [(t, 1000 * f) for t, c, f in timeline if c == "OK" and f is not None]
    ttft.scatter([t for t, _ in accepted], [f for _, f in accepted], s=3, label="accepted: time to first token")
    ttft.axhline(report["ttft_bound_ms"], color="red", linestyle="--", label="bound: (queue / batch + 1) x p99 turn")
    ttft.set_ylabel("ms")
    ttft.legend()
    checks = report["health_timeline"]
    health.plot([t for t, _ in checks], [1000 * latency for _, latency in checks], label="grpc.health.v1 Check")
    health.set_ylabel("ms")
    health.set_xlabel("seconds")
    health.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
