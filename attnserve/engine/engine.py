"""Continuous-batching scheduler over a slot runner. Knows nothing about gRPC, ONNX Runtime, KV
layouts or devices.

The engine holds request keys, token ids and logits, and sees a model only through the seam in
seam.py: a ModelSpec and a SlotRunner, which holds every tensor (arena_runner.py serves;
benchmarks/kv.py also drives benchmarks/concat_runner.py; tests/test_engine.py a fake). Decoder-only and
encoder-decoder models run the same loop (an encoder-decoder's prompt is its source; its decoder
starts from BOS).

One engine thread owns the runner. At every step boundary it drops cancelled and expired requests,
starts queued ones in the runner's free slots (highest priority first, then in arrival order; a request
of n completions when n slots are free: its prompt is prefilled once and the runner copies the slot to
the other n - 1; a beam search request of k beams likewise, its k slots a beam group, beam_group.py),
runs one round of prefill (fresh prompts together, one chunk of a long one), runs one decode step for
the whole batch, and hands each request's rows to its search (search.py: a completion's own, one slot; a
beam group's, k slots; routed by the slot's owner, never by its type): every plain greedy row's token is
the batch's one argmax, every sampled one the runner's batched pass picked or its sampler picks on the
host (a grammar's masked ids; a row the pass could not hold). The step's events go to its outbox
(outbox.py: the callers' event loops, one call_soon_threadsafe per loop a step; or the engine core's
channel, core/step_writer.py). A caller on another thread ends a request at once with release
(cancelled) or refuse (an error); the engine thread sends those endings at its next turn. While every
row is greedy (plain, or with bans that stay: ignore_eos) or drawn by a PassRow that only its uniform
number and its penalties' ids change (sampling, logprobs, a bias, penalties: no grammar) and no prompt
waits, the runner runs up to MAX_BURST decode steps back to back instead (burst.py: each request takes
its tokens when its Delta falls due; the step boundary's work waits for the burst's end). A request's
deltas go on at its stream interval (its Sequence holds the tokens in between; a unary call's go with
its end), so a paced stream wakes its caller, and crosses to the front end from the engine core's
process, once per message, not once per token: the interval is paced here alone. With
--speculative-config, a request proposes its next ids by prompt lookup (speculation.py) or a draft
model's greedy steps (drafting.py), and a step verifies them instead (SlotRunner.verify), the request
taking 1 to k + 1 tokens in it, each the one it picks without speculation. ONNX Runtime releases the GIL
while it runs.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from ..tokenizer import Tokenizer
from .ahead_rule import runs_ahead
from .beam_group import BeamGroup, BeamMember
from .burst import Burst, BurstDraws
from .domain import Draining, Final, FinishReason, GenerationRequest, QueueFull
from .drafting import Drafts
from .outbox import LoopOutbox, Outbox
from .seam import Logits, SlotRunner
from .search import Search
from .sequence import Caller, Event, Handle, Sequence, fits
from .speculation import FIRST_PAUSE, Lookup, Speculation
from .step_costs import StepCosts
from .step_plan import StepPlan, plan_decode

log = logging.getLogger(__name__)

DRAINING = "the server is shutting down and takes no new requests"
# Decode steps the runner runs back to back while every request is greedy or drawn (burst.py): the engine's own
# step (admission, cleanup) once per burst; a cancel, an arrival or an abort ends a burst after its step, a
# request's end or a Delta due by time after the step that makes it, so the bound only spares step boundaries
# where nothing happens (128 measured faster than 8: docs/design/decisions/max-burst.md).
MAX_BURST = 128


def queue_full(max_queue: int) -> QueueFull:
    return QueueFull(f"the queue is full ({max_queue} requests waiting, --max-queue); retry later")


@dataclass(frozen=True)
class EngineLimits:
    """The engine's share of ServerConfig (its defaults live there, once)."""

    max_batch: int  # requests decoded together in one step
    max_queue: int | None  # requests waiting for a batch slot before submit raises QueueFull; None: no bound
    max_buffered: int  # deltas a caller may leave unread before its request is dropped; 0: no cap
    speculation: Speculation | None  # --speculative-config: prompt lookup or a draft model (speculation.py); None: off
    run_ahead: str  # --run-ahead: auto, on or off (a burst's next step run while the engine takes the last's)
    max_waiting_steps: int  # --max-waiting-steps: decode steps a request may wait to start (0: none)


