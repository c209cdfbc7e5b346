"""The engine core's process (`--engine-core process`, started by core/client.py): the model's
session, its KV arena, the scheduler and sampling, loaded once, beside the front end's process.

The engine thread steps as always, its outbox (step_writer.py) writing each step's events to the
front end as one message on the channel's socket (channel.py, protocol.py), so no event loop in
this process wakes per token and none shares its GIL; the main thread only receives requests,
cancels, aborts and the stop, and hands them to the engine through its public calls. Metrics live
in the front end: the core records the engine's observations and sends them with the step.
With --api-server-count N the core also listens for the N - 1 front ends more, which the first
starts once it serves, and answers each over a channel of its own (step_writer.py routes the events).
No gRPC here.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import socket
import time
from collections.abc import Callable

from ..engine.domain import Draining
from ..engine.engine import Engine, EngineLimits
from ..engine.outbox import Outbox
from ..engine.speculation import Speculation
from ..runtime.contract import ModelDirError
from ..runtime.model_sessions import ProviderError, one_line
from .channel import Channel, ChannelClosed, connect, fronts_path, listen, readable
from .config import MAX_NICE, CoreConfig
from .loading import LoadedModel, StartupError, load_model
from .log_lines import configure_logging
from .observations import Recorder, SpansDropped
from .protocol import INBOUND_DECODER, Abort, Cancel, Failed, Ready, Stop, Submit, SubmitTogether
from .slow_steps import slowed, step_delay_ms
from .step_writer import FIRST, StepWriter
from .traced_outbox import TracedOutbox

log = logging.getLogger(__name__)
THREADS = "/proc/self/task"  # Linux: one entry per thread of this process

PARENT_CHECK_MS = 500  # how often an idle core checks that the front end that started it still lives


def core_engine(
    loaded: LoadedModel,
    writer: StepWriter,
    delay_ms: int,
    outbox: Outbox | None = None,
    speculation: Speculation | None = None,
    run_ahead: str = "auto",
    max_waiting_steps: int = 0,
) -> Engine:
    """The engine of the core's process, delivering to `writer` (through `outbox`, which hands on to it,
    where one is given). The queue's bound is the front end's alone (requests in flight <= slots +
    --max-queue, core/client.py): this queue holds what the front end accepted. Slow readers are the
    front end's too. `delay_ms`: a test's brake on every step, which run_core read (slow_steps.py);
    `speculation`: --speculative-config's; `run_ahead`: --run-ahead's; `max_waiting_steps`: --max-waiting-steps'."""
    limits = EngineLimits(loaded.capacity, None, 0, speculation, run_ahead, max_waiting_steps)
    observer = slowed(writer.recorder, delay_ms)
    return Engine(loaded.slots, loaded.tokenizer, limits, observer, outbox or writer, loaded.draft)


def traced(writer: StepWriter, config: CoreConfig, loaded: LoadedModel) -> tuple[Outbox | None, Callable[[], None]]:
    """With tracing on (config.traces): an outbox that hands each step to `writer`, then writes the core's
    spans of the requests that ended in it, and the call that sends the last spans at the end. Off:
    nothing to do."""
    if config.traces is None:
        return None, lambda: None
    from ..tracing.core_spans import CoreSpans
    from ..tracing.exporting import Tracing

    tracing = Tracing(config.traces, "engine_core")
    spans = CoreSpans(tracing, config.prefill_chunk, loaded.runner.manifest.seq2seq)
    return TracedOutbox(writer, spans, lambda count: writer.recorder.record(SpansDropped(count))), tracing.shutdown


