"""The engine core: the model's session, its KV arena, the scheduler and sampling, loaded once.

`load_model` builds what an engine runs on from a ServerConfig; the Server runs it in a thread
of its own process (`--engine-core thread`) or `run_core` runs it in a process of its own
(`--engine-core process`, started by engine_client.py). There the engine thread steps as
always, but writes each step's events to the front end itself, as one message on the channel's
socket (core_channel.py, core_protocol.py), so no event loop in this process wakes per token and
none shares its GIL; the main thread only receives requests, cancels, aborts and the stop. Metrics
live in the front end: the core records the engine's observations and sends them with the step.
No gRPC here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.domain import Draining, FinishReason, QueueFull, ends_request
from ..engine.engine import Engine, EngineLimits, EngineObserver, ForwardingObserver
from ..engine.sequence import Event, Sequence
from ..runtime.arena_runner import ArenaRunner
from ..runtime.contract import Manifest, ModelDirError
from ..runtime.model_runner import ModelRunner, ProviderError
from ..runtime.runners import arena_capacity, open_slot_runner
from ..tokenizer import Tokenizer, TokenizerError, from_model_dir
from .config import ServerConfig
from .core_channel import Channel, ChannelClosed, connect
from .core_protocol import (
    INBOUND_DECODER,
    Abort,
    Cancel,
    Failed,
    Ready,
    Step,
    Stop,
    Submit,
    to_wire,
)

log = logging.getLogger("attnserve.core")

PARENT_CHECK_MS = 500  # how often an idle core checks that the front end that started it still lives
OBSERVATIONS_WAIT_S = 0.05  # the longest a step's observations wait for a Step message with events in it


class StartupError(Exception):
    """The server cannot start; the message is the one-line reason."""


@dataclass
class LoadedModel:
    runner: ModelRunner
    tokenizer: Tokenizer
    capacity: int  # KV arena slots
    slots: ArenaRunner


def load_tokenizer(model_dir: Path, manifest: Manifest) -> Tokenizer:
    """The model directory's tokenizer; raises StartupError naming the directory."""
    try:
        tokenizer = from_model_dir(model_dir, manifest.tokenizer)
    except TokenizerError as e:
        raise StartupError(f"{model_dir}: {e}") from None
    tokenizer.decode_stream()  # a BPE's byte table (byte_stream.py) is made now, not at the first request
    return tokenizer


def load_model(config: ServerConfig) -> LoadedModel:
    """The session, tokenizer and arena of config.model; raises ModelDirError, ProviderError or StartupError."""
    spinning = {"on": True, "off": False}.get(config.intra_op_spinning)  # auto: None, by the model's size
    runner = ModelRunner(config.model, config.provider, config.threads, not config.no_cuda_graphs, spinning)
    tokenizer = load_tokenizer(runner.model_dir, runner.manifest)
    try:
        capacity = arena_capacity(runner, config.max_batch, config.kv_cache_memory)
        prefix = config.prefix_cache == "on"
        slots = open_slot_runner(runner, capacity, config.prefill_chunk, prefix, config.prefix_cache_memory)
    except ValueError as e:
        raise StartupError(str(e)) from None
    return LoadedModel(runner, tokenizer, capacity, slots)


class SlowSteps(ForwardingObserver):
    """TEST ONLY ($ATTNSERVE_TEST_STEP_DELAY_MS): every engine step with a batch sleeps `ms` after
    reporting to `inner`, so that a test outside the process finds generations still running."""

    def __init__(self, inner: EngineObserver, ms: int):
        super().__init__(inner)
        self.seconds = ms / 1000.0

    def on_step(self, batch_size: int, queue_depth: int) -> None:
        self.inner.on_step(batch_size, queue_depth)
        if batch_size:
            time.sleep(self.seconds)


class Recorder(EngineObserver):
    """The engine's observations since the last Step message: (hook name, arguments). A finish is not
    one of them: its Final is among the step's events, and the front end counts it from there."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[Any, ...]]] = []
        self.since = 0.0  # when the oldest of `seen` was recorded (perf_counter)

    def age(self) -> float:
        """Seconds the oldest observation not yet taken has waited (0 with none)."""
        return time.perf_counter() - self.since if self.seen else 0.0

    def on_step(self, batch_size: int, queue_depth: int) -> None:
        self.record("on_step", (batch_size, queue_depth))

    def on_tokens(self, first: list[float], inter: list[float]) -> None:
        self.record("on_tokens", (first, inter))

    def on_prefix_cache(self, hits: int, misses: int, saved: int, held_bytes: int) -> None:
        self.record("on_prefix_cache", (hits, misses, saved, held_bytes))

    def record(self, hook: str, arguments: tuple[Any, ...]) -> None:
        if not self.seen:
            self.since = time.perf_counter()
        self.seen.append((hook, arguments))

    def take(self) -> list[tuple[str, tuple[Any, ...]]]:
        seen, self.seen = self.seen, []
        return seen


class RemoteCaller:
    """A request of the front end's, known here by its key."""

    __slots__ = ("cancelled", "finished", "key", "request")

    def __init__(self, key: int, request: Any):
        self.key, self.request = key, request
        self.cancelled = self.finished = False

    def cancel(self) -> None:
        self.cancelled = True


