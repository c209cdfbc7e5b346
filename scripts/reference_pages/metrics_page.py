"""docs/reference/metrics.md: every Prometheus metric a server exports, with its type, labels and help.

Read from the registry of the server's own Metrics object (attnserve/server/metrics.py), built without
a server. The process_* metrics are read from a stand-in /proc, so the page is the same on any machine.
Knows nothing of what the metrics measure.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from attnserve.server.metrics import Metrics

from .markdown import code, page, table, text

INTRO = (
    "The Prometheus metrics one `attnserve serve` exports on `--metrics-port` (path `/metrics`), by name. "
    "A counter is exposed as `NAME_total` (and `NAME_created`), a histogram as `NAME_bucket` "
    "(label `le`), `NAME_sum` and `NAME_count` (and `NAME_created`), an info as `NAME_info`."
)
SUFFIX = {"counter": "_total", "info": "_info"}  # exposed name = family name + this


def render() -> str:
    metrics = Metrics()
    metrics.describe_model("MODEL", "PROVIDER", "DTYPE", "")  # what the server sets at start-up: the info's labels
    collectors = list(metrics.registry._collector_to_names)  # in registration order
    families = sorted(
        ((f, labels(c, f)) for c in collectors for f in collect(c)), key=lambda pair: exposed_name(pair[0])
    )
    rows = [
        [code(exposed_name(f)), f.type, ", ".join(map(code, names)) or "—", text(f.documentation)]
        for f, names in families
    ]
    buckets = [[code(h._name), ", ".join(map(bound, h._upper_bounds))] for h in histograms(collectors)]
    body = [
        table(["metric", "type", "labels", "help"], rows),
        "## Histogram buckets",
        "Upper bounds of each histogram's buckets, `+Inf` last.",
        table(["histogram", "buckets"], buckets),
    ]
    return page("Metrics", INTRO, body)


def collect(collector: Collector) -> Iterable[Metric]:
    """The metric families `collector` exports; process_* read from a stand-in /proc."""
    if isinstance(collector, ProcessCollector):
        return process_families(collector)
    return collector.collect()


def process_families(collector: ProcessCollector) -> list[Metric]:
    """What a ProcessCollector like `collector` exports from a /proc with every file it reads."""
    with tempfile.TemporaryDirectory() as proc:
        root = Path(proc)
        (root / "self" / "fd").mkdir(parents=True)
        (root / "stat").write_text("btime 1\n")
        (root / "self" / "stat").write_text("1 (attnserve) " + " ".join(["1"] * 50) + "\n")
        (root / "self" / "limits").write_text("Max open files 1024 1024 files\n")
        stand_in = ProcessCollector(collector._namespace, proc=proc, registry=None)
        return list(stand_in.collect())


def labels(collector: Collector, family: Metric) -> list[str]:
    """The label names of `family`'s series: those declared, then those its samples carry (an info's)."""
    names = list(getattr(collector, "_labelnames", ()))
    for sample in family.samples:
        names += [name for name in sample.labels if name not in names and name != "le"]
    return names


def exposed_name(family: Metric) -> str:
    return family.name + SUFFIX.get(family.type, "")


def bound(upper: float) -> str:
    return "+Inf" if upper == math.inf else f"{upper:g}"


def histograms(collectors: list[Collector]) -> list[Histogram]:
    return sorted((c for c in collectors if isinstance(c, Histogram)), key=lambda h: h._name)
