"""One request's life inside the engine (Sequence: one per completion, n of them sharing a
Completions count) and its asyncio-side mailbox (Handle).

The engine thread owns every Sequence: it takes the token picked from the request's row of
logits (engine._advance), turns it into text, holds tokens and text until the request's stream
interval says a Delta is due, and decides when the request is finished. Events reach the
caller through the Handle's asyncio.Queue, filled on the caller's event loop. No gRPC here.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace
from typing import Protocol

import numpy as np

from ..tokenizer import Tokenizer
from .detokenizer import TextStream
from .domain import (
    Delta,
    Final,
    FinishReason,
    GenerationRequest,
    SlowReader,
    Timings,
    TokenLogprob,
    Usage,
    ends_request,
)
from .grammar import Matcher
from .sampling import Sampler, allows_beyond, pick_row, prompt_logprobs, unpacked
from .seam import Logits, ModelSpec, PassRow, Pick, argmax_without
from .speculation import Lookup, Speculation

Event = Delta | Final | Exception


class Caller(Protocol):
    """The engine's view of whoever waits for a request: the request, and whether it is still wanted."""

    request: GenerationRequest
    cancelled: bool  # set by the caller's side, read by the engine at the next step
    finished: bool

    def cancel(self) -> None: ...


class Handle:
    """The caller's end of a request: await its events; cancel() asks the engine to drop it.

    The caller is stuck (writing to a client that stopped reading) once it has been away from
    next_events for `patience_s` seconds with `max_buffered` deltas waiting: the next delta becomes
    SlowReader, and the request is dropped. Late is not stuck: an event loop starved by a busy machine
    runs a burst of deliveries while the caller's write is pending, though that write is about to
    complete (docs/design/decisions/slow-reader-patience.md), and a caller waiting in next_events is
    never behind."""

    PATIENCE_S = 1.0

    def __init__(
        self,
        request: GenerationRequest,
        loop: asyncio.AbstractEventLoop,
        max_buffered: int = 0,
        patience_s: float = PATIENCE_S,
    ):
        """`max_buffered`: 0 for no cap."""
        self.request = request
        self.loop = loop
        self.max_buffered, self.patience_s = max_buffered, patience_s
        self.away_since = loop.time()  # when the caller last left next_events
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = False  # set by the caller, read by the engine at the next step
        self.finished = False  # set once the Final (or an error) has been queued
        self.reading = False  # the caller waits in next_events: it takes whatever is queued

    def cancel(self) -> None:
        self.cancelled = True

    def put(self, event: Event) -> None:
        """Queue an event from the engine, unless the caller is gone or too far behind."""
        if self.finished:
            return  # after the caller's error, the engine's own end of the request is not news
        if self.max_buffered and isinstance(event, Delta) and self.stuck():
            self.cancel()
            event = SlowReader(
                f"{self.max_buffered} decoded events waited {self.patience_s:g} s for a client that is not "
                "reading its stream (--stream-buffer-events); the request is cancelled"
            )
        self.events.put_nowait(event)
        if ends_request(event):
            self.finished = True

    def stuck(self) -> bool:
        waiting = self.events.qsize() >= self.max_buffered
        return not self.reading and waiting and self.loop.time() - self.away_since >= self.patience_s

    async def next_events(self, timeout: float | None = None) -> list[Event]:
        """Everything delivered since the last call, in order: at least one event, or [] once
        `timeout` seconds have passed without one (an event is never lost to the timeout)."""
        self.reading = True
        try:
            if timeout is None:  # the per-token path: no wait_for around the queue
                events = [await self.events.get()]
            else:
                events = [await asyncio.wait_for(self.events.get(), timeout)]
        except asyncio.TimeoutError:
            return []
        finally:
            self.reading, self.away_since = False, self.loop.time()
        while not self.events.empty():
            events.append(self.events.get_nowait())
        return events


