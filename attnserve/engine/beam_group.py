"""A beam search request inside the continuous batch: its k beams are k slots of the same batch as every
other request, its prompt (or source) prefilled once and forked into them.

Each step the group takes its k rows' best continuations, and beam_search.py says which beam each next
beam continues. A runner's batched pass may pick a row where its logits are (pass_row: its `keep` plus
its bans likeliest ids, log-softmaxed over the unbanned row, as transformers' search does before it
masks); the group makes the rest from their rows of logits. A beam that continues its own slot's beam
keeps the slot; where several continue one beam, the first keeps its slot and each other takes a slot
whose beam ended, with a copy of the cache (SlotRunner.copy_cache: on the device, no host round trip;
an encoder-decoder's source keys and values are the same in every slot of the group and are not copied
or computed again). The request's events are its best hypotheses at the end, one completion each
(index 0 best), with their scores: a stream of a beam request sends them once the search ends.
"""

from __future__ import annotations

import time

import numpy as np

from ..tokenizer import Tokenizer
from .beam_search import BeamSearch, reassign, row_candidates, top_candidates
from .domain import Delta, Final, FinishReason, Usage
from .seam import PASS_TOP, Logits, PassRow
from .sequence import Caller, Event, Sequence


class BeamGroup:
    """One beam search request's slots (by key) and its search."""

    def __init__(self, sequence: Sequence, keys: list[int], tokenizer: Tokenizer):
        """`sequence`: the request as it was queued (its caller, arrival and banned ids); `keys`: its k slots."""
        params = sequence.request.beams
        assert params is not None and len(keys) == params.num_beams, "a beam group holds one slot per beam"
        self.sequence, self.tokenizer = sequence, tokenizer
        self.search = BeamSearch(params, sequence.ends, sequence.budget)
        self.beam_keys = list(keys)  # beam i's state is in key beam_keys[i]'s slot
        self.next_tokens: dict[int, int] = {}
        self.final: Final | None = None
        self.members = [BeamMember(self, key) for key in keys]
        self.first_step: float | None = None

    @property
    def done(self) -> bool:
        return self.final is not None

    @property
    def handle(self) -> Caller:
        return self.sequence.handle

    def take(
        self,
        logits: Logits,
        rows: dict[int, int],
        picked: np.ndarray | None,  # noqa: ARG002 (a beam's token is its search's, not the row's argmax)
        now: float,
    ) -> tuple[list[Event], list[tuple[int, int]]]:
        """Its k rows (search.Search), each picked by the runner's pass or read from the logits: step()'s
        events and cache copies."""
        banned, keep = self.banned(), self.search.keep
        found = {key: top_candidates(logits.picks[key].top, banned, keep) for key in rows if key in logits.picks}
        if host := [key for key in rows if key not in logits.picks]:
            ids, logprobs = row_candidates(logits.rows[[rows[key] for key in host]], banned, keep)
            found |= {key: (ids[i], logprobs[i]) for i, key in enumerate(host)}
        return self.step(found, now)

    def pass_row(self) -> PassRow | None:
        """Each beam's pick as the runner's batched pass makes it: no transform, its `keep` and its bans
        likeliest ids (the bans left out after: transformers' search masks after the log-softmax), the
        side chosen by the row alone (its scores must not depend on the batch); None where that is more
        than the pass brings back or the row holds."""
        top = self.search.keep + len(self.banned())
        fits = top <= min(PASS_TOP, self.sequence.sampler.vocab_size)
        return PassRow(0.0, 0, 1.0, 0.0, 0.0, top=top, alone=True) if fits else None

    def token_gaps(self) -> list[float]:
        return []  # its tokens go out at its end

    def banned(self) -> tuple[int, ...]:
        """As a completion's: the end ids before min_new_tokens, EOS under ignore_eos."""
        s = self.sequence
        return s.early_ban if self.search.generated < s.request.min_new_tokens else s.late_ban

    def step(
        self, found: dict[int, tuple[np.ndarray, np.ndarray]], now: float
    ) -> tuple[list[Event], list[tuple[int, int]]]:
        """This step's best continuations by key (ids, log-probabilities: beam_search's candidates): the
        events (the hypotheses, once the search ends) and the cache copies (src key, dst key) the runner
        makes before the next step; every src keeps its own state."""
        self.first_step = self.first_step or now
        ids, logprobs = (np.stack([found[key][i] for key in self.beam_keys]) for i in (0, 1))
        moves = self.search.step(ids, logprobs)
        if self.search.done:
            return self.finish(now), []
        self.beam_keys, copies = reassign(self.beam_keys, moves)
        self.next_tokens = {key: token for key, (_, token) in zip(self.beam_keys, moves)}
        return [], copies

    def finish(self, now: float) -> list[Event]:
        """The best hypotheses, one completion each, best first: their tokens (the end id dropped), text,
        finish reason and score."""
        s = self.sequence
        hypotheses = self.search.hypotheses()
        timings = s.timings(now, now)  # the caller's first token comes with the end
        assert hypotheses, "a search ends with a hypothesis kept (at the budget every best candidate ends)"
        events: list[Event] = []
        final: Final | None = None
        for index, hypothesis in enumerate(hypotheses):
            tokens = hypothesis.tokens[:-1] if hypothesis.ended else hypothesis.tokens
            reason = FinishReason.LENGTH
            if hypothesis.ended:
                reason = FinishReason.EOS if hypothesis.tokens[-1] in s.eos_ids else FinishReason.STOP
            usage = Usage(len(s.request.prompt_ids), len(tokens), self.members[0].cached_tokens)
            events.append(Delta(tokens, self.tokenizer.decode(tokens), (), index))
            remaining = len(hypotheses) - 1 - index
            final = Final(reason, "", usage, timings, (), index, remaining, hypothesis.score)
            events.append(final)
        self.final = final
        return events

    def end(self, reason: FinishReason) -> list[Event]:
        """Ended before the search did (cancelled, deadline): one Final, no hypotheses; [] once ended."""
        if self.final is not None:
            return []
        s = self.sequence
        usage = Usage(len(s.request.prompt_ids), 0, self.members[0].cached_tokens)
        self.final = Final(reason, "", usage, s.timings(time.perf_counter(), None))
        return [self.final]


