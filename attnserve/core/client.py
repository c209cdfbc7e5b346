"""The front end's engine when the engine core runs in a process of its own (`--engine-core process`).

EngineClient answers the calls the servicers and the Server make of an Engine (submit, release,
stats, close, abort, start, stop) by talking to process.run_core over one Unix socket
(channel.py, protocol.py's messages). The core is started with multiprocessing's spawn
(a fork would copy gRPC's threads) and connects to the socket this front end listens on. A
receiver thread takes the core's Step messages (one per engine step; every one that waited, when it
looks less often than the core steps) and hands their events to the callers' event loops with one
call per loop, as the in-process engine does; the engine's observations go to the front end's
metrics there too. While requests are in flight it naps between looks for messages rather than
sleeping until the core's write wakes it (a wake would cost the core's engine thread ~30 us a
step), longer while this process's event loop is busy; but not while the core's threads take every
core, where the naps' wakes would take CPU from them (naps.py).

What the front end decides itself, so that a refusal costs no round trip: Draining once closed,
QueueFull once requests in flight fill the batch and the queue (the queue's one bound: the core's
engine has none), and slow readers (its Handles); the context budget was validation's. When the core dies,
every request in flight ends at once with EngineUnavailable (UNAVAILABLE), new ones are refused
the same way, and `on_death` is called: the Server then exits non-zero for its supervisor to
restart it (Kubernetes, systemd), the way vLLM's front end ends with its engine core.

A front end more (--api-server-count) `attach`es instead: it connects to the socket the core listens
on for it (channel.fronts_path), takes the same Ready, and never stops the core: its stop closes its
channel, and the core ends what it had sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import multiprocessing
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

from ..engine.domain import Draining, EngineUnavailable, Final, GenerationRequest, ends_request
from ..engine.engine import DRAINING, EngineObserver, queue_full
from ..engine.outbox import post
from ..engine.sequence import Event, Handle
from ..runtime.contract import ModelDirError
from ..runtime.model_sessions import usable_cores
from ..runtime.ort_session import CPU, ProviderError
from .channel import Channel, ChannelClosed, connect, listen
from .config import CoreConfig
from .loading import StartupError
from .naps import Naps, naps_pay
from .process import run_core
from .protocol import (
    OUTBOUND_DECODER,
    Abort,
    Cancel,
    Failed,
    Inbound,
    Ready,
    Step,
    Stop,
    Submit,
    SubmitTogether,
    from_wire,
)

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # loading a model: sha256 of its files, session creation, the arena
POLL_MS = 100  # how often the receiver looks at the core's process while no message comes
STOP_TIMEOUT_S = 10.0
EXIT_WAIT_S = 1.0  # after the core's end of the socket closed: how long to wait for its exit code
START_ERRORS: dict[str, type[Exception]] = {
    "ModelDirError": ModelDirError,
    "ProviderError": ProviderError,
    "StartupError": StartupError,
}


class RemoteHandle(Handle):
    """A Handle whose cancel() also tells the core (once), so that the slot frees at its next step."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, max_buffered: int, tell):
        super().__init__(request, loop, max_buffered)
        self._tell = tell

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._tell()


class AttachedCore:
    """The core's process as a front end more sees it (`attach`): not its child, so not its to join or
    kill; its channel closing is its end."""

    exitcode = None

    def is_alive(self) -> bool:
        return True

    def join(self, timeout: float | None = None) -> None:
        pass

    def kill(self) -> None:
        pass


