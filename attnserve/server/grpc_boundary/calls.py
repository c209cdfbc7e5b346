"""What a gRPC door reads of its call beside the request: its deadline."""

from __future__ import annotations

import time

import grpc


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The call's deadline on time.monotonic()'s clock, or None without one."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining
