"""The scheduler's decision for a step's decoding, as a value (vLLM's SchedulerOutput): what each
decoding request feeds the model, and how its next token is picked. The engine makes one from its
batch (plan_decode) and then carries it out; a new decoding mode is a new kind of plan beside these,
not a branch inside Engine. Knows nothing of runners: keys, token ids and PassRows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .seam import PassRow


class Decoding(Protocol):
    """What a plan asks of a slot's holder (a completion's Sequence, or one beam of a beam group)."""

    @property
    def next_token(self) -> int | None:
        """The token it feeds the model next."""
        ...

    @property
    def plain_greedy(self) -> bool:
        """Its token is its row's argmax: no transform of its row (Sequence.transforms)."""
        ...

    @property
    def argmax_bans(self) -> tuple[int, ...] | None:
        """Where its token is its row's argmax over every id but a few, and stays so to its end (greedy
        with ignore_eos, past min_new_tokens): those ids (none for plain greedy); else None."""
        ...

    def pass_row(self) -> PassRow | None:
        """Its pick as the runner's batched pass makes it, or None where its row must come to the host."""
        ...

    def burst_row(self) -> PassRow | None:
        """Its pick as a burst's runner makes it at each step (its PassRow; each next step's differs by its
        uniform number and its penalties' ids alone), or None where it cannot be drawn in a burst."""
        ...


@dataclass(frozen=True)
class StepPlan:
    """One decode step for every decoding request (`next_ids`: key -> the token it feeds), or, with
    `burst`, up to MAX_BURST of them back to back (every row greedy, at most with bans that stay, or
    drawn, and no prompt waiting: burst.py; `bans`: key -> the ids its argmax must not be; `draws`: key ->
    its PassRow at the burst's first step). A single step brings back
    every row's argmax (a key in `bans`: over every id but those), the logits of the `sampled` keys,
    and, for those of them in `passes`, the runner's pass's pick instead of the row. With `proposals`
    (key -> the ids it proposes after its next token), one verification instead (SlotRunner.verify):
    each row's argmax after its next token and after each of its proposals, or a `sampled` key's rows."""

    next_ids: dict[int, int]
    burst: bool
    sampled: frozenset[int] = frozenset()
    passes: Mapping[int, PassRow] = field(default_factory=dict)
    bans: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    proposals: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    draws: Mapping[int, PassRow] = field(default_factory=dict)


def plan_decode(
    active: Mapping[int, Decoding], prompt_waiting: bool, proposals: Mapping[int, tuple[int, ...]] | None = None
) -> StepPlan:
    """The plan for the batch `active` (key -> its holder): a verification where a row has `proposals`
    (key -> the ids it proposes after its next token: speculation.py, drafting.py; every row a
    completion); else a burst while every row is greedy (plain, or with bans that stay: ignore_eos) or
    drawn (Decoding.burst_row) and no prompt waits for its next prefill round (a long prompt gets a chunk
    per step), else one step."""
    next_ids = {key: holder.next_token for key, holder in active.items() if holder.next_token is not None}
    assert len(next_ids) == len(active), "a decoding request always has a sampled token to feed"
    if proposals:
        sampled = frozenset(key for key, holder in active.items() if not holder.plain_greedy)
        return StepPlan(next_ids, burst=False, sampled=sampled, proposals=proposals)
    argmax = {key: banned for key, holder in active.items() if (banned := holder.argmax_bans) is not None}
    bans = {key: banned for key, banned in argmax.items() if banned}
    if not prompt_waiting:
        drawn = ((key, holder.burst_row()) for key, holder in active.items() if key not in argmax)
        draws = {key: row for key, row in drawn if row is not None}
        if len(argmax) + len(draws) == len(active):
            return StepPlan(next_ids, burst=True, bans=bans, draws=draws)
    sampled = frozenset(key for key in active if key not in argmax)
    passes = {key: row for key in sampled if (row := active[key].pass_row()) is not None}
    return StepPlan(next_ids, burst=False, sampled=sampled, passes=passes, bans=bans)
