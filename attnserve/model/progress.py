"""The training progress bar (tqdm): steps, loss, learning rate, tokens/s and the last held-out
figure.

A thin wrapper so that the training loop reads the same with the bar on or off (other ranks,
tests). Knows nothing of models or data.
"""

from __future__ import annotations

import math
import sys

from tqdm import tqdm


class ProgressBar:
    """tqdm over steps (total known only for a step budget); silent when disabled."""

    def __init__(self, cfg, step: int, enabled: bool = True, every: int = 5):
        self.enabled, self.every = enabled, every
        self.loss: float | None = None
        total = cfg.max_steps if cfg.time_budget is None else None
        self.bar = (
            tqdm(
                total=total,
                initial=step,
                unit="step",
                dynamic_ncols=True,
                disable=not enabled,
                mininterval=0.5 if sys.stderr.isatty() else 10.0,
                file=sys.stderr,
            )
            if enabled
            else None
        )

    def update(self, step: int, loss: float, lr: float, tokens_per_second: float, heldout: str | None) -> None:
        """Advance one step (loss in nats); refresh the figures every few steps, loss smoothed."""
        if self.bar is None:
            return
        self.loss = loss if self.loss is None else 0.9 * self.loss + 0.1 * loss
        self.bar.update(1)
        if step % self.every == 0:
            figures = {
                "loss bits/token": f"{self.loss / math.log(2):.3f}",
                "lr": f"{lr:.2e}",
                "tok/s": f"{tokens_per_second:,.0f}",
            }
            if heldout is not None:
                figures["held-out"] = heldout
            self.bar.set_postfix(figures, refresh=False)

    def write(self, line: str) -> None:
        """Print a line above the bar (or plainly when there is none)."""
        if self.bar is None:
            print(line, flush=True)
        else:
            self.bar.write(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
