"""The one interface every decoding mode meets: what takes a step's rows of a request's slots and
decides their tokens. A completion (sequence.py: greedy or sampling, one slot) is its own search; a
beam search request's beams are the slots of one BeamGroup (beam_group.py). The engine hands each
search its rows, emits what it returns, makes the cache copies it asks for and frees its slots once it
is done; it routes no slot by its type. A new mode (a draft model's speculation, say) is a new Search.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .domain import Final
from .seam import Logits
from .sequence import Caller, Event


class Search(Protocol):
    """A request's (or one completion's) token decisions over the slots it holds."""

    @property
    def handle(self) -> Caller:
        """Whose events these are (and who gets the error where its own work fails)."""
        ...

    @property
    def final(self) -> Final | None: ...

    @property
    def done(self) -> bool: ...

    def take(
        self, logits: Logits, rows: dict[int, int], picked: np.ndarray | None, now: float
    ) -> tuple[list[Event], list[tuple[int, int]]]:
        """This step's rows of its slots (`rows`: key -> index into `logits`; `picked`: each row's argmax,
        if the runner or the engine took them): its events, and the cache copies (src key, dst key) the
        runner makes before the next step."""
        ...

    def token_gaps(self) -> list[float]:
        """Seconds from each token it took this step to the one before (from arrival for the first):
        the engine's inter-token observations; a beam search, whose tokens go out at its end, has none."""
        ...