class EngineObserver:
    """What the engine reports as it runs (metrics subclass it); every hook is a no-op here."""

    def on_submit(self, request: GenerationRequest) -> None:
        """A request was accepted (queued), on the caller's side."""

    def on_step(self, batch_size: int, queue_depth: int) -> None: ...
    def on_tokens(self, first: list[float], inter: list[float]) -> None:
        """One run's token gaps in seconds, once per prefill round or decode step (not per token): from
        arrival to the first token of requests that got theirs, from the previous token for the rest."""

    def on_finish(self, final: Final, request: GenerationRequest | None = None) -> None:
        """A request (or one of its completions) ended: its Final, as the engine emits it, and the request."""

    def on_prefix_cache(self, hits: int, misses: int, saved: int, held_bytes: int) -> None:
        """A prefill round's prefix-cache lookups and the bytes it holds after them (seam.PrefixReport)."""

    def on_speculation(self, proposed: int, accepted: int) -> None:
        """A verification step's proposed ids, and how many of them were kept (speculation.py)."""

    def on_spans_dropped(self, count: int) -> None:
        """The engine core's process dropped `count` trace spans (its export queue was full, or the
        collector failed them); the front end's own drops are its tracing's."""


class ForwardingObserver(EngineObserver):
    """Passes every report on to `inner`; a subclass adds to the hooks it overrides."""

    def __init__(self, inner: EngineObserver):
        self.inner = inner

    def on_submit(self, request: GenerationRequest) -> None:
        self.inner.on_submit(request)

    def on_step(self, batch_size: int, queue_depth: int) -> None:
        self.inner.on_step(batch_size, queue_depth)

    def on_tokens(self, first: list[float], inter: list[float]) -> None:
        self.inner.on_tokens(first, inter)

    def on_finish(self, final: Final, request: GenerationRequest | None = None) -> None:
        self.inner.on_finish(final, request)

    def on_prefix_cache(self, hits: int, misses: int, saved: int, held_bytes: int) -> None:
        self.inner.on_prefix_cache(hits, misses, saved, held_bytes)

    def on_speculation(self, proposed: int, accepted: int) -> None:
        self.inner.on_speculation(proposed, accepted)

    def on_spans_dropped(self, count: int) -> None:
        self.inner.on_spans_dropped(count)


Slot = Sequence | BeamMember  # what holds a key's slot: a completion, or one beam of a beam group (its owner searches)


def dropped_for(holder: Slot, now: float, abort: bool) -> FinishReason | None:
    """Why the step boundary ends an active request (Engine._drop_gone): CANCELLED on an abort or its caller
    gone, DEADLINE past its deadline (`now`: monotonic); None: it goes on."""
    if abort or holder.handle.cancelled:
        return FinishReason.CANCELLED
    return FinishReason.DEADLINE if holder.expired(now) else None


class EngineCalls(Protocol):
    """What the front doors and the server call of an engine: the Engine here, in the server's process,
    or core/client.py's EngineClient, whose engine core runs in a process of its own."""

    observer: EngineObserver  # where its steps, tokens and finishes are reported

    def start(self) -> None: ...
    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> Handle: ...
    def submit_together(
        self, requests: Collection[GenerationRequest], loop: asyncio.AbstractEventLoop | None = None
    ) -> list[Handle]:
        """Queue requests at once, all or none: one step boundary admits them together where the batch
        has room (the start-up warm-up's whole batch). Raises what submit does."""

    def check_room(self) -> None:
        """Raise what submit would (Draining, QueueFull, EngineUnavailable) if no request could join now:
        a door asks before it reads a request, so that a refusal under overload costs no parsing."""

    def release(self, handle: Handle) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...
    def stop(self, timeout: float = 10.0) -> None: ...


