"""What each request of an `attnserve bench` run decodes with: one kind for all (the sampling flags),
or a named mix of kinds in fixed shares (--mix), each request's kind drawn from --seed.

A benchmark that sends only greedy requests measures the request production rarely sends: clients
sample, ask for logprobs and run to fixed lengths. `production` is the mix the project measures
serving with: 70% temperature 0.7 with top_p 0.9, 20% greedy, 10% greedy with the 5 most likely
ids' logprobs. Every sampled request carries a seed drawn from --seed, so a run is repeatable.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..flags import flag_name
from .cli_common import check_ranges

# The sampling flags `attnserve bench` takes (GenerationParams' fields, their help written there).
SAMPLING = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
)


@dataclass(frozen=True)
class Kind:
    """One kind of request: its name in the report, its share of a mix, its sampling fields."""

    name: str
    share: float
    sampling: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sampled(self) -> bool:
        return bool(self.sampling.get("temperature"))


MIXES: dict[str, tuple[Kind, ...]] = {
    "production": (
        Kind("temperature 0.7, top_p 0.9", 0.7, {"temperature": 0.7, "top_p": 0.9}),
        Kind("greedy", 0.2),
        Kind("greedy, logprobs 5", 0.1, {"logprobs": 5}),
    ),
}


def describe(sampling: Mapping[str, Any]) -> str:
    """'temperature 0.8, top_p 0.95', or 'greedy' for no sampling field."""
    return ", ".join(f"{name} {value:g}" for name, value in sampling.items()) or "greedy"


def check_sampling(mix: str | None, sampling: tuple[tuple[str, Any], ...]) -> None:
    """ValueError naming the flag: --mix beside a sampling flag, or a value the server would refuse
    (in its own words, cli_common.check_ranges)."""
    if mix is not None and sampling:
        given = " ".join(flag_name(name) for name, _ in sampling)
        raise ValueError(f"--mix {mix} sets each request's sampling: give it or {given}, not both")
    check_ranges(dict(sampling))


def kinds_for(mix: str | None, sampling: Mapping[str, Any]) -> tuple[Kind, ...]:
    """The run's kinds: the named mix's, or one kind of the sampling flags given (those unlike their defaults)."""
    if mix is not None:
        return MIXES[mix]
    return (Kind(describe(sampling), 1.0, sampling),)


def assign(kinds: tuple[Kind, ...], count: int, seed: int) -> list[Kind]:
    """Each of `count` requests' kind: every kind gets its share of them (rounded by the largest
    remainders, so the counts sum to `count`), in an order shuffled from `seed`."""
    exact = [kind.share * count for kind in kinds]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(kinds)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: count - sum(counts)]:
        counts[i] += 1
    order = [kind for kind, n in zip(kinds, counts) for _ in range(n)]
    random.Random(seed).shuffle(order)
    return order


def summary(kinds: tuple[Kind, ...], assigned: list[str]) -> list[dict[str, Any]]:
    """The report's lines: each kind, its share, its fields and how many of the requests it got
    (`assigned`: each request's kind name)."""
    return [
        {"kind": k.name, "share": k.share, "sampling": dict(k.sampling), "requests": assigned.count(k.name)}
        for k in kinds
    ]
