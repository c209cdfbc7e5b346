"""Typed exceptions for every gRPC status code, and the one place an RpcError becomes one.

Callers catch `AttnserveError` (or one subclass) instead of `grpc.RpcError`; each error carries
the status `code` and the server's `details`. Nothing else in the clients inspects status codes
except the retry policy, which hands gRPC the codes of `RETRYABLE`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc


class AttnserveError(Exception):
    """A call failed: `code` is the gRPC status, `details` the server's message naming the cause."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str = "", code: grpc.StatusCode | None = None) -> None:
        super().__init__(details)
        self.details = details
        if code is not None:
            self.code = code

    @property
    def status(self) -> str:
        """The status code's name, e.g. "INVALID_ARGUMENT"."""
        return self.code.name

    def __str__(self) -> str:
        return f"{self.status}: {self.details}" if self.details else self.status


class Cancelled(AttnserveError):
    """The call was cancelled (by this client, or by the server)."""

    code = grpc.StatusCode.CANCELLED


class Unknown(AttnserveError):
    """The server (or the transport) failed in a way it did not classify."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(AttnserveError):
    """A request parameter is out of range, or the prompt is empty or too long."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(AttnserveError):
    """The call's deadline passed before it finished."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(AttnserveError):
    """The method or service does not exist on the server."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(AttnserveError):
    """The server refused to create something that exists."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(AttnserveError):
    """The caller is known but not allowed to make this call."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(AttnserveError):
    """The server's queue is full (or a message is over the size limit): back off and retry."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(AttnserveError):
    """The server is not in a state to run the call."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(AttnserveError):
    """The server aborted the call."""

    code = grpc.StatusCode.ABORTED


class OutOfRange(AttnserveError):
    """A value is past the end of a valid range."""

    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(AttnserveError):
    """The server does not implement this method."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(AttnserveError):
    """A bug on the server; the details carry its request id for its logs."""

    code = grpc.StatusCode.INTERNAL


class Unavailable(AttnserveError):
    """No server could be reached, or it is draining: safe to retry with backoff."""

    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(AttnserveError):
    """Unrecoverable data loss or corruption."""

    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(AttnserveError):
    """The bearer token is missing or wrong."""

    code = grpc.StatusCode.UNAUTHENTICATED


ERRORS: dict[grpc.StatusCode, type[AttnserveError]] = {cls.code: cls for cls in AttnserveError.__subclasses__()}

# Failures of calls that no server began (or one that is draining): the only ones resent.
RETRYABLE: tuple[type[AttnserveError], ...] = (Unavailable,)

# Exit statuses of the command-line tools: 2 for a request the caller must fix, 1 otherwise.
USAGE_ERRORS = (InvalidArgument, OutOfRange, FailedPrecondition)


def from_rpc_error(error: grpc.RpcError) -> AttnserveError:
    """The typed exception for a failed call (sync `RpcError` or `grpc.aio.AioRpcError`)."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = error.details() if callable(getattr(error, "details", None)) else None
    if code is None:
        return Unknown(str(error))
    return ERRORS.get(code, AttnserveError)(details or "", code)


@contextmanager
def typed_errors() -> Iterator[None]:
    """Re-raise a failed call's `grpc.RpcError` as its typed exception, for callers to catch."""
    try:
        yield
    except grpc.RpcError as error:
        raise from_rpc_error(error) from None


def retryable(error: AttnserveError) -> bool:
    """Whether a call that failed this way may be sent again: only if no server began it."""
    return isinstance(error, RETRYABLE)


def exit_status(error: AttnserveError) -> int:
    """The process exit status a command-line tool uses for this error."""
    return 2 if isinstance(error, USAGE_ERRORS) else 1
