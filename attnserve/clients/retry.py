"""The one retry rule, handed to gRPC: resend only calls no server began (UNAVAILABLE).

A `RetryPolicy` becomes a methodConfig of the channel's service config, so gRPC itself resends
the calls, with exponential backoff, and never once the server's first response arrived: a
stream that may have generated text is not retried. A call's timeout covers all its attempts,
and the attempts whose backoffs would outlast the client's timeout are left out, so that an
unreachable server is reported as UNAVAILABLE rather than as a deadline. Health checks are left
out, so that they answer at once. And the retries are throttled (the service config's
`retryThrottling`, gRPC's token bucket per server name): every call that fails with a retryable
status takes a token, every call that succeeds gives back `throttle_ratio` of one, and while the
bucket holds half its `throttle_tokens` or less, failed calls are not resent. A server that answers
UNAVAILABLE to everything (down behind a proxy, draining, refusing streams) then gets about one
attempt per call, not five: no retry storm. Knows nothing about the service's messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import RETRYABLE

SERVICE = "attnserve.v1.TextGeneration"  # the methods a policy covers
GRPC_MAX_ATTEMPTS = 5  # gRPC clamps maxAttempts to 5, and logs an error above it
GRPC_JITTER = 0.2  # gRPC scales every backoff by a random factor in [0.8, 1.2], not configurable
GRPC_MAX_TOKENS = 1000  # gRPC refuses a retryThrottling whose maxTokens is above it


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for calls that failed before reaching a server."""

    max_attempts: int = 5  # 1 turns retries off; over 5 (gRPC's cap), calls wait for a server
    initial_backoff: float = 0.1  # seconds before the second attempt
    max_backoff: float = 2.0  # cap of one backoff, seconds
    multiplier: float = 2.0  # growth of the backoff per attempt
    jitter: float = 0.2  # no backoff comes sooner than (1 - jitter) times its nominal value
    throttle_tokens: int = 10  # the retry bucket's size; retries stop while it holds half or less
    throttle_ratio: float = 0.1  # tokens a call that succeeds gives back (a failed one takes 1)

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"RetryPolicy needs max_attempts >= 1 and 0 <= jitter < 1, got {self}")
        if min(self.initial_backoff, self.max_backoff, self.multiplier) <= 0:
            raise ValueError(f"RetryPolicy needs positive backoffs and multiplier, got {self}")
        if not 1 <= self.throttle_tokens <= GRPC_MAX_TOKENS or not 0.001 <= self.throttle_ratio <= self.throttle_tokens:
            raise ValueError(
                f"RetryPolicy needs 1 <= throttle_tokens <= {GRPC_MAX_TOKENS} and "
                f"0.001 <= throttle_ratio <= throttle_tokens, got {self}"
            )

    @property
    def retries(self) -> bool:
        """Whether a failed call may be sent again at all."""
        return self.max_attempts > 1

    @property
    def _scale(self) -> float:
        """gRPC's jitter is fixed at 20%: backoffs scaled by this never come sooner than ours would."""
        return (1 - self.jitter) / (1 - GRPC_JITTER)

    def attempts_within(self, timeout: float | None) -> int:
        """Attempts gRPC may make, no more than 5 and, every backoff at its longest, within `timeout`."""
        attempts, waited = 1, 0.0
        longest = self._scale * (1 + GRPC_JITTER)
        while attempts < min(self.max_attempts, GRPC_MAX_ATTEMPTS):
            waited += min(self.initial_backoff * self.multiplier ** (attempts - 1), self.max_backoff) * longest
            if timeout is not None and waited >= timeout:
                break
            attempts += 1
        return attempts

    def method_config(self, timeout: float | None = None) -> dict[str, Any]:
        """This policy as a gRPC methodConfig for the TextGeneration service, for calls of `timeout`."""
        config: dict[str, Any] = {"name": [{"service": SERVICE}]}
        if not self.retries:
            return config
        # gRPC allows 5 attempts at most: a policy asking for more means to outlast a restart,
        # which waitForReady does (until the call's deadline) with no attempt spent meanwhile.
        config["waitForReady"] = self.max_attempts > GRPC_MAX_ATTEMPTS
        attempts = self.attempts_within(None if config["waitForReady"] else timeout)
        if attempts < 2:
            return config
        config["retryPolicy"] = {
            "maxAttempts": attempts,
            "initialBackoff": _duration(self.initial_backoff * self._scale),
            "maxBackoff": _duration(self.max_backoff * self._scale),
            "backoffMultiplier": self.multiplier,
            "retryableStatusCodes": [error.code.name for error in RETRYABLE],
        }
        return config

    def throttling(self) -> dict[str, Any] | None:
        """The service config's retryThrottling for this policy (None: nothing is retried)."""
        if not self.retries:
            return None
        return {"maxTokens": self.throttle_tokens, "tokenRatio": round(self.throttle_ratio, 3)}


NO_RETRY = RetryPolicy(max_attempts=1)


def _duration(seconds: float) -> str:
    """A protobuf JSON Duration, as the service config writes them: "0.125s"."""
    return f"{seconds:.6f}s"


def check_timeout(timeout: float) -> float:
    """A call's deadline in seconds, refused unless positive (gRPC would fail it at once)."""
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    return timeout
