"""When training is done and how fast it learns: linear warm-up, then cosine decay over the budget.

The budget is steps, seconds of training, or both; the decay follows whichever runs out first,
so a time-budgeted run ends at the low learning rate too. Knows nothing of models or data.
"""

from __future__ import annotations

import math


def budget_progress(
    step: int, seconds: float, max_steps: int | None, time_budget: float | None, warmup_steps: int = 0
) -> float:
    """Fraction of the budget after warm-up spent, in [0, 1]: the larger of steps and time."""
    fractions = [0.0]
    if max_steps is not None:
        fractions.append((step - warmup_steps) / max(1, max_steps - warmup_steps))
    if time_budget is not None:
        fractions.append(seconds / max(time_budget, 1e-9))
    return min(1.0, max(fractions))


def budget_spent(step: int, seconds: float, max_steps: int | None, time_budget: float | None) -> bool:
    """True once either limit is reached."""
    return (max_steps is not None and step >= max_steps) or (time_budget is not None and seconds >= time_budget)


def learning_rate(step: int, progress: float, lr: float, warmup_steps: int, min_lr_ratio: float) -> float:
    """lr * (step + 1) / warmup during warm-up, then cosine from lr down to lr * min_lr_ratio."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, progress))))
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)
