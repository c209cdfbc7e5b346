"""Deadlines and the one retry rule: resend only calls no server began (UNAVAILABLE).

A call's timeout covers all its attempts: each attempt gets what is left of it, and a backoff
that would outlast it is not slept. Streams reuse `next_delay` but decide themselves whether a
token has already arrived. Knows nothing about the service's messages.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from .errors import AttnserveError, DeadlineExceeded, from_rpc_error, retryable

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for calls that failed before reaching a server."""

    max_attempts: int = 5  # 1 turns retries off
    initial_backoff: float = 0.1  # seconds before the second attempt
    max_backoff: float = 2.0  # cap of one backoff, seconds
    multiplier: float = 2.0  # growth of the backoff per attempt
    jitter: float = 0.2  # each backoff is scaled by a random factor in [1-j, 1+j]

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        base = min(self.initial_backoff * self.multiplier ** (attempt - 1), self.max_backoff)
        return base * random.uniform(1 - self.jitter, 1 + self.jitter)


NO_RETRY = RetryPolicy(max_attempts=1)


class Deadline:
    """An absolute deadline for a call and its retries."""

    def __init__(self, timeout: float) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.timeout = timeout
        self.at = time.monotonic() + timeout

    def remaining(self) -> float:
        """Seconds left; raises DeadlineExceeded once none are."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"deadline of {self.timeout:g} s exceeded")
        return left


def next_delay(policy: RetryPolicy, attempt: int, error: AttnserveError, deadline: Deadline) -> float | None:
    """The backoff before retrying a failed attempt, or None when the error must be raised."""
    if not retryable(error) or attempt >= policy.max_attempts:
        return None
    delay = policy.backoff(attempt)
    return delay if delay < deadline.at - time.monotonic() else None


def call_with_retry(attempt: Callable[[float], T], policy: RetryPolicy, deadline: Deadline) -> T:
    """Run `attempt(timeout_left)` until it succeeds or fails for good, raising typed errors."""
    for number in range(1, policy.max_attempts + 1):
        try:
            return attempt(deadline.remaining())
        except grpc.RpcError as rpc_error:
            error = from_rpc_error(rpc_error)
        delay = next_delay(policy, number, error, deadline)
        if delay is None:
            raise error
        time.sleep(delay)
    raise AssertionError("unreachable: the last attempt raises")


async def call_with_retry_async(attempt: Callable[[float], Awaitable[T]], policy: RetryPolicy, deadline: Deadline) -> T:
    """The asyncio twin of `call_with_retry`."""
    for number in range(1, policy.max_attempts + 1):
        try:
            return await attempt(deadline.remaining())
        except grpc.RpcError as rpc_error:
            error = from_rpc_error(rpc_error)
        delay = next_delay(policy, number, error, deadline)
        if delay is None:
            raise error
        await asyncio.sleep(delay)
    raise AssertionError("unreachable: the last attempt raises")