def lower_priority(nice: int) -> None:
    """Every thread of this process `nice` below the front end's CPU priority (which it inherits): the
    threads started at import (numpy's BLAS pool) one by one, since Linux sets a thread's priority,
    not a process's; ONNX Runtime's, started later by the main thread, inherit it. Under CPU
    contention the front end then runs first: gRPC's asyncio server takes one call of a method at a
    time, each through several turns of its event loop, and a front end starved by its own core
    leaves calls waiting there until the connection's --max-concurrent-streams is spent
    (docs/reports/core-nice.md). A front end with nothing to do leaves the core every CPU as before."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    lowered = min(os.getpriority(os.PRIO_PROCESS, 0) + nice, MAX_NICE)
    threads = [int(tid) for tid in os.listdir(THREADS)] if os.path.isdir(THREADS) else [0]
    for tid in threads:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, tid, lowered)


def run_core(config: CoreConfig, path: str) -> None:
    """The engine core process's main: connect to the front end's socket at `path`, load, say Ready (or
    Failed), then serve messages until Stop. A test's brake on every step comes from this process's
    environment (slow_steps.py), which it inherits from the front end.

    SIGINT and SIGTERM are ignored: a terminal's Ctrl-C and systemd's stop reach every process of the
    group, and the front end drains first, then sends Stop. A front end that is gone stops it too."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    lower_priority(config.nice)
    configure_logging(config.log_format)
    channel = connect(path, INBOUND_DECODER)
    loading = time.monotonic()
    try:
        delay = step_delay_ms()
        loaded = load_model(config)
    except (ModelDirError, ProviderError, StartupError) as e:
        channel.send(Failed(type(e).__name__, str(e)))
        channel.close()
        return
    except Exception as e:  # anything else (ONNX Runtime's, a bug): the front end says it, not only the exit
        log.debug("the engine core failed to start", exc_info=e)
        channel.send(Failed("StartupError", f"the engine core failed to start: {one_line(e)}"))
        channel.close()
        return
    writer = StepWriter(channel, Recorder())
    outbox, end_tracing = traced(writer, config, loaded)
    engine = core_engine(loaded, writer, delay, outbox, config.speculation, config.run_ahead, config.max_waiting_steps)
    runner = loaded.runner
    slots = loaded.slots
    log.info(
        "loaded %s in %.1f s on %s, %d slots (engine core process %d)",
        runner.model_dir.name,
        time.monotonic() - loading,
        runner.provider,
        loaded.capacity,
        os.getpid(),
    )
    ready = Ready(
        runner.provider,
        loaded.capacity,
        slots.nbytes,
        runner.provider_note,
        slots.prefix_bytes,
        runner.threads,
        os.getpid(),
    )
    # listening before Ready: the first front end starts the others once it has it
    more = config.front_ends - 1
    fronts = Fronts(writer, ready, listen(fronts_path(path), more), more) if more else None
    channel.send(ready)
    engine.start()
    try:
        serve_messages(engine, writer, channel, fronts)
    finally:
        engine.stop()
        channel.close()
        if fronts is not None:
            fronts.close()
        end_tracing()


class Fronts:
    """The front ends more (--api-server-count): the core's listening socket, until the `more` front ends
    the configuration says have connected (then closed: nothing else connects), and their channels.
    Each gets the core's Ready as it connects."""

    def __init__(self, writer: StepWriter, ready: Ready, listener: socket.socket, more: int):
        self.writer, self.ready, self.more = writer, ready, more
        self.listener: socket.socket | None = listener
        self.channels: dict[int, Channel] = {}
        self._numbers = itertools.count(FIRST + 1)

    def accept(self) -> None:
        assert self.listener is not None, "accepting only while listening"
        sock, _ = self.listener.accept()
        front, channel = next(self._numbers), Channel(sock, INBOUND_DECODER)
        self.channels[front] = channel
        self.writer.join(front, channel)
        with contextlib.suppress(OSError):
            channel.send(self.ready)
        log.info("front end %d connected to the engine core", front)
        self.more -= 1
        if not self.more:
            self.listener.close()
            self.listener = None

    def leave(self, engine: Engine, front: int) -> None:
        """A front end more closed its channel (it stopped, or died): its requests end."""
        self.channels.pop(front).close()
        callers = self.writer.leave(front)
        for caller in callers:
            engine.release(caller)
        log.info("front end %d left the engine core (%d requests of its ended)", front, len(callers))

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        if self.listener is not None:
            self.listener.close()


def serve_messages(engine: Engine, writer: StepWriter, channel: Channel, fronts: Fronts | None = None) -> None:
    """Until Stop (or the first front end is gone): submits, cancels and aborts, as they come, from every
    front end. Every request a front end sent ends with an event (a refusal, a Final): its count of
    requests in flight stays exact."""
    parent = os.getppid()
    while True:
        channels = {FIRST: channel, **(fronts.channels if fronts is not None else {})}
        listener = fronts.listener if fronts is not None else None
        socks = [end.sock for end in channels.values()] + ([listener] if listener is not None else [])
        ready = readable(socks, PARENT_CHECK_MS / 1000)
        if not ready:
            if os.getppid() != parent:
                log.warning("the front end is gone; the engine core stops")
                return
            continue
        if fronts is not None and listener in ready:
            fronts.accept()
        for front, end in channels.items():
            if end.sock not in ready:
                continue
            try:
                messages = end.take()
            except ChannelClosed:
                if front == FIRST:
                    log.warning("the front end closed the channel; the engine core stops")
                    return
                assert fronts is not None, "only the first front end's channel is there without front ends more"
                fronts.leave(engine, front)
                continue
            if take_messages(engine, writer, front, messages):
                return


def take_messages(engine: Engine, writer: StepWriter, front: int, messages: list) -> bool:
    """A front end's messages, in order; True at the first front end's Stop."""
    for message in messages:
        if isinstance(message, Submit | SubmitTogether):
            submits = message.submits if isinstance(message, SubmitTogether) else [message]
            callers = [writer.caller(submit.key, submit.request, front) for submit in submits]
            try:
                engine.enqueue(*callers)
            except Draining as e:  # the core stops
                for caller in callers:
                    engine.refuse(caller, e)
        elif isinstance(message, Cancel):
            running = writer.callers.get((front, message.key))
            if running is not None:  # else already finished
                engine.release(running)
        elif isinstance(message, Abort):  # a drain that timed out there: that front end's requests end
            for caller in writer.callers_of(front):
                engine.release(caller)
        elif isinstance(message, Stop) and front == FIRST:
            return True
    return False