class Engine:
    """Owns the slot runner and the queue; callers submit and await events (or enqueue callers of their
    own, whose events go to `outbox`: the engine core's process does)."""

    def __init__(
        self,
        slots: SlotRunner,
        tokenizer: Tokenizer,
        limits: EngineLimits,
        observer: EngineObserver | None = None,
        outbox: Outbox | None = None,
        draft: SlotRunner | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        """`draft`: the draft model's runner, with a speculation whose method is draft_model (drafting.py).
        `clock`: what times decode steps for speculation's costs (step_costs.py; a test's is its fake's)."""
        self.slots, self.tokenizer, self.limits = slots, tokenizer, limits
        self.clock, self.costs = clock, StepCosts()
        # with a draft model (whose worth is the pair's more than a request's), a new request goes on where
        # the last one's speculation ended: what was left of its pause, and the pause its next misses bring;
        # prompt lookup's requests start unpaused at FIRST_PAUSE each
        self.next_pause, self.pause_left = FIRST_PAUSE, 0
        speculation = limits.speculation
        assert (draft is not None) == (speculation is not None and speculation.model is not None), "a draft model"
        self.drafts = Drafts(draft, speculation.num_speculative_tokens) if draft and speculation else None
        self.spec = slots.spec
        self.observer = observer or EngineObserver()
        self.outbox = outbox or LoopOutbox()
        self._keys = itertools.count()
        self._queue: collections.deque[Sequence] = collections.deque()
        self._steps = 0  # decode steps run (each of a burst's, each verification): what --max-waiting-steps counts
        self._active: dict[int, Slot] = {}  # request key -> decoding sequence (or beam)
        self._prefilling: dict[int, Slot] = {}  # request key -> sequence (or beam) whose prompt is being prefilled
        self._cond = threading.Condition()
        self._outbox: list[tuple[Caller, Event]] = []
        # ended by a caller's thread, sent by ours: released queued requests, and refusals
        self._released: list[Sequence] = []
        self._refused: list[tuple[Caller, Exception]] = []
        self._failed: dict[int, Caller] = {}  # id -> the caller of a request whose own work raised this step
        self._accepting, self._running, self._abort = True, False, False
        self._thread = threading.Thread(target=self._run, name="attnserve-engine", daemon=True)

    # ---- caller side (any thread, usually the event loop) -------------------------------
    def start(self) -> None:
        self._running = True
        self._thread.start()

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> Handle:
        """Queue a validated request; raises QueueFull or Draining (checked first as well, so that a
        refusal under overload costs no sampler or detokenizer)."""
        return self.submit_together((request,), loop)[0]

    def submit_together(
        self, requests: Collection[GenerationRequest], loop: asyncio.AbstractEventLoop | None = None
    ) -> list[Handle]:
        """Queue validated requests at once, all or none (EngineCalls.submit_together)."""
        with self._cond:
            self._check_room(len(requests))
        loop = loop or asyncio.get_running_loop()
        handles = [Handle(request, loop, self.limits.max_buffered) for request in requests]
        self.enqueue(*handles)
        for request in requests:
            self.observer.on_submit(request)
        return handles

    def check_room(self) -> None:
        """Raise Draining or QueueFull if no request could be queued now (what a door asks first)."""
        with self._cond:
            self._check_room()

    def enqueue(self, *callers: Caller) -> None:
        """Queue each `caller.request`, all under one hold of the lock (the next step boundary sees them
        all); their events go to the callers through the outbox. Raises QueueFull or Draining, queueing
        none. The requests were validated: each prompt leaves room in the context (the front end's
        validation is the one check of that; here it is an invariant)."""
        for caller in callers:
            assert fits(caller.request, self.spec), "validation lets no request through that the context cannot hold"
        sequences = [Sequence(caller.request, caller, self.tokenizer, self.spec) for caller in callers]
        with self._cond:
            self._check_room(len(sequences))
            for sequence in sequences:
                self._queue_up(sequence)
            self._cond.notify()

    def _queue_up(self, sequence: Sequence) -> None:
        """Behind every queued request of its priority or higher, before the lower ones (hold the lock)."""
        place = len(self._queue)
        while place and self._queue[place - 1].request.priority < sequence.request.priority:
            place -= 1
        self._queue.insert(place, sequence)
        sequence.queued_step = self._steps

    def _check_room(self, count: int = 1) -> None:
        """Raise Draining or QueueFull unless `count` requests may join the queue now (hold the lock)."""
        if not self._accepting:
            raise Draining(DRAINING)
        if self.limits.max_queue is not None and len(self._queue) + count > self.limits.max_queue:
            raise queue_full(self.limits.max_queue)

    def release(self, caller: Caller) -> None:
        """The caller is gone: a queued request ends CANCELLED at once, a running one at the next step
        boundary. Either way its Final goes out (counted; the engine core's front end counts on it)."""
        if caller.finished:
            return
        with self._cond:
            queued = next((s for s in self._queue if s.handle is caller), None)
            if queued is not None:
                self._queue.remove(queued)
                self._released.append(queued)  # the engine thread alone touches the outbox
                self._cond.notify()
        caller.cancel()  # not queued: running, dropped at the next step boundary

    def refuse(self, caller: Caller, error: Exception) -> None:
        """End `caller`'s request, never queued, with `error` as its only event (a refusal found on a
        thread other than the caller's: the engine core's Submit)."""
        with self._cond:
            self._refused.append((caller, error))  # the engine thread alone touches the outbox
            self._cond.notify()

    def stats(self) -> dict[str, int]:
        """Active (in the batch or its prefill) and queued request counts."""
        with self._cond:
            return {"active": len(self._active) + len(self._prefilling), "queued": len(self._queue)}

    def close(self) -> None:
        """Refuse new requests (Draining); queued and active ones go on."""
        with self._cond:
            self._accepting = False

    def abort(self) -> None:
        """End every queued and active request at the next step with FinishReason.CANCELLED."""
        with self._cond:
            self._abort = True
            self._cond.notify()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort everything and join the engine thread."""
        self.close()
        self.abort()
        with self._cond:
            self._running = False
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---- engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while self._running and self._idle():
                    self._cond.wait()
                if not self._running and not self._active and not self._prefilling and not self._queue:
                    break
            try:
                self._step()
            except Exception as e:
                log.exception("engine step failed; failing %d active requests", len(self._active))
                self._fail_active(e)
            self._flush()

    def _idle(self) -> bool:
        """Nothing to do until a caller acts (hold the lock)."""
        return not (self._queue or self._active or self._prefilling or self._abort or self._released or self._refused)

    def _step(self) -> None:
        """One step boundary: send endings, drop finished callers, admit, prefill, then decode the batch once."""
        self._send_endings()
        self._drop_gone()
        self._take_queued()
        # The step's queue as it is before its first events go: a Final sent now lets the caller's side send
        # another request, which would wait here beside a slot freed this step, past the queue's bound.
        queued = len(self._queue)
        if self._prefilling:
            self._prefill()
            queued = len(self._queue)
            self._flush()  # first tokens go out now, not after the next decode step
        self.observer.on_step(len(self._active), queued)
        if self._active:
            self._decode()
            if not self._active:  # the batch emptied: the gauges must not keep its last size
                self.observer.on_step(0, queued)
        self._free_failed()  # a request that failed before it held a slot (its holders could not be made)

    def _send_endings(self) -> None:
        """Released queued requests end CANCELLED; refused ones get their error."""
        with self._cond:
            released, self._released = self._released, []
            refused, self._refused = self._refused, []
        for sequence in released:
            self._emit(sequence, sequence.end_whole(FinishReason.CANCELLED))
        self._outbox.extend(refused)

    def _drop_gone(self) -> None:
        """Finish aborted, cancelled and expired requests and free their slots."""
        now = time.monotonic()
        with self._cond:
            abort, self._abort = self._abort, False
            dropped = list(self._queue) if abort else [s for s in self._queue if s.expired(now)]
            for sequence in dropped:
                self._queue.remove(sequence)
        for sequence in dropped:
            reason = FinishReason.CANCELLED if abort else FinishReason.DEADLINE
            self._emit(sequence, sequence.end_whole(reason))
        for key, holder in [*self._active.items(), *self._prefilling.items()]:
            if (why := dropped_for(holder, now, abort)) is not None:
                self._retire(key, holder, why)

    def _take_queued(self) -> None:
        """Start queued requests whose callers are still waiting, up to the runner's free slots, where they
        are admitted now (_admits_now)."""
        if not self._admits_now():
            return
        start = time.perf_counter()
        with self._cond:
            while self._queue and self.slots.free_slots() >= self._queue[0].request.slots:  # all, or it waits
                sequence = self._queue.popleft()
                if sequence.handle.cancelled:
                    self._emit(sequence, sequence.end_whole(FinishReason.CANCELLED))
                    continue
                keys = [next(self._keys) for _ in range(sequence.request.slots)]
                sequence.admitted = start
                try:
                    holders = self._holders(sequence, keys)
                except Exception as error:  # noqa: BLE001 -- its own (a grammar's matcher): it alone fails, unstarted
                    self._fail_alone(sequence, error)
                    continue
                wants_rows = sequence.request.prompt_logprobs is not None
                # an encoder-decoder's prompt is its source; each fork's slot is a copy of the prefilled one
                self.slots.start(keys[0], sequence.request.prompt_ids, wants_rows, tuple(keys[1:]))
                self._prefilling.update(zip(keys, holders))

    def _admits_now(self) -> bool:
        """Whether queued requests are admitted at this step boundary: always where nothing decodes or with
        --max-waiting-steps 0; else once the one queued longest has waited that many decode steps, or the
        queue holds as many requests as the batch decodes (TGI's max_waiting_tokens, and its
        waiting_served_ratio at 1). A prefill round pauses every decoding request; where a run's cost is
        mostly its own (a GPU's kernel launches) rather than its tokens', arrivals admitted together pay
        it once."""
        wait = self.limits.max_waiting_steps
        if not wait or not self._active or not self._queue or len(self._queue) >= len(self._active):
            return True
        return self._steps - min(sequence.queued_step for sequence in self._queue) >= wait

    def _holders(self, sequence: Sequence, keys: list[int]) -> list[Slot]:
        """What holds each of an admitted request's slots: its completions (1 to n - 1 forks of it), or
        the beams of its group."""
        if sequence.request.beams is not None:
            return list(BeamGroup(sequence, keys, self.tokenizer).members)
        forks = sequence.forks(self.tokenizer, self.spec)
        for fork in forks:
            fork.arrival, fork.admitted = sequence.arrival, sequence.admitted
        if self.limits.speculation is not None:
            for each in (sequence, *forks):
                each.speculate(self.limits.speculation, self.spec, self.next_pause, self.pause_left)
        return [sequence, *forks]

    def _prefill(self) -> None:
        """One round of prefill; every request whose prompt completed takes its first token."""
        logits = self.slots.prefill()
        with self._cond:
            sequences = [self._prefilling.pop(key) for key in logits.keys]
            self._active.update(zip(logits.keys, sequences))
        for key, sequence in zip(logits.keys, sequences):
            if key in logits.prompts:
                try:
                    sequence.take_prompt(logits.prompts[key])
                except Exception as error:  # noqa: BLE001 -- one request's own work: it alone fails (logged)
                    self._fail_alone(sequence, error)
            sequence.cached_tokens = logits.cached.get(key, 0)
        if logits.prefix is not None:
            r = logits.prefix
            self.observer.on_prefix_cache(r.hits, r.misses, r.saved, r.held_bytes)
        gaps = self._advance(logits, sequences)
        if gaps:
            self.observer.on_tokens(gaps, [])
        self._free_failed()

    def _decode(self) -> None:
        """The step's plan (step_plan.py), carried out: one token for every decoding request, a burst of
        steps while every request is greedy (with at most bans that stay) and no prompt waits for its next
        prefill round, or with --speculative-config a verification of the requests' proposals while at most
        its disable_by_batch_size decode (speculation.py)."""
        speculation, batch = self.limits.speculation, len(self._active)
        speculate = speculation is not None and batch <= speculation.disable_by_batch_size
        probe = speculate and self.costs.probe(batch)  # one plain step, timed (step_costs.py)
        start = self.clock()
        proposals = self._proposals() if speculate and not probe else {}
        plan = plan_decode(self._active, bool(self._prefilling), proposals)
        if plan.proposals:
            self._decode_speculated(plan, start)
            return
        unproposed = self._unproposed() if speculate and not probe else []
        if plan.burst:
            steps = 1 if probe else max(1, min([lookup.pause for lookup in unproposed], default=MAX_BURST))
            self._decode_burst(plan, steps)
            return
        logits = self.slots.decode(plan.next_ids, plan.sampled, plan.passes, plan.bans)
        self._steps += 1
        self.costs.ran_plain(batch, self.clock() - start)
        self.observer.on_tokens([], self._advance(logits, [self._active[key] for key in logits.keys]))
        for lookup in unproposed:
            lookup.passed(1)
        self._free_failed()

    def _proposals(self) -> dict[int, tuple[int, ...]]:
        """Each completion's proposal (its lookup's, or the draft model's where it is not paused); none
        while a beam decodes (a beam search takes no part in a verification: its slots have no lookup)."""
        if any(holder.lookup is None for holder in self._active.values()):
            return {}
        sequences = cast(dict[int, Sequence], self._active)
        if self.drafts is None:
            return {key: proposal for key, sequence in sequences.items() if (proposal := sequence.proposal())}
        rooms = {}
        for key, sequence in sequences.items():
            lookup = sequence.lookup
            most = self.drafts.room(lookup.tokens, sequence.room()) if lookup and not lookup.pause else 0
            if lookup and most > 0:
                rooms[key] = (lookup.tokens, most)
        return self.drafts.propose(rooms)

    def _unproposed(self) -> list[Lookup]:
        """The lookups of a step that verifies nothing (speculation.Lookup): one not paused counts a miss
        (a workload that repeats nothing pauses its lookups; greedy then runs in bursts as long as the
        shortest pause)."""
        holders = self._active.values()
        lookups = [h.lookup for h in holders if h.lookup is not None]
        for lookup in lookups:
            if not lookup.pause:
                lookup.record(0, 0)
        return lookups

    def _decode_speculated(self, plan: StepPlan, start: float) -> None:
        """One verification (SlotRunner.verify): each request picks its next token as a step would (its
        row's argmax, or its sampler's pick from its row: the same seeded draw), and goes on to the token
        after its next proposal while the one it picked is that proposal, until it ends; the runner
        forgets the positions of the proposals it did not keep (and so does the draft's). For proposals of
        one id each (prompt lookup's, a draft's greedy ids) this is rejection sampling exactly: a proposal
        is kept with the target's probability of it, and a rejected one's replacement is drawn from the
        target without it. The step, from `start` (before its proposals were drafted), is timed against
        plain steps (step_costs.py)."""
        verified = self.slots.verify(plan.next_ids, plan.proposals, plan.sampled)
        self._steps += 1
        now = time.perf_counter()
        sequences = cast(dict[int, Sequence], dict(self._active))  # a verification's: every slot a completion
        gaps: list[float] = []
        taken: list[tuple[int, Sequence, int]] = []  # key, its completion, the proposals it kept
        for key, sequence in sequences.items():
            proposal = plan.proposals.get(key, ())
            rows = verified.rows.get(key)
            right = 0  # proposals kept
            try:  # its own work: its sampler, text and stops
                for index in range(len(proposal) + 1):
                    token = verified.tokens[key][index] if rows is None else sequence.pick(rows[index])
                    self._emit(sequence, sequence.advance(token, now))
                    gaps.append(sequence.token_gap)
                    if index == len(proposal) or token != proposal[index]:
                        break
                    right += 1
                    if sequence.done:
                        break
            except Exception as error:  # noqa: BLE001 -- one request's own work: it alone fails (logged)
                self._fail_alone(sequence, error)
                continue
            taken.append((key, sequence, right))
        paid = self.costs.verified(len(sequences), len(gaps), self.clock() - start)
        proposed = kept = 0
        for key, sequence, right in taken:
            proposal = plan.proposals.get(key, ())
            if sequence.lookup is not None:
                sequence.lookup.record(len(proposal), right, paid)
            proposed, kept = proposed + len(proposal), kept + right
            if sequence.done:
                self._free(key)
                continue
            if right < len(proposal):
                self.slots.rewind(key, len(proposal) - right)
            if self.drafts is not None and sequence.lookup is not None:
                self.drafts.keep(key, len(sequence.lookup.tokens) - 1)
        self.observer.on_tokens([], gaps)
        self.observer.on_speculation(proposed, kept)
        self._free_failed()

    def _decode_burst(self, plan: StepPlan, steps: int) -> None:
        """Up to `steps` (at most MAX_BURST, and none past the nearest budget's end) decode steps of `plan`
        run back to back by the runner (a key in its `bans` never takes one of its bans: ignore_eos; a key
        in its `draws` takes its PassRow's pick: BurstDraws); after
        each, the requests whose Delta falls due take their tokens (burst.py) and the step's events go on.
        The burst ends after a step where a request ended or picked an ending id, where a stream's ms
        interval or a deadline passed, or where a cancel, an abort or a request to admit needs the
        scheduler. Run ahead (ahead_rule.py says when), the runner runs each step while the engine takes
        the one before: where the burst ends, the step after it has run, and is taken by the requests that
        go on; one that ended, or that the step boundary ends (cancelled, expired, aborted), never shows it."""
        # a burst runs only while every slot is greedy or drawn: every slot a completion (a beam never is)
        sequences = cast(dict[int, Sequence], dict(self._active))
        steps = min(steps, *(sequence.left() for sequence in sequences.values()))  # none run ahead past a budget
        draws = BurstDraws(sequences, plan.draws) if plan.draws else None
        burst = Burst(sequences, self._emit, self._fail_alone, draws)
        due = min(sequence.due_by() for sequence in sequences.values())
        deadlines = [s.request.deadline for s in sequences.values() if s.request.deadline is not None]
        deadline = min(deadlines, default=math.inf)
        admits = self.slots.free_slots() > 0
        ahead, ending = runs_ahead(self.limits.run_ahead, sequences.values()), False  # ending: the burst ends

        def take(keys: list[int], tokens: np.ndarray) -> bool:
            nonlocal ending
            now = time.perf_counter()
            # a step taken after the burst was told to end is one the runner ran ahead: its last
            lag, ending = ending, True
            if self._take_step(burst, sequences, keys, tokens, now, lag) or lag:
                return True  # its events go with the step boundary's, after the ended are freed
            ending = ends_after(now)
            if self._outbox and (ahead or not ending):  # without run-ahead the boundary is next
                self._flush()
            return ending

        def ends_after(now: float) -> bool:
            """The burst ends after this step though no request ended in it."""
            if now >= due or time.monotonic() >= deadline or self._news(admits):
                return True
            return any(sequence.handle.cancelled for sequence in sequences.values())

        start = self.clock()
        ran = self.slots.decode_steps(plan.next_ids, steps, take, plan.bans, ahead, draws)
        self.costs.ran_plain(len(sequences), (self.clock() - start) / max(ran, 1))
        for sequence in sequences.values():
            if sequence.lookup is not None:
                sequence.lookup.passed(ran)
        burst.finish()
        self.observer.on_tokens([], burst.taken_gaps())
        for key, sequence in sequences.items():
            if sequence.done:
                self._free(key)
        self._free_failed()

    def _take_step(
        self, burst: Burst, sequences: dict[int, Sequence], keys: list[int], tokens: np.ndarray, now: float, lag: bool
    ) -> bool:
        """A burst step's tokens, taken by the requests due (burst.py); whether one ended or picked an id
        that may end it. `lag`: the step a runner ran ahead after the burst was told to end, its last
        (seam.SlotRunner): what the step boundary ends (cancelled, expired, aborted) never shows its token."""
        self._steps += 1
        if burst.times:  # the first step was reported before it ran
            self.observer.on_step(len(self._active), len(self._queue))
        if lag:
            monotonic = time.monotonic()
            abort = self._abort
            burst.close([key for key, each in sequences.items() if dropped_for(each, monotonic, abort) is not None])
        ended = burst.step(keys, tokens.tolist(), now)
        gaps = burst.taken_gaps()
        if gaps:
            self.observer.on_tokens([], gaps)
        return ended

    def _news(self, admits: bool) -> bool:
        """Something the scheduler must see before the next step: a queued request it can admit, an abort,
        an ending to send."""
        return (
            (admits and bool(self._queue) and self._admits_now())
            or self._abort
            or bool(self._released)
            or bool(self._refused)
        )

    def _advance(self, logits: Logits, holders: list[Slot]) -> list[float]:
        """Every search's rows (search.py: a completion's one, a beam group's k) taken by it, its events
        emitted, its cache copies made, its slots freed once it is done; the token gaps of the step.
        Every row's argmax is taken once for the batch where every row is plain greedy."""
        if not holders:
            return []
        now = time.perf_counter()
        picked = logits.tokens
        if picked is None and all(holder.plain_greedy for holder in holders):
            picked = logits.rows.argmax(axis=1)
        searches: dict[int, tuple[Search, dict[int, int]]] = {}  # id -> the search and its rows (key -> index)
        for row, (key, holder) in enumerate(zip(logits.keys, holders)):
            searches.setdefault(id(holder.owner), (holder.owner, {}))[1][key] = row
        gaps: list[float] = []
        for search, rows in searches.values():
            if id(search.handle) in self._failed:
                continue  # a completion of a request that failed this step
            try:  # its own work: its sampler or search, then its text and stops
                events, copies = search.take(logits, rows, picked, now)
            except Exception as error:  # noqa: BLE001 -- one request's own work: it alone fails (logged)
                self._fail_alone(search, error)
                continue
            for src, dst in copies:
                self.slots.copy_cache(src, dst)
            self._emit(search, events)
            gaps += search.token_gaps()
            if search.done:
                for key in rows:
                    self._free(key)
        return gaps

    def _fail_alone(self, holder: Slot | Search, error: Exception) -> None:
        """One request's own work raised (its sampler, grammar, text or beam search): that request alone ends
        with the error (INTERNAL at its door, the detail logged there) and the batch goes on; its slots are
        freed once the step's rows are taken (_free_failed). Every completion of it ends with it."""
        handle = holder.handle
        if id(handle) in self._failed:
            return
        log.error("request %r failed in its own work; it alone ends", handle.request.request_id, exc_info=error)
        self._failed[id(handle)] = handle
        self._outbox.append((handle, error))

    def _free_failed(self) -> None:
        """Free the slots of the requests that failed alone in this step."""
        if not self._failed:
            return
        for key, holder in [*self._active.items(), *self._prefilling.items()]:
            if id(holder.handle) in self._failed:
                self._free(key)
        self._failed.clear()

    def _retire(self, key: int, sequence: Slot, reason: FinishReason) -> None:
        self._emit(sequence, sequence.end(reason))
        self._free(key)

    def _free(self, key: int) -> None:
        holder = self._active.get(key)
        if self.drafts is not None and holder is not None and holder.lookup is not None:
            self.next_pause, self.pause_left = holder.lookup.next_pause, holder.lookup.pause  # of the draft
        self.slots.release(key)
        if self.drafts is not None:
            self.drafts.release(key)
        with self._cond:
            self._active.pop(key, None)
            self._prefilling.pop(key, None)

    def _fail_active(self, error: Exception) -> None:
        """After a failed run: every active request gets the error, and the runner starts over."""
        self._failed.clear()
        failed = [s for s in [*self._prefilling.values(), *self._active.values()] if not s.done]
        handles = {id(s.handle): s.handle for s in failed}  # a beam group's slots share one caller
        self._outbox.extend((handle, error) for handle in handles.values())
        with self._cond:
            self._active.clear()
            self._prefilling.clear()
        self.slots.reset()
        if self.drafts is not None:
            self.drafts.reset()

    def _emit(self, sequence: Slot | Search, events: list[Event]) -> None:
        self._outbox.extend((sequence.handle, event) for event in events)
        final = sequence.final
        if final is not None and events and events[-1] is final:
            self.observer.on_finish(final, sequence.handle.request)

    def _flush(self) -> None:
        """Hand this step's events, maybe none, to the outbox (which asks the counts only if it needs them)."""
        events, self._outbox = self._outbox, []
        self.outbox.deliver(events, self.stats)
