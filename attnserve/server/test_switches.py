"""TEST ONLY: the two ways a test makes a server misbehave on purpose; neither is a flag, and no product
signature carries either.

- A sleep in every engine step with a batch, so that a test outside the server's process finds
  generations still running: $ATTNSERVE_TEST_STEP_DELAY_MS (TEST_STEP_DELAY_VARIABLE) in the
  environment of `attnserve serve` or `attnserve ray-serve`, which the engine core reads itself
  wherever it runs (core/slow_steps.py, whose copy of the name a test binds to this one; a core
  process and a local Ray head's replicas inherit it). Named here too so that a load driver finds
  it without importing the engine.
- Bytes kept forever by every call, the soak's negative control (a leak its RSS check must catch):
  LeakInterceptor, a gRPC interceptor passed in as code embedding a Server passes any
  (`Server(config, interceptors=[...])`). `python -m attnserve.server.test_switches --leak-bytes N
  SERVE-ARGS` is `attnserve serve SERVE-ARGS` with one passed in (benchmarks/loadtest/soak.py runs it).
"""

from __future__ import annotations

import argparse
import logging
import sys

import grpc

from .grpc_boundary.handlers import stream_of, wrap_handler

log = logging.getLogger(__name__)

TEST_STEP_DELAY_VARIABLE = "ATTNSERVE_TEST_STEP_DELAY_MS"  # ms slept by every engine step with a batch


class LeakInterceptor(grpc.aio.ServerInterceptor):
    """Every call through it keeps `nbytes` for good (in `leaked`)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.leaked: list[bytes] = []
        self.said = False  # the warning, logged at the first call (the server has set up its logging then)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return handler
        if not self.said:
            log.warning("TEST ONLY: every call leaks %d bytes (test_switches.py's LeakInterceptor)", self.nbytes)
            self.said = True

        async def unary(behavior, request, context):
            self.leak()
            return await behavior(request, context)

        async def stream(behavior, request, context):
            self.leak()
            async for response in stream_of(behavior, request, context):
                yield response

        return wrap_handler(handler, unary, stream)

    def leak(self) -> None:
        self.leaked.append(b"\xa5" * self.nbytes)


def main(argv: list[str] | None = None) -> int:
    """`attnserve serve` with a LeakInterceptor passed in: --leak-bytes N, then serve's own arguments."""
    from .app import main as serve_main
    from .config import ServerConfig

    parser = argparse.ArgumentParser(prog="python -m attnserve.server.test_switches", allow_abbrev=False)
    parser.add_argument("--leak-bytes", type=int, required=True, help="bytes every call keeps for good")
    ServerConfig.add_cli_args(parser)
    args = parser.parse_args(argv)
    return serve_main(args, [LeakInterceptor(args.leak_bytes)])


if __name__ == "__main__":
    sys.exit(main())