class BeamMember:
    """One slot of a beam group, as the engine sees a request in a slot: its next token is the group's
    choice; it samples nothing itself (its row of logits goes to the group)."""

    plain_greedy = False  # its row of logits must come back every step
    argmax_bans = None  # never in a burst
    lookup = None  # it proposes nothing (speculation.py): a beam takes no part in a verification, nor its batch

    def __init__(self, group: BeamGroup, key: int):
        self.group, self.key = group, key
        self.request, self.handle = group.sequence.request, group.sequence.handle
        self.cached_tokens = 0  # prompt tokens the runner copied from its prefix cache

    @property
    def owner(self) -> BeamGroup:
        """The search that takes this slot's rows (search.py): its group."""
        return self.group

    def pass_row(self) -> PassRow | None:
        """The group's (BeamGroup.pass_row): its search takes the pick's top ids."""
        return self.group.pass_row()

    def burst_row(self) -> PassRow | None:
        """None: the group chooses its beams' next tokens after every step."""
        return None

    def take_prompt(self, rows: np.ndarray) -> None:
        """A beam search asks no prompt logprobs (validation refuses them beside num_beams)."""

    @property
    def next_token(self) -> int | None:
        return self.group.next_tokens.get(self.key)

    @property
    def done(self) -> bool:
        return self.group.done

    @property
    def final(self) -> Final | None:
        return self.group.final

    def expired(self, now_monotonic: float) -> bool:
        return self.group.sequence.expired(now_monotonic)

    def end(self, reason: FinishReason) -> list[Event]:
        return self.group.end(reason)
