"""A burst: decode steps the runner runs back to back, and when each request takes its tokens.

While every request in the batch is greedy (plain, or with bans that stay to its end: ignore_eos,
whose row the runner reads only at a step whose argmax is banned) or is picked by a PassRow that
changes from step to step by its uniform number and its penalties' ids alone (sampling, logprobs, a
bias, penalties: BurstDraws; the runner's batched pass picks them, or the host where the pass
cannot), the runner can chain decode steps itself (each fed the tokens the one before picked) and the
engine's own step (admission, cleanup, the next step's inputs) waits for the burst's end. A request
takes its tokens only when it must: once its stream interval makes a Delta due, or where its budget
ends; it then takes every token since the last time, in order and at their own step's time, as it
would have step by step. A unary call takes its tokens at the burst's end, an interval-1 stream after
every step, an interval-8 stream every 8 steps whatever phase its neighbours are in. The burst ends
after a step where a request ended or picked an id that may end it, and at the end every request
catches up.
No runner, no gRPC: request keys, token ids and Sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from . import whole_draw
from .host_picks import pick_together
from .sampling import drawn_whole
from .seam import PassRow, Pick
from .sequence import Event, Sequence

Emit = Callable[[Sequence, list[Event]], None]
Fail = Callable[[Sequence, Exception], None]


class BurstDraws:
    """The burst's drawn rows (seam.Draws): each key's PassRow at the burst's first step, the same at every
    later one but for its uniform number (its Sampler's that many draws on: counter-based) and, where it
    is penalized, the ids its penalties apply to (its Sampler's at the first step, and each step's pick
    added as the runner hands it over: copies, ahead of the request's own); and each step's picks until
    the request takes them (take)."""

    def __init__(self, sequences: Mapping[int, Sequence], rows: Mapping[int, PassRow]):
        self.first = dict(rows)
        self.sequences = {key: sequences[key] for key in rows}
        self.positions = {key: sequence.sampler.position for key, sequence in self.sequences.items()}  # at step 0
        samplers = {key: sequence.sampler for key, sequence in self.sequences.items()}
        self.seen = {key: sampler.seen.copy() for key, sampler in samplers.items() if sampler.penalized}
        self.occurred = {key: samplers[key].occurred.copy() for key in self.seen}
        self.vocab = {key: samplers[key].vocab_size for key in self.seen}
        self.picks: dict[int, dict[int, Pick]] = {}  # step -> key -> its pick there
        self.failed: dict[tuple[int, int], Exception] = {}  # (step, key) -> what its host pick raised

    def rows(self, step: int) -> dict[int, PassRow]:
        return {key: self._row(key, step) for key in self.first} if step else dict(self.first)

    def pick_on_host(self, step: int, logits: Mapping[int, np.ndarray], rows: Mapping[int, PassRow]) -> dict[int, Pick]:
        """Their picks on the host: together where host_picks takes them (each its Sequence.draw's), the others
        alone (pick). Where the picks together raise, each is picked alone, so that only the request whose own
        work raised ends. Where a long row (whole_draw.splits) goes to the compiled draw over its every id, the
        draw's helper thread is woken for the step's rows and rests after them (whole_draw.wake)."""
        keys = list(logits)
        scored = [self.sequences[key].request.logprobs is not None for key in keys]
        vocab = logits[keys[0]].size
        woken = whole_draw.splits(vocab) and any(drawn_whole(rows[k], vocab, asked) for k, asked in zip(keys, scored))
        if woken:  # no more than 5 ms, should a pick raise past self.pick
            whole_draw.wake()
        try:
            got = pick_together([logits[key] for key in keys], [rows[key] for key in keys], scored)
        except Exception:  # noqa: BLE001 -- some request's own work: each alone finds whose
            got = [None] * len(keys)
        picks = {
            key: self.pick(key, logits[key], rows[key], step) if pick is None else pick for key, pick in zip(keys, got)
        }
        if woken:
            whole_draw.rest()
        return picks

    def pick(self, key: int, logits: np.ndarray, row: PassRow, step: int) -> Pick:
        """Its pick on the host alone (Sequence.draw). Where that raises (the request's own work), its row's
        argmax stands in, fed to the steps after, and the request ends with the error when it takes it."""
        try:
            return self.sequences[key].draw(logits, row)
        except Exception as error:  # noqa: BLE001 -- one request's own work: it alone ends (take)
            self.failed[step, key] = error
            return Pick(int(np.argmax(logits)), 0.0)

    def took(self, step: int, picks: dict[int, Pick]) -> None:
        self.picks[step] = picks
        for key, seen in self.seen.items():  # as its Sampler records it
            if 0 <= (token := picks[key].token) < self.vocab[key]:
                seen.add(token)
                self.occurred[key].add(token)

    def take(self, key: int, step: int) -> int:
        """Key's token at `step`, its pick taken by its request (its sampler's position, its logprobs); what
        its host pick raised, raised."""
        if (step, key) in self.failed:
            raise self.failed[step, key]
        return self.sequences[key].take_pick(self.picks[step][key])

    def _row(self, key: int, step: int) -> PassRow:
        first = self.first[key]
        if not step:
            return first
        uniform = self.sequences[key].sampler.uniform_at(self.positions[key] + step)
        if key not in self.seen:
            return first.at_step(uniform)
        occurred = self.occurred[key]
        seen = self.seen[key].ids if first.repetition != 1.0 else first.seen
        return first.at_step(uniform, seen=seen, occurred=occurred.ids, counts=occurred.counts)


class Burst:
    """The tokens of a burst's steps so far, and which request takes them at which step."""

    def __init__(self, sequences: dict[int, Sequence], emit: Emit, fail: Fail, draws: BurstDraws | None = None):
        """`sequences`: the batch by key; `emit`: where a request's events go as it takes its tokens;
        `fail`: told of a request whose own work raised (it takes no more tokens; the burst goes on);
        `draws`: the drawn rows' picks (a drawn request takes its pick with its token: its sampler's
        position, its log-probabilities)."""
        self.sequences, self.emit, self.fail, self.draws = sequences, emit, fail, draws
        self.closed: set[int] = set()  # keys that take no more tokens: failed, or ended by the step boundary
        self.ends = frozenset().union(*(sequence.ends for sequence in sequences.values()))
        self.tokens: list[list[int]] = []  # each step's tokens, in the runner's row order
        self.times: list[float] = []  # when each step's tokens came (perf_counter)
        self.rows: dict[int, int] = {}  # key -> its row in the runner's order (fixed for the burst)
        self.taken = dict.fromkeys(sequences, 0)  # key -> the steps whose tokens it has taken
        self.due: dict[int, list[int]] = {}  # step -> the keys that take their tokens after it
        self.gaps: list[float] = []  # seconds before each token taken since taken_gaps() (its token_gap)
        for key in sequences:
            self._schedule(key)

    def _schedule(self, key: int) -> None:
        """`key` takes its tokens next after the step where its Delta falls due or its budget ends."""
        self.due.setdefault(self.taken[key] + self.sequences[key].quiet_steps(), []).append(key)

    def step(self, keys: list[int], tokens: list[int], now: float) -> bool:
        """A step's tokens (by row, `keys` the runner's order) at `now`: the requests due take theirs.
        True when the burst should end here: a request ended, or picked an id that may end it."""
        if not self.rows:
            self.rows = {key: row for row, key in enumerate(keys)}
        self.tokens.append(tokens)
        self.times.append(now)
        ended = False
        for key in self.due.pop(len(self.tokens), ()):
            ended = self._take(key) or ended
        return ended or not self.ends.isdisjoint(tokens)

    def close(self, keys: list[int]) -> None:
        """`keys` take their tokens so far and none after (the step boundary ends them: cancelled or expired)."""
        for key in keys:
            self._take(key)
            self.closed.add(key)

    def finish(self) -> None:
        """Every request takes the rest of its tokens."""
        for key in self.sequences:
            self._take(key)

    def taken_gaps(self) -> list[float]:
        """The gaps before each token taken since the last call (for the step's metrics, reported
        before its events go out, so that a request's Final never arrives ahead of its timings)."""
        gaps, self.gaps = self.gaps, []
        return gaps

    def _take(self, key: int) -> bool:
        """`key` takes its tokens since the last time; True if it ended (its later tokens are dropped)."""
        if key in self.closed:
            return False
        sequence, row = self.sequences[key], self.rows[key]
        for step in range(self.taken[key], len(self.tokens)):
            if sequence.done:
                break
            try:
                token = self.tokens[step][row]
                if self.draws is not None and key in self.draws.first:
                    token = self.draws.take(key, step)
                self.emit(sequence, sequence.advance(token, self.times[step]))
            except Exception as error:  # noqa: BLE001 -- its text or stops raised: it alone ends (logged by fail)
                self.closed.add(key)
                self.fail(sequence, error)
                return True
            self.gaps.append(sequence.token_gap)
        self.taken[key] = len(self.tokens)
        if sequence.done:
            return True
        self._schedule(key)
        return False
