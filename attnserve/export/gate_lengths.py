"""The parity gate's prompt lengths in a short context.

The gates draw prompts of fixed lengths (13 positions and below) and decode after them; a model
imported with a short context (attnserve import --context-length goes down to 8) has fewer
positions than that. fitted() keeps the lengths where they fit and scales them down where not.
"""

from __future__ import annotations


def fitted(lengths: list[int], room: int) -> list[int]:
    """`lengths` where the longest fits in `room` positions; otherwise each scaled down in proportion,
    at least 1, so that they stay ragged where they can."""
    longest = max(lengths)
    if longest <= room:
        return lengths
    return [max(1, n * room // longest) for n in lengths]
