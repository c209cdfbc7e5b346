"""What decode steps cost, measured by the engine: whether a verification paid for itself.

Speculation pays where a verification (the draft's steps, the target's run of several positions, the
picks) gives more tokens a second than plain decode steps of the same batch: a draft model slower
than its acceptance makes up for, or a proposal that keeps little, loses speed even where it keeps
something. The engine times every plain step (a burst's, per step) and every verification, and a
verification that gave fewer tokens than plain steps would have in its time counts as a miss for its
requests (speculation.Lookup.record: two in a row pause them). A batch size whose plain step was never
timed, or not since PROBE_EVERY verifications, runs one plain step to find out. No thresholds to tune:
the two sides' own times.
"""

from __future__ import annotations

PROBE_EVERY = 16  # verifications of a batch size between timings of its plain step
SMOOTHING = 0.25  # the weight of a new timing in a plain step's running average


class StepCosts:
    """By batch size: a plain decode step's seconds (a running average), and the verifications since."""

    def __init__(self) -> None:
        self.plain: dict[int, float] = {}
        self.since: dict[int, int] = {}  # verifications since the batch size's last plain step

    def ran_plain(self, batch: int, seconds_per_step: float) -> None:
        last = self.plain.get(batch)
        self.plain[batch] = seconds_per_step if last is None else last + SMOOTHING * (seconds_per_step - last)
        self.since[batch] = 0

    def probe(self, batch: int) -> bool:
        """A plain step of this batch size is due, to time it: it never ran, or not for PROBE_EVERY
        verifications."""
        return batch not in self.plain or self.since.get(batch, 0) >= PROBE_EVERY

    def verified(self, batch: int, tokens: int, seconds: float) -> bool | None:
        """A verification of `batch` requests gave `tokens` in `seconds`: whether that is at least what
        plain steps give in the time (each step one token a request); None where they were never timed."""
        self.since[batch] = self.since.get(batch, 0) + 1
        step = self.plain.get(batch)
        return None if step is None else tokens * step >= batch * seconds
