"""The parity gate's prompt lengths in a short context.

The gates draw prompts of fixed lengths (13 positions and below) and decode after them, and the
concat layout's cases put up to 13 new tokens after a 17-token past; a model imported with a short
context (attnserve import --context-length goes down to 8) has fewer positions than that. fitted()
keeps the lengths where they fit and scales them down where not, fitted_past() does the same for a
case's past and new tokens, and renamed() makes a case's name say the lengths it compared.
"""

from __future__ import annotations

import re


def fitted(lengths: list[int], room: int) -> list[int]:
    """`lengths` where the longest fits in `room` positions; otherwise each scaled down in proportion,
    at least 1, so that they stay ragged where they can."""
    longest = max(lengths)
    if longest <= room:
        return lengths
    return [max(1, n * room // longest) for n in lengths]


def fitted_past(past: int, total: int, room: int) -> tuple[int, int]:
    """A case's `past` positions and the `total - past` new ones after them, where `total` fits in
    `room`; otherwise the past scaled down in proportion and the new ones filling the rest (at least 1)."""
    if total <= room:
        return past, total - past
    shorter = min(past * room // total, room - 1)
    return shorter, room - shorter


def renamed(case: str, **lengths: int) -> str:
    """A case's name ("B3 T13 P17 left-padded") with its lengths (T=4, P=4) as fitted."""
    for letter, length in lengths.items():
        case = re.sub(rf"\b{letter}\d+\b", f"{letter}{length}", case)
    return case
