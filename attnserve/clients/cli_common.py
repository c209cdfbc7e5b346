"""What the client subcommands (generate, bench) share: connection and stream-interval flags,
number lists, errors."""

from __future__ import annotations

import argparse
import os
import sys

from ..flags import add_field_flags, check_pem, flag_name, shown
from ..request_fields import problems
from .channel import DEFAULT_TARGET, TlsConfig, parse_targets, read_token_file
from .errors import AttnserveError, exit_status
from .types import GenerationParams

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C

STREAM_INTERVAL = ("stream_interval_tokens", "stream_interval_ms")


def add_client_flags(p: argparse.ArgumentParser, timeout: float) -> None:
    """The connection flags; `timeout` is the subcommand's default deadline per call, in seconds."""
    p.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"server HOST:PORT, or several comma-separated (round_robin) (default: {DEFAULT_TARGET})",
    )
    p.add_argument(
        "--timeout", type=float, default=timeout, help=f"deadline of each call in seconds (default: {timeout})"
    )
    p.add_argument("--tls-ca", default=None, help="PEM CA bundle that signed the server's certificate (enables TLS)")
    p.add_argument("--tls-cert", default=None, help="PEM client certificate for mutual TLS (with --tls-key)")
    p.add_argument("--tls-key", default=None, help="PEM client private key for mutual TLS")
    p.add_argument("--tls-server-name", default=None, help="name to verify in the server's certificate")
    p.add_argument("--token-file", default=None, help="file with the bearer token the server expects")


def add_stream_interval_flags(p: argparse.ArgumentParser) -> None:
    """The request's stream interval, GenerationParams' fields; left out, the server's --stream-interval-* apply."""
    add_field_flags(p, GenerationParams, only=STREAM_INTERVAL)


def check_client_flags(args: argparse.Namespace, targets: bool = True) -> None:
    """The connection and stream-interval flags, before any call: ValueError naming the flag, its
    value and what it may be. `targets`: --target is gRPC's HOST:PORT list (else a URL, checked apart)."""
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {shown(args.timeout)}")
    if targets:
        try:
            parse_targets(args.target)
        except ValueError as e:
            raise ValueError(f"--target {args.target}: {e}") from None
    if args.tls_server_name is not None and not (args.tls_ca or args.tls_cert or args.tls_key):
        raise ValueError("--tls-server-name needs TLS: give --tls-ca (or --tls-cert and --tls-key)")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together (mutual TLS)")
    check_ranges({name: getattr(args, name) for name in STREAM_INTERVAL})


def check_ranges(values: dict[str, object]) -> None:
    """ValueError naming the first flag (by its field's name) whose value is outside the ranges that
    need no model, in the server's own words (attnserve/request_ranges.py): refused before a request is sent."""
    for name, value in values.items():
        for where, problem in problems(name, value):
            raise ValueError(f"{flag_name(where)}: {problem}")


def tls_from_args(args: argparse.Namespace) -> TlsConfig | None:
    """TLS from --tls-ca/--tls-cert/--tls-key/--tls-server-name; None (plaintext) if none given.
    Each file is read and checked to be PEM here, so that a wrong one is one line naming its flag
    (gRPC's own reading of a bad one prints several lines of its core's log)."""
    if not (args.tls_ca or args.tls_cert or args.tls_key):
        return None
    for flag, path in (("--tls-ca", args.tls_ca), ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path is not None:
            check_pem(flag, path)
    return TlsConfig.from_files(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)


def token_from_args(args: argparse.Namespace) -> str | None:
    """The bearer token of --token-file, if given."""
    if not args.token_file:
        return None
    try:
        return read_token_file(args.token_file)
    except OSError as e:
        raise ValueError(f"--token-file {args.token_file}: {e.strerror}") from None


def parse_numbers(text: str | None, kind: type, flag: str) -> tuple:
    """ "1,4,16" -> (1, 4, 16); None -> (); ValueError naming `flag` for anything else."""
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip()) if text else ()
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated numbers, not {text!r}") from None


def fail(prog: str, error: BaseException) -> int:
    """Print one line for a failure (no traceback) and return the exit status.

    A call's error exits 2 when the request must be fixed (INVALID_ARGUMENT), 1 otherwise; an
    unreadable file or malformed flag exits 2; a closed stdout (`| head`) exits 0 quietly.
    """
    if isinstance(error, BrokenPipeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
        return 0
    print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
    return exit_status(error) if isinstance(error, AttnserveError) else 2


def interrupted(prog: str) -> int:
    """Report a Ctrl-C and return 130."""
    print(f"\n{prog}: cancelled", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED
