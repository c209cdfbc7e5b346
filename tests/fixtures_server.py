"""Session fixtures: a real attnserve server on 127.0.0.1 port 0 over the exported tiny model.

The server runs in-process on an event loop of its own (a thread), so tests can look at its
engine; signal and start-up tests run `attnserve serve` as a subprocess instead. A Pacer can
slow every engine step so that a test can act while a generation is still running.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from attnserve.protos.attnserve.v1 import generation_pb2 as pb
from attnserve.protos.attnserve.v1 import generation_pb2_grpc as pb_grpc
from attnserve.server.app import Server
from attnserve.server.config import ServerConfig
from attnserve.server.engine import EngineObserver

ROOT = Path(__file__).resolve().parents[1]


class Pacer(EngineObserver):
    """Forwards to the server's metrics and sleeps `delay` seconds at every engine step."""

    def __init__(self, inner: EngineObserver, delay: float = 0.0):
        self.inner, self.delay = inner, delay

    def on_step(self, batch_size, queue_depth):
        self.inner.on_step(batch_size, queue_depth)
        if self.delay and batch_size:
            time.sleep(self.delay)

    def on_first_token(self, seconds):
        self.inner.on_first_token(seconds)

    def on_inter_token(self, seconds):
        self.inner.on_inter_token(seconds)

    def on_finish(self, reason, seconds, completion_tokens):
        self.inner.on_finish(reason, seconds, completion_tokens)


class ServerThread:
    """A started Server on its own event loop thread; `stub` talks to it over a real channel."""

    def __init__(self, config: ServerConfig):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-server-loop", daemon=True)
        self.thread.start()
        self.server = Server(config)
        self.pacer = Pacer(self.server.metrics)
        self.server.engine.observer = self.pacer
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
    }
    config = ServerConfig(model=str(model_dir), **{**defaults, **overrides})
    return ServerThread(config)


def wait_until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `predicate` until true; fail the test with `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


def idle(engine) -> bool:
    return engine.stats() == {"active": 0, "queued": 0}


def request(prompt: str, **fields) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt=prompt, **fields)


@pytest.fixture(scope="session")
def server(tiny_model_dir):
    """The shared server: max batch 8, queue 64, no pacing (tests that pace it reset the delay)."""
    running = start_server(tiny_model_dir, metrics_port=0)
    yield running
    running.stop()


@pytest.fixture
def stub(server):
    server.pacer.delay = 0.0
    yield server.stub
    server.pacer.delay = 0.0
    wait_until(lambda: idle(server.engine), what="the shared server to go idle")


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