class CoreEngine(Engine):
    """The Engine, delivering each step's events as one Step message on `channel` (the engine thread writes it)."""

    def __init__(self, loaded: LoadedModel, config: ServerConfig, channel: Channel):
        self.recorder = Recorder()
        delay = config.test_step_delay_ms
        observer = SlowSteps(self.recorder, delay) if delay else self.recorder
        # The front end keeps the queue's bound (requests in flight <= slots + --max-queue): here the queue
        # may also hold what it accepted before this engine admitted the requests ahead of them.
        # Slow readers are the front end's too.
        limits = EngineLimits(loaded.capacity, config.max_queue + loaded.capacity, max_buffered=0)
        super().__init__(loaded.slots, loaded.tokenizer, limits, observer)
        self.channel = channel
        self.callers: dict[int, RemoteCaller] = {}  # key -> request not yet finished
        self._pending: list[Sequence | tuple[RemoteCaller, Exception]] = []  # endings from the main thread

    def take(self, key: int, request: Any) -> None:
        """A Submit (main thread): queue it, or have the engine thread answer with the refusal
        (QueueFull, Draining, no room in the context)."""
        caller = self.callers[key] = RemoteCaller(key, request)
        try:
            self.enqueue(caller)
        except (QueueFull, Draining, ValueError) as e:
            self._hand_over((caller, e))

    def cancel(self, key: int) -> None:
        """A Cancel (main thread): a queued request ends CANCELLED at once, a running one at the next step.
        Every request the front end sent ends with an event: its count of requests in flight stays exact."""
        caller = self.callers.get(key)
        if caller is None:
            return  # already finished
        with self._cond:
            queued = next((s for s in self._queue if s.handle is caller), None)
            if queued is None:
                caller.cancel()  # in the batch or its prefill: dropped (CANCELLED) at the next step boundary
                return
            self._queue.remove(queued)
        self._hand_over(queued)

    def _hand_over(self, item: Sequence | tuple[RemoteCaller, Exception]) -> None:
        """An ending for the engine thread to send (it alone touches the outbox and the socket)."""
        with self._cond:
            self._pending.append(item)
            self._cond.notify()

    def _idle(self) -> bool:
        return super()._idle() and not self._pending

    def _news(self, admits: bool) -> bool:
        return super()._news(admits) or bool(self._pending)

    def _step(self) -> None:
        with self._cond:
            pending, self._pending = self._pending, []
        for item in pending:
            if isinstance(item, Sequence):
                self._emit(item, item.end_whole(FinishReason.CANCELLED))
            else:
                self._outbox.append(item)
        super()._step()

    def _flush(self) -> None:
        """This step's events and the observations since the last message as one Step message. A step
        with no event (every request holds its tokens for its stream interval, or only for its end)
        sends nothing unless its observations have waited OBSERVATIONS_WAIT_S or the engine goes idle."""
        stats = self.stats()
        if not self._outbox:
            busy = stats["active"] or stats["queued"]
            if not self.recorder.seen or (busy and self.recorder.age() < OBSERVATIONS_WAIT_S):
                return
        events = [(self._key(caller, event), to_wire(event)) for caller, event in self._outbox]
        self._outbox = []
        with contextlib.suppress(OSError):  # the front end is gone: the main thread sees the channel close
            self.channel.send(Step(events, self.recorder.take(), stats["active"]))

    def _key(self, caller: Any, event: Event) -> int:
        """The caller's key; a request whose last event this is leaves `callers`."""
        if ends_request(event):
            caller.finished = True
            self.callers.pop(caller.key, None)
        return caller.key


def run_core(config: ServerConfig, path: str) -> None:
    """The engine core process's main: connect to the front end's socket at `path`, load, say Ready (or
    Failed), then serve messages until Stop.

    SIGINT and SIGTERM are ignored: a terminal's Ctrl-C and systemd's stop reach every process of the
    group, and the front end drains first, then sends Stop. A front end that is gone stops it too."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    channel = connect(path, INBOUND_DECODER)
    try:
        loaded = load_model(config)
    except (ModelDirError, ProviderError, StartupError) as e:
        channel.send(Failed(type(e).__name__, str(e)))
        channel.close()
        return
    engine = CoreEngine(loaded, config, channel)
    channel.send(
        Ready(
            loaded.runner.provider,
            loaded.capacity,
            loaded.slots.nbytes,
            loaded.runner.provider_note,
            loaded.slots.prefix_bytes,
            loaded.runner.threads,
        )
    )
    engine.start()
    try:
        serve_messages(engine, channel)
    finally:
        engine.stop()
        channel.close()


def serve_messages(engine: CoreEngine, channel: Channel) -> None:
    """Until Stop (or the front end is gone): submits, cancels and aborts, as they come."""
    parent = os.getppid()
    while True:
        if not channel.wait(PARENT_CHECK_MS / 1000):
            if os.getppid() != parent:
                log.warning("the front end is gone; the engine core stops")
                return
            continue
        try:
            messages = channel.take()
        except ChannelClosed:
            log.warning("the front end closed the channel; the engine core stops")
            return
        for message in messages:
            if isinstance(message, Submit):
                engine.take(message.key, message.request)
            elif isinstance(message, Cancel):
                engine.cancel(message.key)
            elif isinstance(message, Abort):
                engine.abort()
            elif isinstance(message, Stop):
                return