def token_budget(request: GenerationRequest, spec: ModelSpec) -> int:
    """Tokens `request` may generate: max_new_tokens, or fewer where its decoder prompt fills the context."""
    return min(request.max_new_tokens, spec.context_length - len(spec.decoder_prompt(request.prompt_ids)))


def fits(request: GenerationRequest, spec: ModelSpec) -> bool:
    """Whether the request's prompt leaves room in the context for a token, or it only scores its
    prompt (max_new_tokens 0 with prompt_logprobs): what validation guarantees before it reaches an engine."""
    scores_only = request.max_new_tokens == 0 and request.prompt_logprobs is not None
    return scores_only or token_budget(request, spec) >= 1


class Completions:
    """The completions of one request still running (n of them at first)."""

    def __init__(self, n: int):
        self.remaining = n
        self.proposed = self.accepted = 0  # speculative decoding's ids over the completions that ended
        self.speculated = False  # one of them could propose (it had a Lookup)


class Sequence:
    """A request being decoded (one of its n completions): its sampler, its generated ids, its pending
    token and its timings."""

    def __init__(
        self,
        request: GenerationRequest,
        handle: Caller,
        tokenizer: Tokenizer,
        spec: ModelSpec,
        index: int = 0,
        completions: Completions | None = None,
    ):
        """The decoder's prompt (spec.decoder_prompt) counts against the context and for the
        repetition penalty. Completion `index` of a request samples with its seed + index."""
        self.request, self.handle, self.index = request, handle, index
        self.completions = completions or Completions(request.n)
        self.eos_ids = tokenizer.eos_ids
        sampling = request.sampling
        if index and sampling.seed is not None:
            sampling = replace(sampling, seed=(sampling.seed + index) % 2**64)
        self.sampler = Sampler(sampling, spec.vocab_size, spec.decoder_prompt(request.prompt_ids))
        self.ends = frozenset({*self.eos_ids, *request.stop_token_ids})  # ids that end the request
        never = tokenizer.suppressed_ids  # the model's: never generated
        self.early_ban = tuple(sorted(self.ends | never))  # masked before min_new_tokens
        self.late_ban = tuple(sorted(never | (self.eos_ids if request.ignore_eos else frozenset())))  # after
        self.stream = TextStream(tokenizer, request.stop)
        self.budget = token_budget(request, spec)
        self.generated: list[int] = []
        self.next_token: int | None = None  # sampled, not yet fed to the model
        self.arrival = time.perf_counter()
        self.admitted: float | None = None  # prefill start
        self.queued_step = 0  # the engine's decode steps run when it was queued (--max-waiting-steps counts from it)
        self.cached_tokens = 0  # prompt tokens the runner copied from its prefix cache
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.token_gap = 0.0  # seconds from the previous token (from arrival, for the first) to the last
        self.final: Final | None = None
        self.held_ids: list[int] = []  # generated, not yet handed on in a Delta (request.interval)
        self.held_text: list[str] = []
        self.deltas = 0  # Deltas handed on so far
        self.last_delta = 0.0  # when the last one was (perf_counter)
        self.held_logprobs: list[TokenLogprob] = []  # with request.logprobs: one per held token
        self.picked: TokenLogprob | None = None  # the last picked token's, until advance takes it
        self.prompt_logprobs: tuple[TokenLogprob, ...] = ()  # with request.prompt_logprobs, once prefilled
        self.matcher = Matcher(request.grammar, tokenizer) if request.grammar else None  # structured output
        self.mask = self.matcher.ahead() if self.matcher else None  # the next token's, computed during the run
        self.plain_greedy = not self.transforms()  # its token is its row's argmax: the engine's batch-wide pick
        self.lookup: Lookup | None = None  # its history's n-grams, once it may speculate (speculate)

    def transforms(self) -> tuple[str, ...]:
        """What this step's pick takes beyond its row's argmax: its grammar's allowed ids, its bans, its
        sampler's transforms (in the order they apply, sampling.TRANSFORMS), its log-probabilities. None:
        plain greedy."""
        own = {"allowed_ids": self.matcher is not None, "bans": bool(self.banned())}
        reported = ("logprobs",) if self.request.logprobs is not None else ()
        return (*(name for name, on in own.items() if on), *self.sampler.active, *reported)

    def take_prompt(self, rows: np.ndarray) -> None:
        """The prompt's logits (n, V), prefilled: its logprobs go out with the Final."""
        top = self.request.prompt_logprobs or 0
        self.prompt_logprobs = prompt_logprobs(rows, self.request.prompt_ids, top)

    def banned(self) -> tuple[int, ...]:
        """Ids the next token cannot be: EOS and the stop ids before min_new_tokens, EOS under ignore_eos,
        and always the ids the model never generates (its tokenizer's suppressed_ids)."""
        return self.early_ban if len(self.generated) < self.request.min_new_tokens else self.late_ban

    @property
    def argmax_bans(self) -> tuple[int, ...] | None:
        """Where its token is its row's argmax over every id but its bans, and its bans stay to its end:
        those ids (none for plain greedy); None where its pick does more (a sampler's transform, a grammar,
        logprobs) or its bans change later (before min_new_tokens). A burst's row (step_plan.py)."""
        if self.plain_greedy:
            return ()
        if self.sampler.active or self.matcher is not None or self.request.logprobs is not None:
            return None
        return self.late_ban if len(self.generated) >= self.request.min_new_tokens else None

    def constraints(self) -> tuple[tuple[int, ...], np.ndarray | None]:
        """This step's banned ids and its grammar's allowed ids (Matcher.allowed's packed words), or None
        with no grammar. Where the grammar allows only what min_new_tokens or ignore_eos bans, the
        grammar wins: nothing is banned."""
        banned = self.banned()
        if self.mask is None:
            return banned, None
        allowed = self.mask.result()
        return (banned if not banned or allows_beyond(allowed, banned) else ()), allowed

    def pick(self, logits: np.ndarray) -> int:
        """The next token from this request's row of logits, by its sampler, its banned ids and the ids
        its grammar does not allow masked (and, with request.logprobs, its log-probabilities kept for
        advance)."""
        banned, allowed = self.constraints()
        if allowed is not None:
            allowed = unpacked(allowed, self.sampler.vocab_size)
        if self.request.logprobs is None:
            return self.sampler(logits, banned, allowed)
        token, self.picked = self.sampler.with_logprobs(logits, banned, self.request.logprobs, allowed)
        return token

    @property
    def owner(self) -> Sequence:
        """The search that takes this slot's rows (search.py): a completion is its own."""
        return self

    def take(
        self, logits: Logits, rows: dict[int, int], picked: np.ndarray | None, now: float
    ) -> tuple[list[Event], list[tuple[int, int]]]:
        """Its one row's token (search.Search): the runner's pass's pick, or its sampler's on the host, or
        for greedy with at most bans that stay (argmax_bans) the runner's argmax with them (a prefill's
        rows: the argmax over every id but those); then its events. No cache copies."""
        ((key, row),) = rows.items()
        if key in logits.picks:  # picked by the runner's batched pass
            token = self.take_pick(logits.picks[key])
        elif (bans := self.argmax_bans) is None:
            token = self.pick(logits.rows[row])
        elif picked is not None:
            token = int(picked[row])
        else:
            token = argmax_without(logits.rows[row], bans)
        return self.advance(token, now), []

    def token_gaps(self) -> list[float]:
        return [self.token_gap]

    def pass_row(self) -> PassRow | None:
        """This step's pick as a runner's batched pass makes it (its grammar's mask with it), or None where
        its row must come to the host: a penalty the pass's float32 could not hold (Sampler.pass_row)."""
        banned, allowed = self.constraints()
        row = self.sampler.pass_row(banned, self.request.logprobs or 0)
        return row if row is None or allowed is None else replace(row, allowed=allowed)

    def burst_row(self) -> PassRow | None:
        """Its pick as a burst's runner makes it at every step of the burst: this step's PassRow, where each
        next step's differs by its uniform number and its penalties' ids alone (burst.BurstDraws); None
        where more changes from step to step (a grammar's mask, bans before min_new_tokens), where its
        row must come to the host (Sampler.pass_row), or where its token is its row's argmax with at most
        bans that stay (argmax_bans: a greedy burst's row)."""
        if self.argmax_bans is not None or self.matcher is not None:
            return None
        if len(self.generated) < self.request.min_new_tokens:
            return None
        return self.sampler.pass_row(self.banned(), self.request.logprobs or 0)

    def draw(self, logits: np.ndarray, row: PassRow) -> Pick:
        """Its pick in a burst from its row of logits (V,) by `row` (a burst_row), on the host: what its
        sampler picks (sampling.pick_row, the batched pass's oracle), scored where it asks for logprobs."""
        return pick_row(logits, row, scored=self.request.logprobs is not None)

    def speculate(self, speculation: Speculation, spec: ModelSpec, next_pause: int, pause: int) -> None:
        """Propose ids (speculation.py) once `pause` steps have passed, its first misses pausing it for
        `next_pause` steps."""
        history = (*spec.decoder_prompt(self.request.prompt_ids), *self.generated)
        self.lookup = Lookup(speculation, history, next_pause, pause)

    def left(self) -> int:
        """The tokens it may still take (its budget: the context holds them too)."""
        return self.budget - len(self.generated)

    def room(self) -> int:
        """The most ids it may propose after its next token: as many as leave its last token to the model."""
        return self.left() - 1

    def proposal(self) -> tuple[int, ...]:
        """The ids its lookup proposes after its next token (prompt lookup), at most room(); () for none."""
        if self.lookup is None:
            return ()
        return self.lookup.propose(self.room())

    def take_pick(self, pick: Pick) -> int:
        """The token a runner's batched pass picked by pass_row (with its log-probabilities, if asked)."""
        self.sampler.record(pick.token)
        if self.request.logprobs is not None:
            self.picked = TokenLogprob(pick.token, pick.logprob, pick.top[: self.request.logprobs])
        return pick.token

    @property
    def done(self) -> bool:
        return self.final is not None

    def expired(self, now_monotonic: float) -> bool:
        return self.request.deadline is not None and now_monotonic > self.request.deadline

    def advance(self, token: int, now: float) -> list[Event]:
        """Take the token picked for this request at `now` (perf_counter); the events it makes due:
        a Delta once the request's interval has passed (with the tokens held since the last one),
        and, if the request ends, the Final."""
        self.token_gap = now - (self.arrival if self.last_token is None else self.last_token)
        self.first_token = self.first_token or now
        self.last_token = now
        if self.budget == 0:  # a prompt scored for its logprobs, nothing to generate
            return self.end(FinishReason.LENGTH)
        if token in self.ends:
            return self.end(FinishReason.EOS if token in self.eos_ids else FinishReason.STOP)
        look = len(self.generated) >= self.request.min_new_tokens  # stop strings count from there
        self.generated.append(token)
        self.next_token = token
        if self.lookup is not None:
            self.lookup.append(token)
        if self.matcher is not None:
            self.matcher.take(token)
            self.mask = self.matcher.ahead()
        if self.request.min_new_tokens:  # the ban changes once min_new_tokens are generated
            self.plain_greedy = not self.transforms()
        self.held_ids.append(token)
        if self.picked is not None:
            self.held_logprobs.append(self.picked)
            self.picked = None
        text = self.stream.push(token, look)
        if text:
            self.held_text.append(text)
        if self.stream.stopped or (self.matcher is not None and self.matcher.complete):
            return self.end(FinishReason.STOP)
        if len(self.generated) >= self.budget:
            return self.end(FinishReason.LENGTH)
        return self.take_held(now) if self.due(now) else []

    def due(self, now: float) -> bool:
        """The held tokens go on now: the first Delta at once (time to first token is not paced), then
        once `interval.tokens` are held or `interval.ms` have passed; never before the end without one."""
        interval = self.request.interval
        if interval is None:
            return False
        if self.deltas == 0 or len(self.held_ids) >= interval.tokens:
            return True
        return interval.ms > 0 and now - self.last_delta >= interval.ms / 1000

    def quiet_steps(self) -> int:
        """Tokens this request may take before one makes a Delta due or reaches its budget (that one
        included): what a burst of decode steps may run before its bookkeeping. A request with stop
        strings takes each token as it comes, so that its stop ends the burst at once."""
        left = self.left()
        interval = self.request.interval
        if self.stream.stops:
            return 1
        if interval is None:
            return left
        if self.deltas == 0:
            return 1
        return min(left, interval.tokens - len(self.held_ids))

    def takes_per_step(self) -> float:
        """How many of its tokens the engine takes a step in a burst (burst.py; quiet_steps): every one with
        stop strings, one in its interval's tokens for a stream, none for a unary call (all at its end)."""
        interval = self.request.interval
        if self.stream.stops:
            return 1.0
        return 0.0 if interval is None else 1 / interval.tokens

    def due_by(self) -> float:
        """When (perf_counter) a Delta of this request falls due by time (its interval's ms; inf: never)."""
        interval = self.request.interval
        return self.last_delta + interval.ms / 1000 if interval is not None and interval.ms > 0 else math.inf

    def take_held(self, now: float) -> list[Event]:
        """The held tokens and their text as one Delta ([] if none are held)."""
        if not self.held_ids:
            return []
        delta = Delta(tuple(self.held_ids), "".join(self.held_text), tuple(self.held_logprobs), self.index)
        self.held_ids, self.held_text, self.held_logprobs = [], [], []
        self.deltas += 1
        self.last_delta = now
        return [delta]

    def end(self, reason: FinishReason) -> list[Event]:
        """End this completion: whatever tokens were held, then its Final."""
        return [*self.take_held(time.perf_counter()), self.finish(reason)]

    def end_whole(self, reason: FinishReason) -> list[Event]:
        """End a request that never started (queued): one Final for all its completions."""
        self.completions.remaining = 1
        return self.end(reason)

    def forks(self, tokenizer: Tokenizer, spec: ModelSpec) -> list[Sequence]:
        """Completions 1 to n - 1 of this request, decoded from copies of its prefilled state."""
        return [
            Sequence(self.request, self.handle, tokenizer, spec, index, self.completions)
            for index in range(1, self.request.n)
        ]

    def timings(self, now: float, first_token: float | None) -> Timings:
        """Its Final's milliseconds from arrival to admission, the first token and `now` (perf_counter;
        an event that has not happened yet is `now`'s)."""
        ms = lambda t: round(1000.0 * ((t if t is not None else now) - self.arrival), 3)
        return Timings(ms(self.admitted), ms(first_token), ms(now))

    def finish(self, reason: FinishReason) -> Final:
        """The Final: the last text, usage and timings (end() hands on the held tokens before it)."""
        now = time.perf_counter()
        done = self.completions
        done.remaining -= 1
        if self.lookup is not None:
            done.proposed, done.accepted = done.proposed + self.lookup.proposed, done.accepted + self.lookup.accepted
            done.speculated = True
        self.final = Final(
            reason,
            self.stream.finish(),
            Usage(len(self.request.prompt_ids), len(self.generated), self.cached_tokens),
            self.timings(now, self.first_token),
            self.prompt_logprobs,
            self.index,
            done.remaining,
            speculated=(done.proposed, done.accepted) if done.speculated else None,
        )
        return self.final
