"""Session fixtures: a real attnserve server on 127.0.0.1 port 0 over the exported tiny model.

The server runs in-process on an event loop of its own (a thread), so tests can look at its
engine; signal and start-up tests run `attnserve serve` as a subprocess instead. A Pacer orders
the engine's steps against the test (hold/release, lockstep), so that a test acts while a
generation is still running whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from attnserve.engine.engine import EngineObserver, ForwardingObserver
from attnserve.server.config import ServerConfig
from attnserve.v1 import generation_pb2 as pb
from attnserve.v1 import generation_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
STEP_WAIT_S = 30.0  # the longest a paced engine step waits for a test (then it goes on, and the test fails)


class Pacer(ForwardingObserver):
    """Forwards to the server's metrics, and orders the engine's steps against a test's own actions,
    by events, so that a test means the same on a quiet machine and a busy one:

    - hold() stops the engine at its next step with a batch, before it decodes, until release();
      hold(when=f) at the first such step where f() is true. `held` is set while it waits there;
      the tokens of the steps before have been flushed to their callers. release(until=f) lets it
      go on and holds it again at the first step where f() is true.
    - lockstep: before every decode step, wait until each request's caller has taken the events
      of the steps before and waits for more: a stream at interval 1 sends a message per step.
    - steps, submitted and finals count what the engine did: batch steps, requests accepted, and
      the Finals in the order it ended them; requests holds the requests accepted.
    - delay: seconds of sleep per step, only for tests whose subject is wall time itself (a stream's
      time bound, a reader's patience): every other test orders its actions by the events above."""

    def __init__(self, inner: EngineObserver, loop: asyncio.AbstractEventLoop):
        super().__init__(inner)
        self.engine, self.loop = None, loop  # the engine: the server's, once started
        self.delay = 0.0
        self.lockstep = False
        self.open = threading.Event()
        self.open.set()
        self.held = threading.Event()
        self.when: Callable[[], bool] | None = None
        self.steps, self.submitted, self.finals = 0, 0, []
        self.batch_sizes = []  # each step's, from the start-up warm-up's on
        self.requests = []  # the GenerationRequests accepted, in order

    def reset(self) -> None:
        """No delay, no lockstep, not held: the engine at its own speed."""
        self.delay, self.lockstep = 0.0, False
        self.release()

    def hold(self, when: Callable[[], bool] | None = None) -> None:
        if when is None:
            self.open.clear()
        self.when = when

    def release(self, until: Callable[[], bool] | None = None) -> None:
        self.when = until
        self.held.clear()  # here, not only on the engine's thread: a test that waits for the next hold sees it
        self.open.set()

    def on_submit(self, request):
        self.inner.on_submit(request)
        self.submitted += 1
        self.requests.append(request)

    def on_finish(self, final, request=None):
        self.inner.on_finish(final, request)
        self.finals.append(final)

    def on_step(self, batch_size, queue_depth):
        self.inner.on_step(batch_size, queue_depth)
        if not batch_size:
            return
        self.steps += 1
        self.batch_sizes.append(batch_size)
        if self.when is not None and self.when():
            self.when = None
            self.open.clear()
        if not self.open.is_set():
            self.held.set()
            self.open.wait(STEP_WAIT_S)
            self.held.clear()
        if self.lockstep:
            self._wait_for_callers()
        if self.delay:
            time.sleep(self.delay)

    def _wait_for_callers(self) -> None:
        """Until every active request's caller took its events and waits for more (engine thread)."""
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.loop).result(STEP_WAIT_S)  # deliveries ran
        handles = [sequence.handle for sequence in list(self.engine._active.values())]
        end = time.monotonic() + STEP_WAIT_S
        while time.monotonic() < end and not all((h.reading and h.events.empty()) or h.cancelled for h in handles):
            time.sleep(0.0005)


class ServerThread:
    """A started Server on its own event loop thread; `stub` talks to it over a real channel."""

    def __init__(self, config: ServerConfig):
        from attnserve.server.app import Server  # ONNX Runtime and gRPC's server, only for tests that serve

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-server-loop", daemon=True)
        self.thread.start()
        self.server = Server(config, observers=[lambda inner: Pacer(inner, self.loop)])
        self.pacer = self.server.observer
        self.pacer.engine = self.server.engine
        self.call(self.server.start())
        self.target = f"127.0.0.1:{self.server.port}"
        self.channel = grpc.insecure_channel(self.target) if not config.tls_cert else None
        self.stub = pb_grpc.TextGenerationStub(self.channel) if self.channel else None

    @property
    def engine(self):
        return self.server.engine

    def call(self, coro, timeout: float = 60.0):
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.pacer.release()
        if self.channel:
            self.channel.close()
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def start_server(model_dir, **overrides) -> ServerThread:
    defaults = {
        "host": "127.0.0.1",
        "port": 0,
        "provider": "cpu",
        "threads": 1,
        "max_batch": 8,
        "max_queue": 64,
        "drain_timeout": 5.0,
        "engine_core": "thread",  # the tests look at the engine and pace its steps (test_engine_core.py: a process)
        "logits_pass": "on",  # every row the pass can pick (auto passes none of a tiny vocabulary on the CPU)
        "run_ahead": "on",  # every burst one step ahead: the one-step lag under every test (auto: by the engine's time)
        "log_stats_interval": 0.0,  # no periodic stats lines from the tests' servers (test_server_observability.py)
    }
    config = ServerConfig(model=str(model_dir), **{**defaults, **overrides})
    return ServerThread(config)


