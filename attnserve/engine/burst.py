"""A burst: greedy decode steps the runner runs back to back, and when each request takes its tokens.

While every request in the batch is greedy (plain, or with bans that stay to its end: ignore_eos,
whose row the runner reads only at a step whose argmax is banned), the runner can chain decode steps
itself (each fed the tokens the one before picked) and the engine's own step (admission, cleanup,
the next step's inputs) waits for the burst's end. A request takes its tokens only when it must: once its
stream interval makes a Delta due, or where its budget ends; it then takes every token since the
last time, in order and at their own step's time, as it would have step by step. A unary call
takes its tokens at the burst's end, an interval-1 stream after every step, an interval-8 stream
every 8 steps whatever phase its neighbours are in. The burst ends after a step where a request
ended or picked an id that may end it, and at the end every request catches up.
No runner, no gRPC: request keys, token ids and Sequences.
"""

from __future__ import annotations

from collections.abc import Callable

from .sequence import Event, Sequence

Emit = Callable[[Sequence, list[Event]], None]
Fail = Callable[[Sequence, Exception], None]


class Burst:
    """The tokens of a burst's steps so far, and which request takes them at which step."""

    def __init__(self, sequences: dict[int, Sequence], emit: Emit, fail: Fail):
        """`sequences`: the batch by key; `emit`: where a request's events go as it takes its tokens;
        `fail`: told of a request whose own work raised (it takes no more tokens; the burst goes on)."""
        self.sequences, self.emit, self.fail = sequences, emit, fail
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
                self.emit(sequence, sequence.advance(self.tokens[step][row], self.times[step]))
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
