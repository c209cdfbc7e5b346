"""`attnserve serve`: build the server, run it, drain it on SIGTERM.

Start-up: model directory (sha256-verified) -> ONNX Runtime session on the provider asked for ->
engine -> grpc.aio server with health (NOT_SERVING), optional reflection, TLS or mTLS, auth ->
a warm-up generation -> SERVING. Server's parts are built by assembly.py's functions, and Ray Serve's
replicas start through the same Server.start. Anything that prevents serving ends the process with a
one-line reason and a non-zero exit. SIGTERM: health NOT_SERVING, new calls UNAVAILABLE, in-flight
requests get --drain-timeout seconds to finish, then exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import grpc

from ..core.loading import StartupError
from ..core.log_lines import configure_logging
from ..core.starting import StartedCore, start_core
from ..engine.domain import Final, GenerationRequest
from ..engine.engine import EngineObserver
from ..runtime.contract import ModelDirError
from ..runtime.model_sessions import ProviderError
from .assembly import (
    SERVICE,
    add_servicers,
    call_boundary,
    channel_options,
    chat_template,
    enable_reflection,
    interceptor_chain,
    model_description,
    model_facts,
    observer_chain,
    read_token,
    report_core,
    request_limits,
    request_traces,
    server_credentials,
    servicers,
    start_tracing,
)
from .checkpoint_exports import CheckpointExportError, serving_export
from .config import ServerConfig
from .front_ends import FrontEnds
from .grpc_boundary.per_method import PerMethod
from .grpc_boundary.slow_readers import WriteWatch
from .grpc_oip.servicer import SERVICE as OIP_SERVICE
from .health import NOT_SERVING, SERVING, HealthServicer
from .http_openai.door import HttpFacts, OpenAIFrontDoor
from .http_serving import HttpServer
from .metrics import Metrics
from .stats_log import StatsLog

if TYPE_CHECKING:
    from ..tracing.exporting import Tracing

log = logging.getLogger(__name__)

HEALTH_SERVICES = ("", SERVICE, OIP_SERVICE)  # grpc.health.v1 answers for the server and each service
WARMUP_TIMEOUT_S = 120.0
FRONT_ENDS_GRACE_S = 10.0  # after --drain-timeout, how long the front ends more get to exit
# Why attnserve.v1 and Open Inference Protocol calls get UNAVAILABLE (health says NOT_SERVING then)
STARTING = "the server is starting (its warm-up generation runs); retry once its health says SERVING"
DRAINING = "the server is draining (shutting down); retry on another replica"


class Server:
    """One attnserve server: model session, engine, gRPC services and metrics."""

    def __init__(
        self,
        config: ServerConfig,
        observers: Sequence[Callable[[EngineObserver], EngineObserver]] = (),
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        attach: str | None = None,
        front_end: int = 0,
    ):
        """Start the engine core and build the parts over it (assembly.py); raises ModelDirError,
        ProviderError or StartupError. `observers` wrap the server's metrics as the engine's observer,
        innermost first (Ray Serve's step clock, a test's pacer): `observer` is the outermost;
        `interceptors` join the gRPC chain inside the boundary and the token check (a test's leak);
        `attach`: a running core's socket for front ends more, which this server joins instead of
        starting one, as front end number `front_end` (front_ends.py: --api-server-count's others)."""
        self.config = config
        self.attached, self.front_end = attach is not None, front_end
        self.token = read_token(config.auth_token_file) if config.auth_token_file else None
        self.metrics = Metrics()
        self.tracing = start_tracing(config.traces(), self.metrics)
        self.observer = observer_chain(self.metrics, observers)
        self.died: str | None = None  # why the engine core's process is gone
        self.loop: asyncio.AbstractEventLoop | None = None
        core = start_core(
            config.core(), self.observer, config.stream_buffer_events, self._core_died, self.tracing, attach
        )
        self.fronts_socket = core.fronts  # where the front ends more connect ("": none)
        self.front_ends: FrontEnds | None = None  # those more, once started (serve())
        with stopped_on_failure(core, self.metrics, self.tracing):
            self.engine, self.tokenizer, self.max_batch = core.engine, core.tokenizer, core.capacity
            self.kv_cache_bytes, self.prefix_cache_bytes = core.kv_cache_bytes, core.prefix_cache_bytes
            self.facts = model_facts(core, config.served_model_name)
            self.limits = request_limits(config, core.manifest, core.tokenizer, core.capacity)
            self.info = model_description(self.facts, core, self.limits, config.max_queue)
            report_core(self.metrics, self.facts, core, config.engine_core)
            self.traces = request_traces(
                self.tracing, self.facts.name, config.log_requests, config.log_format == "json"
            )
            self.writes = WriteWatch(config.write_timeout)
            self.boundary = call_boundary(self.metrics, self.writes, self.traces)
            self.handlers = PerMethod()  # the interceptors' handler of each method, built at its first call
            self.interceptors = interceptor_chain(self.handlers, self.boundary, self.token, interceptors)
            self.health = HealthServicer()
            self.servicers = servicers(
                self.engine, self.limits, self.tokenizer, self.info, lambda: self.serving, self.metrics.count_request
            )
        self.grpc: grpc.aio.Server | None = None
        self.http: HttpServer | None = None  # --http-port's OpenAI-compatible front door
        self.watchdog: asyncio.Task | None = None
        self.stats_task: asyncio.Task | None = None  # --log-stats-interval's
        self.stopped = asyncio.Event()  # SIGTERM or SIGINT (serve() sets it), or the engine core died
        self.port = self.metrics_port = 0
        self.serving = False  # warmed up and not draining: health SERVING, the protocol's ServerReady

    def _core_died(self, why: str) -> None:
        """The engine core's process is gone (the client's receiver thread), or a front end more
        (front_ends.py's watcher): stop serving; serve() exits 1."""
        self.died = why
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.stopped.set)

    async def start(self, listen: bool = True, health_services: Sequence[str] = HEALTH_SERVICES) -> None:
        """Bind the doors (health NOT_SERVING, calls refused), start the engine and what runs beside it,
        warm up, then SERVING. `attnserve serve` and Ray Serve's replicas both start here; a replica
        does not `listen` (Ray's proxies are its doors: ray_serve/deployment.py) and answers health for
        the services Ray routes to it."""
        self.loop = asyncio.get_running_loop()
        if listen:
            await self._open_doors(health_services)
        self.engine.start()
        self._run_beside_engine()
        if self.config.warmup:
            self.metrics.counting = False  # the warm-up is not traffic: calls are refused until it ends
            try:
                await self.warm_up()
            finally:
                self.metrics.counting = True
        for service in health_services:
            await self.health.set(service, SERVING)
        self.boundary.refusal = None
        self.serving = True

    async def _open_doors(self, health_services: Sequence[str]) -> None:
        """The gRPC server (and --http-port's) bound and answering: health NOT_SERVING, calls refused."""
        self.grpc = server = grpc.aio.server(interceptors=self.interceptors, options=channel_options(self.config))
        add_servicers(server, self.servicers, self.health)
        for service in health_services:
            await self.health.set(service, NOT_SERVING)
        if self.config.reflection:
            enable_reflection(server)
        self.port = self._bind(server)
        self.boundary.refusal = STARTING
        if self.config.http_port is not None:
            self.http = self._http_server()
        await server.start()
        if self.http is not None:
            await self.http.start()

    def _run_beside_engine(self) -> None:
        """The slow readers' watchdog, --log-stats-interval's lines and --metrics-port's server."""
        config = self.config
        self.watchdog = asyncio.create_task(self.writes.run())
        if config.log_stats_interval:
            stats_log = StatsLog(self.metrics, self.engine.stats, config.log_stats_interval, self.front_end)
            self.stats_task = asyncio.create_task(stats_log.run())
        if config.metrics_port is not None:
            try:
                self.metrics_port = self.metrics.serve(config.host, config.metrics_port)
            except OSError as e:
                raise StartupError(
                    f"cannot serve metrics on {config.host}:{config.metrics_port}: {e.strerror}"
                ) from None

    def _bind(self, server: grpc.aio.Server) -> int:
        config = self.config
        address = f"{config.host}:{config.port}"
        problem = None if self.attached else listen_problem(config.host, config.port)  # shared: the first's
        if problem is not None:
            raise StartupError(problem)
        try:
            if config.tls_cert and config.tls_key:
                port = server.add_secure_port(
                    address, server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
                )
            else:
                port = server.add_insecure_port(address)
        except RuntimeError:
            port = 0
        if not port:
            raise StartupError(f"cannot listen on {address}: the port is in use or the address is not local")
        return port

    def front_door(self) -> OpenAIFrontDoor:
        """The OpenAI-compatible routes over this server's engine, limits, token, metrics and refusals
        (served on --http-port, or by a Ray Serve replica behind Ray's HTTP proxy)."""
        facts = HttpFacts(
            self.info.model_name,
            self.info.context_length,
            self.token,
            lambda: self.boundary.refusal,
            self.metrics.count_http,
            self.metrics.track_in_flight,
            self.config.http_max_body_bytes,
            int(time.time()),
            chat_template(self.facts.model_dir),
            self.traces,
            self.metrics.exposition,
        )
        return OpenAIFrontDoor(self.engine, self.limits, self.tokenizer, facts)

    def _http_server(self) -> HttpServer:
        """The OpenAI-compatible front door on --http-port, bound now (its TLS and token are gRPC's)."""
        config = self.config
        door = self.front_door()
        tls = (config.tls_cert, config.tls_key, config.tls_client_ca) if config.tls_cert and config.tls_key else None
        problem = None if self.attached else listen_problem(config.host, config.http_port or 0, "--http-port")
        if problem is not None:
            raise StartupError(problem)
        shared = config.api_server_count > 1
        try:
            return HttpServer(door.app, config.host, config.http_port or 0, tls, config.drain_timeout, shared)
        except OSError as e:
            why = e.strerror or e
            raise StartupError(f"--http-port {config.http_port}: cannot listen on {config.host}: {why}") from None

    async def warm_up(self) -> None:
        """Short greedy generations through the engine (EOS ignored: each decodes a step), as many as the
        batch holds (at most --max-queue), submitted together so that one step decodes them all: the
        session really runs, and ONNX Runtime has met the whole batch's shapes (its memory arena grown)
        before the first request does. With one generation, the first 16 requests after start-up waited
        about 180 ms more for their first tokens on GPT-2 124M (docs/reports/start-up.md). A front end
        more joins a core already warmed up: one generation."""
        count = 1 if self.attached else max(1, min(self.max_batch, self.config.max_queue))
        prompt = tuple(self.tokenizer.encode_prompt("warm-up"))
        tokens = min(2, self.limits.max_new_tokens)
        t0 = time.perf_counter()
        requests = [GenerationRequest(f"warm-up-{i}", prompt, tokens, ignore_eos=True) for i in range(count)]
        handles = self.engine.submit_together(requests)  # one step boundary admits them all
        for handle in handles:
            while True:
                events = await asyncio.wait_for(handle.next_events(), WARMUP_TIMEOUT_S)
                if isinstance(events[-1], Exception):
                    raise StartupError(f"warm-up generation failed: {events[-1]}")
                if isinstance(events[-1], Final):
                    break
        log.info("warm-up: %d generations at once passed in %.0f ms", count, 1000 * (time.perf_counter() - t0))

    async def drain(self) -> None:
        """Stop taking calls, let in-flight ones finish within --drain-timeout, then stop (the front ends
        more drain beside this one, and the core stops once they have)."""
        if self.front_ends is not None:
            self.front_ends.drain()
        await self.health.enter_graceful_shutdown()
        self.serving = False
        self.boundary.refusal = DRAINING
        self.engine.close()
        log.info("draining: %(active)d active and %(queued)d queued requests to finish", self.engine.stats())
        deadline = time.monotonic() + self.config.drain_timeout
        while self.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.busy():
            log.warning("drain timeout (%.1f s) passed; cancelling %s", self.config.drain_timeout, self.engine.stats())
            self.engine.abort()
        if self.grpc is not None:
            await self.grpc.stop(grace=max(1.0, deadline - time.monotonic()))
        if self.http is not None:
            await self.http.stop()
        if self.front_ends is not None:
            await asyncio.to_thread(self.front_ends.join, self.config.drain_timeout + FRONT_ENDS_GRACE_S)
        self.close()

    async def stop(self) -> None:
        """Stop now: in-flight calls are cancelled."""
        if self.front_ends is not None:
            self.front_ends.stop()
        if self.grpc is not None:
            await self.grpc.stop(grace=None)
        if self.http is not None:
            await self.http.stop(graceful=False)
        self.close()

    def busy(self) -> bool:
        stats = self.engine.stats()
        return bool(stats["active"] or stats["queued"])

    def close(self) -> None:
        for task in (self.watchdog, self.stats_task):
            if task is not None:
                task.cancel()
        self.engine.stop()
        self.metrics.close()
        if self.tracing is not None:
            self.tracing.shutdown()


@contextlib.contextmanager
def stopped_on_failure(core: StartedCore, metrics: Metrics, tracing: Tracing | None) -> Iterator[None]:
    """The core runs (a process, or a thread): a start-up that fails after it started stops it."""
    try:
        yield
    except BaseException:
        core.engine.stop()
        metrics.close()
        if tracing is not None:
            tracing.shutdown()
        raise


def listen_problem(host: str, port: int, flag: str = "--port") -> str | None:
    """Why host:port cannot be listened on (in use, not local), found by binding a socket of our own
    first: gRPC's core would print an error line of its own before ours. The reason names the flag
    at fault: --host for an address that is not local, `flag` for a port in use. None if it can (or port 0)."""
    if port == 0:
        return None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        return f"--host {host}: cannot listen on {host}:{port}: {e.strerror}"
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: a TIME_WAIT port is free
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"{flag} {port}: cannot listen on {host}:{port}: the port is in use"
            why = "the address is not local" if e.errno == errno.EADDRNOTAVAIL else e.strerror
            return f"--host {host}: cannot listen on {host}:{port}: {why}"
    return None


def startup_problem(config: ServerConfig) -> str | None:
    """What is wrong with `config` that is found before the model loads: a bad flag (ServerConfig.check),
    or a port of the server or of its metrics (each front end's) that cannot be listened on."""
    try:
        config.check()
        config.check_files()
    except ValueError as e:
        return str(e)
    problem = listen_problem(config.host, config.port)
    metrics = config.metrics_port or 0
    for index in range(config.api_server_count if metrics else 0):  # front end i's: + i
        problem = problem or listen_problem(config.host, metrics + index, "--metrics-port")
    if problem is None and config.http_port:
        problem = listen_problem(config.host, config.http_port, "--http-port")
    return problem


async def start_front_ends(server: Server) -> None:
    """--api-server-count's front ends more, on the ports this one bound (off the event loop: this one
    serves meanwhile), watched from here on; StartupError if one does not come up."""
    http_port = server.http.port if server.http is not None else None
    config = server.config
    server.front_ends = await asyncio.to_thread(FrontEnds, config, server.fronts_socket, server.port, http_port)
    server.front_ends.watch(server._core_died)


async def serve(config: ServerConfig, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> int:
    """Run until SIGTERM or SIGINT, then drain; the exit code. `interceptors`: Server's."""
    server = None
    try:
        server = Server(config, interceptors=interceptors)
        await server.start()
    except (ModelDirError, ProviderError, StartupError) as e:
        if server is not None:
            await server.stop()
        print(f"attnserve serve: error: {e}", file=sys.stderr, flush=True)
        return 2
    except Exception as e:  # a bug, or a file nothing checked: logged whole, and nothing is left running
        log.error("start-up failed", exc_info=e)
        if server is not None:
            await server.stop()
        print(f"attnserve serve: error: start-up failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stopped.set)
    if config.api_server_count > 1:
        try:
            await start_front_ends(server)
        except StartupError as e:
            await server.stop()
            print(f"attnserve serve: error: {e}", file=sys.stderr, flush=True)
            return 2
    scheme = "grpcs" if config.tls_cert else "grpc"
    fronts = f", {config.api_server_count} front ends" if config.api_server_count > 1 else ""
    print(
        f"attnserve serve: listening on {config.host}:{server.port} ({scheme}), model "
        f"{server.info.model_name}, provider {server.facts.provider}, engine core in a {config.engine_core}{fronts}",
        flush=True,
    )
    print(
        f"attnserve serve: KV cache {server.info.kv_cache}, {server.max_batch} slots of "
        f"{server.info.context_length} positions, {server.kv_cache_bytes / 2**20:.1f} MiB; prefix cache "
        + (f"{server.prefix_cache_bytes / 2**20:.1f} MiB" if server.prefix_cache_bytes else "off"),
        flush=True,
    )
    if server.metrics_port:
        more = server.front_ends.metrics_ports if server.front_ends is not None else []
        others = "".join(f", front end {i}'s on port {port}" for i, port in enumerate(more, start=1))
        print(f"attnserve serve: metrics on http://{config.host}:{server.metrics_port}/metrics{others}", flush=True)
    if server.http is not None:
        scheme = "https" if config.tls_cert else "http"
        print(f"attnserve serve: OpenAI-compatible API on {scheme}://{config.host}:{server.http.port}/v1", flush=True)
    await server.stopped.wait()
    if server.died is not None:
        await server.stop()
        print(f"attnserve serve: error: {server.died}", file=sys.stderr, flush=True)
        return 1
    log.info("SIGTERM or SIGINT: draining (up to %.1f s)", config.drain_timeout)
    await server.drain()
    print("attnserve serve: drained, exiting", flush=True)
    return 0


def main(args, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()) -> int:
    """CLI entry of `attnserve serve` (`interceptors`: Server's; test_switches.py's leaking serve passes one)."""
    try:
        config = ServerConfig.from_args(args)
    except ValueError as e:
        configure_logging("text")
        print(f"attnserve serve: error: {e}", file=sys.stderr)
        return 2
    configure_logging(config.log_format)  # the engine core's process: config.core().log_format
    problem = startup_problem(config)  # before the model loads: a busy port costs nothing
    if problem is not None:
        print(f"attnserve serve: error: {problem}", file=sys.stderr)
        return 2
    try:
        config = serving_export(config)  # a Hugging Face checkpoint: its export, made once
    except CheckpointExportError as e:
        print(f"attnserve serve: error: {e}", file=sys.stderr)
        return 2
    return asyncio.run(serve(config, interceptors))