def release_when(pacer: Pacer, predicate, timeout: float = STEP_WAIT_S) -> threading.Thread:
    """Release a held engine once `predicate()` holds (or after `timeout`), from a thread of its own:
    for a test whose own thread is busy driving the server (a benchmark run in-process)."""

    def watch():
        end = time.monotonic() + timeout
        while not predicate() and time.monotonic() < end:
            time.sleep(0.005)
        pacer.release()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def staggered(running: ServerThread, calls: list[Callable[[], T]], steps_apart: int) -> list[T]:
    """Make each call on a thread of its own, call i once call i-1 is accepted and the engine has run
    `steps_apart` more batch steps (held there until call i is accepted): each request arrives while
    the earlier ones decode, whatever the machine's speed (or, should they all have ended, to an
    idle engine). The calls' results, in order."""
    pacer, engine = running.pacer, running.engine
    pacer.hold()
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = []
        for i, call in enumerate(calls):
            accepted = pacer.submitted
            futures.append(pool.submit(call))
            wait_until(lambda a=accepted: pacer.submitted > a, STEP_WAIT_S, f"call {i} to be accepted")
            if i == len(calls) - 1:
                pacer.release()
                break
            start = pacer.steps
            pacer.release(until=lambda s=start: pacer.steps >= s + steps_apart)
            wait_until(lambda: pacer.held.is_set() or idle(engine), STEP_WAIT_S, f"step {start + steps_apart}")
            if not pacer.held.is_set():
                pacer.release()
        return [future.result(STEP_WAIT_S) for future in futures]


def in_flight(server) -> float:
    """Calls whose handlers a started server has not yet ended (its Prometheus gauge)."""
    return server.server.metrics.registry.get_sample_value("attnserve_requests_in_flight") or 0


def release_once_ended(server) -> None:
    """Release a held engine once every call's handler has ended, its request released: a request whose
    caller went away ends CANCELLED at the engine's next step, never run to its length first."""
    wait_until(lambda: in_flight(server) == 0, STEP_WAIT_S, "the calls' handlers to end")
    server.pacer.release()


def wait_until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `predicate` until true; fail the test with `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def idle(engine) -> bool:
    return engine.stats() == {"active": 0, "queued": 0}


def calls(server, method: str, code: str) -> float:
    """Calls of `method` that a started server ended with status `code` (its Prometheus counter)."""
    registry = server.server.metrics.registry
    return registry.get_sample_value("attnserve_requests_total", {"method": method, "code": code}) or 0


def request(prompt: str, **fields) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt=prompt, **fields)


@pytest.fixture(scope="session")
def server(tiny_model_dir):
    """The shared server: max batch 8, queue 64, no pacing (tests that pace it reset the pacer)."""
    running = start_server(tiny_model_dir, metrics_port=0)
    yield running
    running.stop()


@pytest.fixture
def stub(server):
    server.pacer.reset()
    yield server.stub
    server.pacer.reset()
    wait_until(lambda: idle(server.engine), what="the shared server to go idle")


@pytest.fixture(scope="module")
def http_server(tiny_model_dir):
    """A server of the tiny model with the OpenAI-compatible HTTP door and metrics, one per test module."""
    running = start_server(tiny_model_dir, http_port=0, metrics_port=0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def chat_server(chat_model_dir):
    """The chat model (fixtures_export.py) served with its OpenAI-compatible door, one per test module."""
    running = start_server(chat_model_dir, http_port=0)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def reference_model(tiny_checkpoint):
    """The PyTorch model the tiny model directory was exported from (tests may import torch)."""
    from attnserve.model.checkpoint import load_checkpoint

    return load_checkpoint(tiny_checkpoint)


class ServeProcess:
    """`attnserve serve` in a subprocess, started with --port 0; knows its port once it is ready."""

    def __init__(self, *args: str, ready_timeout: float = 60.0):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "attnserve.cli", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.port = self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> int | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            line = self.proc.stdout.readline()
            if not line:
                return None  # exited before it was ready
            self.lines.append(line)
            match = re.search(r"listening on \S+:(\d+)", line)
            if match:
                return int(match.group(1))
        self.proc.kill()
        pytest.fail(f"attnserve serve not ready after {timeout} s:\n{''.join(self.lines)}")

    def wait(self, timeout: float = 30.0) -> tuple[int, str]:
        """Exit code and all output."""
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, "".join(self.lines) + (out or "")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)
