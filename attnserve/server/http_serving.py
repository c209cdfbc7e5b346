"""uvicorn serving an ASGI app on the server's own event loop: bound before start-up ends, stopped when
the server stops, with no signal handlers of its own (the server's SIGTERM drains everything). TLS
from the server's --tls-cert, --tls-key and --tls-client-ca, as gRPC's. No gRPC here."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Generator
from typing import Any

import uvicorn

STARTUP_TIMEOUT_S = 30.0


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """None: the server's own SIGTERM handler drains and then stops this one."""
        yield


class HttpServer:
    """One uvicorn server of `app` on host:port (0: a free port); `port` is the bound one."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        tls: tuple[str, str, str | None] | None,
        grace_s: float,
        shared: bool = False,
    ):
        """`tls`: (certificate, key, client CA or None) PEM files, or None for plain HTTP; `shared`: the port
        is bound with SO_REUSEPORT, by each of --api-server-count's front ends."""
        # log_config None: uvicorn's loggers keep no handlers of their own and reach the root's, so that its
        # lines are written as --log-format says (its own handlers broke --log-format json's lines)
        options: dict[str, Any] = {"log_level": "warning", "access_log": False, "lifespan": "off", "log_config": None}
        if tls is not None:
            cert, key, client_ca = tls
            options.update(ssl_certfile=cert, ssl_keyfile=key)
            if client_ca:
                options.update(ssl_ca_certs=client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
        self.config = uvicorn.Config(app, timeout_graceful_shutdown=max(1, int(grace_s)), **options)
        self.server = _Uvicorn(self.config)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # proto IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off only on sockets that say TCP, and
        # with it on, a stream's events after the first on a kept-alive connection waited for the
        # client's delayed ACK (40 ms) and came in one burst at the end.
        self.socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.socket.bind((host, port))
        self.port = self.socket.getsockname()[1]
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        """Serve; returns once uvicorn listens (raises RuntimeError if it does not start)."""
        self.task = asyncio.create_task(self.server.serve(sockets=[self.socket]))
        deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT_S
        while not self.server.started:
            if self.task.done() or asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the HTTP server did not start on port {self.port}")
            await asyncio.sleep(0.01)

    async def stop(self, graceful: bool = True) -> None:
        """Stop taking connections; with `graceful`, responses in progress finish first."""
        if self.task is None:
            self.socket.close()
            return
        self.server.should_exit = True
        self.server.force_exit = not graceful
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.socket.close()
