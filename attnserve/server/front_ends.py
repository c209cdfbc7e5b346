"""--api-server-count N: N - 1 front-end processes more beside the first, over its one engine core.

The first front end (the `attnserve serve` process) starts the engine core, binds its ports and
warms up; then it starts the others here, each a whole Server (doors, validation, tokenizing,
detokenizing, stop strings, health, its own metrics) in a process of its own that joins the same
core (core/client.py's `attach`) and binds the same gRPC and HTTP ports with SO_REUSEPORT, so the
kernel hands each new connection to one of them: vLLM's --api-server-count, where one front end's
Python (one event loop, one GIL) is what a busy host waits on. Front end i serves its metrics on
--metrics-port + i (0: a free port each); the engine's own series (batch, queue, time to first
token, inter-token latency) come from the first.

SIGTERM (or SIGINT) to the first drains the others too, and the core stops once they have exited. A
front end more that exits on its own ends the server (exit 1, for its supervisor to restart it), as
the core's death does; the core's death ends every front end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..core.loading import StartupError
from ..core.log_lines import configure_logging
from ..runtime.contract import ModelDirError
from ..runtime.model_sessions import ProviderError
from .config import ServerConfig

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # a front end more: its imports, its tokenizer, its warm-up through the core
KILL_WAIT_S = 2.0


def their_config(config: ServerConfig, index: int, port: int, http_port: int | None) -> ServerConfig:
    """Front end `index`'s configuration: the first's bound ports (a port 0 was a free one there), and
    its own metrics port (--metrics-port + index; 0 stays a free one)."""
    metrics = config.metrics_port
    if metrics:
        metrics += index
    return replace(config, port=port, http_port=http_port, metrics_port=metrics)


class FrontEnds:
    """The front ends more, started and serving; StartupError if one does not come up."""

    def __init__(self, config: ServerConfig, fronts_socket: str, port: int, http_port: int | None):
        spawn = multiprocessing.get_context("spawn")  # not a fork: gRPC's threads are running here
        self.stopping = False
        self.processes: list[Any] = []
        self.metrics_ports: list[int] = []
        pipes = []  # each one's word that it serves, or why it cannot
        for index in range(1, config.api_server_count):
            hearing, telling = spawn.Pipe(duplex=False)
            process = spawn.Process(
                target=run_front_end,
                args=(their_config(config, index, port, http_port), fronts_socket, index, telling),
                name=f"attnserve-front-end-{index}",
                daemon=True,
            )
            process.start()
            telling.close()  # its copy is the child's: the pipe ends (EOFError) when the child does
            self.processes.append(process)
            pipes.append(hearing)
        try:
            for index, (process, pipe) in enumerate(zip(self.processes, pipes), start=1):
                self.metrics_ports.append(wait_ready(index, process, pipe))
        except BaseException:
            self.stop()
            raise
        log.info("%d front ends more serving (processes %s)", len(self.processes), [p.pid for p in self.processes])

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Call `on_death` (from a thread of its own) if a front end more exits before drain() or stop()."""

        def watching() -> None:
            sentinels = {process.sentinel: index for index, process in enumerate(self.processes, start=1)}
            ended = multiprocessing.connection.wait(list(sentinels))
            if not self.stopping:
                index = sentinels[ended[0]]
                process = self.processes[index - 1]
                process.join(KILL_WAIT_S)
                on_death(
                    f"front end {index} (process {process.pid}) exited (exit code {process.exitcode}); "
                    "the server restarts"
                )

        threading.Thread(target=watching, name="attnserve-front-ends", daemon=True).start()

    def drain(self) -> None:
        """SIGTERM to each: it drains as the first does."""
        self.stopping = True
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                if process.is_alive():
                    os.kill(process.pid, signal.SIGTERM)

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for every one to exit; kill those that have not."""
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for index, process in enumerate(self.processes, start=1):
            if process.is_alive():
                log.warning("front end %d did not exit within %.0f s of its drain; killed", index, timeout)
                process.kill()
                process.join(KILL_WAIT_S)

    def stop(self) -> None:
        """Now: each is killed (its calls are cut, as the first's are)."""
        self.stopping = True
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(KILL_WAIT_S)


def wait_ready(index: int, process: Any, pipe: multiprocessing.connection.Connection) -> int:
    """Front end `index`'s metrics port (0: none) once it serves; StartupError with its reason if it cannot."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if pipe.poll(0.1):
            try:
                kind, value = pipe.recv()
            except EOFError:  # it exited without a word
                break
            if kind == "ready":
                return int(value)
            raise StartupError(f"front end {index} failed to start: {value}")
        if not process.is_alive():
            break
    if process.is_alive():
        raise StartupError(f"front end {index} did not start within {START_TIMEOUT_S:.0f} s")
    process.join(KILL_WAIT_S)
    raise StartupError(f"front end {index} exited during start-up (exit code {process.exitcode})")


def run_front_end(
    config: ServerConfig, fronts_socket: str, index: int, pipe: multiprocessing.connection.Connection
) -> None:
    """Front end `index`'s main: serve until SIGTERM or SIGINT, then drain, as `attnserve serve` does."""
    configure_logging(config.log_format, index)
    sys.exit(asyncio.run(serve_beside(config, fronts_socket, index, pipe)))


async def serve_beside(
    config: ServerConfig, fronts_socket: str, index: int, pipe: multiprocessing.connection.Connection
) -> int:
    """Start a Server over the running core, say so on `pipe` (its metrics port, or why it failed), serve."""
    from .app import Server  # app.py starts these: imported here, in the front end's own process

    server = None
    try:
        server = Server(config, attach=fronts_socket, front_end=index)
        await server.start()
    except (ModelDirError, ProviderError, StartupError) as e:
        if server is not None:
            await server.stop()
        pipe.send(("failed", str(e)))
        return 2
    except Exception as e:  # a bug: logged whole here, said in one line by the first front end
        log.error("start-up failed", exc_info=e)
        if server is not None:
            await server.stop()
        pipe.send(("failed", f"start-up failed: {type(e).__name__}: {e}"))
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stopped.set)
    pipe.send(("ready", server.metrics_port))
    await server.stopped.wait()
    if server.died is not None:
        await server.stop()
        log.error("front end stopped: %s", server.died)
        return 1
    await server.drain()
    return 0
