"""The interceptors' handler of a method, built once: grpc.aio runs every interceptor's
intercept_service on every call, and each of ours builds the same wrapped handler for a method
whatever the call (the boundary, the token check and the tolerant decoding wrap by method alone;
what depends on the call runs inside the wrapped behaviors). PerMethod, the outermost interceptor,
keeps the handler the chain built at a method's first call and hands it out after that: a refused
call no longer pays for three rebuilt handlers (docs/reports/refusals.md).
"""

from __future__ import annotations

import grpc


class PerMethod(grpc.aio.ServerInterceptor):
    """Builds each method's handler through the interceptors inside it once, at its first call.
    Methods the server does not serve are not kept (any name a client sends would be)."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(self, continuation, details):
        handler = self.handlers.get(details.method)
        if handler is None:
            handler = await continuation(details)
            if handler is not None:
                self.handlers[details.method] = handler
        return handler