class EngineClient:
    """An Engine's calls, served by an engine core process; raises StartupError (and the model's
    ModelDirError or ProviderError) when the core cannot start."""

    def __init__(
        self,
        config: CoreConfig,
        observer: EngineObserver,
        max_buffered: int,
        on_death: Callable[[str], None] | None = None,
        attach: str | None = None,
    ):
        """`max_buffered`: deltas a caller may leave unread before its request is dropped (Handle);
        `attach`: the socket of a running core's to connect to (a front end more) instead of starting one."""
        self.config, self.observer, self.on_death = config, observer, on_death
        self.max_buffered = max_buffered
        self.handles: dict[int, Handle] = {}  # key -> request in flight
        self._keys = itertools.count()
        self._lock = threading.Lock()  # the handles, and the order of what is sent to the core
        self._accepting, self._stopping = True, False
        self.died: str | None = None  # why the core is gone
        self._active = 0  # requests in the core's batch or its prefill, as of its last Step
        self.attached = attach is not None
        self._folder: str | None = None
        self._listener: socket.socket | None = None
        self._channel: Channel | None = None
        self.process: multiprocessing.process.BaseProcess | AttachedCore
        if attach is not None:
            self.process = AttachedCore()
            self._channel = connect(attach, OUTBOUND_DECODER)
        else:
            self._folder = tempfile.mkdtemp(prefix="attnserve-core-")
            self.path = str(Path(self._folder) / "core.sock")
            self._listener = listen(self.path)
            spawn = multiprocessing.get_context("spawn")
            self.process = spawn.Process(
                target=run_core, args=(config, self.path), name="attnserve-engine-core", daemon=True
            )
            self.process.start()
        try:
            self.ready = self._wait_ready()
        except BaseException:
            self._shut()
            raise
        self.capacity = self.ready.capacity
        self.pid: int = self.ready.pid  # the core says it: a front end more did not start it
        # Naps between looks for the core's messages, or sleeps in poll until each comes (naps.py).
        self.napping = naps_pay(self.ready.provider == CPU, self.ready.threads, usable_cores())
        log.info(
            "engine core ready in process %d (%d intra-op threads; the receiver %s)",
            self.pid,
            self.ready.threads,
            "naps between looks" if self.napping else "sleeps until each step comes",
        )
        self._receiver = threading.Thread(target=self._receive, name="attnserve-core-receiver", daemon=True)

    def _wait_ready(self) -> Ready:
        """The core's connection, then its Ready; raises its Failed's error or StartupError."""
        deadline = time.monotonic() + START_TIMEOUT_S
        if self._listener is not None:
            self._listener.settimeout(POLL_MS / 1000)
        while time.monotonic() < deadline:
            try:
                if self._channel is None:
                    assert self._listener is not None, "a core of its own connects to this front end's socket"
                    self._channel = Channel(self._listener.accept()[0], OUTBOUND_DECODER)
                elif self._channel.wait(POLL_MS / 1000) and (messages := self._channel.take()):
                    message = messages[0]  # the core sends nothing else before the front end's first request
                    if isinstance(message, Failed):
                        raise START_ERRORS.get(message.kind, StartupError)(message.message)
                    assert isinstance(message, Ready), "the core's first message is Ready or Failed"
                    return message
            except (TimeoutError, ChannelClosed):
                pass
            if not self.process.is_alive():
                self.process.join()
                raise StartupError(f"the engine core exited during start-up (exit code {self.process.exitcode})")
        raise StartupError(f"the engine core did not start within {START_TIMEOUT_S:.0f} s")

    # ---- the Engine's calls (the event loop's thread) -----------------------------------
    def start(self) -> None:
        self._receiver.start()

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> Handle:
        """Send a validated request to the core; raises EngineUnavailable, Draining or QueueFull."""
        return self.submit_together((request,), loop)[0]

    def submit_together(
        self, requests: Collection[GenerationRequest], loop: asyncio.AbstractEventLoop | None = None
    ) -> list[Handle]:
        """Send validated requests to the core in one message, all or none (EngineCalls.submit_together)."""
        loop = loop or asyncio.get_running_loop()
        submits: list[Submit] = []
        handles: list[Handle] = []
        for request in requests:
            key = next(self._keys)
            handles.append(RemoteHandle(request, loop, self.max_buffered, functools.partial(self._send, Cancel(key))))
            submits.append(Submit(key, request))
        with self._lock:
            self._check_room(len(submits))
            self.handles.update((submit.key, handle) for submit, handle in zip(submits, handles))
            self._channel_send(submits[0] if len(submits) == 1 else SubmitTogether(submits))
        for request in requests:
            self.observer.on_submit(request)
        return handles

    def check_room(self) -> None:
        """Raise EngineUnavailable, Draining or QueueFull if no request could be sent now."""
        with self._lock:
            self._check_room()

    def _check_room(self, count: int = 1) -> None:
        if self.died is not None:
            raise EngineUnavailable(self.died)
        if not self._accepting:
            raise Draining(DRAINING)
        if len(self.handles) + count > self.capacity + self.config.max_queue:
            raise queue_full(self.config.max_queue)

    def release(self, handle: Handle) -> None:
        """The caller is gone: the core drops its request at its next step."""
        if not handle.finished:
            handle.cancel()

    def stats(self) -> dict[str, int]:
        """Requests in the core's batch or its prefill, and the rest of those in flight."""
        in_flight = len(self.handles)
        active = min(self._active, in_flight)
        return {"active": active, "queued": in_flight - active}

    def close(self) -> None:
        self._accepting = False

    def abort(self) -> None:
        self._send(Abort())

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the core (it aborts what runs) and the receiver."""
        self._accepting = False
        self._stopping = True  # the core's exit from here on is the stop, not a death
        if not self.attached and self.process.is_alive():
            self._send(Stop())
            self.process.join(timeout)
        self._shut()

    def _shut(self) -> None:
        self._stopping = True
        if self.process.is_alive():
            self.process.kill()
            self.process.join(STOP_TIMEOUT_S)
        if self._receiver_started():
            self._receiver.join(STOP_TIMEOUT_S)
        if self._channel is not None:
            self._channel.close()
        if self._listener is not None:
            self._listener.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def _receiver_started(self) -> bool:
        receiver = getattr(self, "_receiver", None)
        return receiver is not None and receiver.ident is not None and receiver is not threading.current_thread()

    def _send(self, message: Inbound) -> None:
        with self._lock:
            self._channel_send(message)

    def _channel_send(self, message: Inbound) -> None:
        """Send to the core (hold the lock); a core that is gone is the receiver's news, not the sender's."""
        assert self._channel is not None, "the core connected before Ready"
        with contextlib.suppress(OSError):
            self._channel.send(message)

    # ---- the receiver thread --------------------------------------------------------------
    def _receive(self) -> None:
        """The receiver thread: its failure is the core's loss to this front end. A receiver that
        died silently would leave every request in flight waiting forever; instead they end with
        UNAVAILABLE and the server exits 1 for its supervisor, as when the core's process dies."""
        try:
            self._receive_steps()
        except Exception as e:  # whatever it was, nothing can reach the callers now
            log.exception("the engine core's receiver failed")
            self._core_died(
                f"the front end lost the engine core's messages ({type(e).__name__}: {e}); the server restarts"
            )

    def _receive_steps(self) -> None:
        """Every message that has come, handed on together; then, with requests in flight, none of them
        waiting for a slot, and naps paying, a nap (the core's next write finds nobody to wake;
        naps.py); otherwise a sleep until one comes: while requests wait, the server is saturated and
        callers are being refused, and the event loop needs the GIL more than the receiver needs to
        look early. The core's end of the socket closes when its process dies; a waiting receiver also
        looks at the process itself each POLL_MS."""
        assert self._channel is not None, "the core connected before Ready"
        naps = Naps()
        while not self._stopping:
            try:
                steps = [step for step in self._channel.take() if isinstance(step, Step)]
            except ChannelClosed:
                break
            if steps:
                self._take(steps)
            elif self.napping and 0 < len(self.handles) <= self.capacity:  # in flight, none waiting for a slot
                naps.nap()
            elif not self._channel.wait(POLL_MS / 1000) and not self.process.is_alive():
                break
        if not self._stopping:
            self.process.join(EXIT_WAIT_S)
            code = "its channel closed" if self.attached else f"exit code {self.process.exitcode}"
            self._core_died(f"the engine core died ({code}); the server restarts")

    def _take(self, steps: list[Step]) -> None:
        """Engine steps, in order: events to their callers' loops (one call per loop for them all),
        observations and every Final to metrics (before the events: a caller that sees its end sees
        it counted)."""
        ready: list[tuple[Handle, Event]] = []
        finals: list[tuple[Final, GenerationRequest | None]] = []
        with self._lock:
            for step in steps:
                for key, wire in step.events:
                    event = from_wire(wire)
                    last = ends_request(event)
                    handle = self.handles.pop(key, None) if last else self.handles.get(key)
                    if isinstance(event, Final):
                        finals.append((event, handle.request if handle is not None else None))
                    if handle is not None:
                        ready.append((handle, event))
                self._active = step.active
        for step in steps:
            for observation in step.observations:
                observation.apply(self.observer)
        for final, request in finals:
            self.observer.on_finish(final, request)
        post(ready)

    def _core_died(self, why: str) -> None:
        """Every request in flight ends now with EngineUnavailable; new ones are refused; on_death."""
        log.error("%s", why)
        self.died = why
        with self._lock:
            handles, self.handles = list(self.handles.values()), {}
        post((handle, EngineUnavailable(why)) for handle in handles)
        if self.on_death is not None:
            self.on_death(why)
