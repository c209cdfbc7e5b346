"""`attnserve generate`: one completion from a running server, streamed to the terminal.

The prompt is the positional text ('-' reads stdin) or --prompt-token-ids 256,105,109, token ids
the server uses as given; exactly one of them. Ctrl-C cancels the call on the server (its batch
slot frees at the next step) and exits 130. A failed call prints one line, "attnserve generate:
error: STATUS: details", and exits 2 for a request the caller must fix (INVALID_ARGUMENT, or
bad flags) or 1 otherwise; no traceback. The flags are declared in attnserve/cli.py.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from dataclasses import fields
from typing import TextIO

from .cli_common import fail, interrupted, parse_numbers, tls_from_args, token_from_args
from .client import DEFAULT_TIMEOUT, Client
from .errors import AttnserveError
from .types import GenerationParams, GenerationResult, Prompt

PROG = "attnserve generate"


def client_from_args(args: argparse.Namespace) -> Client:
    """A Client from the shared connection flags (--target, --timeout, --tls-*, --token-file)."""
    return Client(
        args.target,
        timeout=DEFAULT_TIMEOUT if args.timeout is None else args.timeout,
        token=token_from_args(args),
        tls=tls_from_args(args),
    )


def params_from_args(args: argparse.Namespace) -> GenerationParams:
    """GenerationParams from the sampling flags; a flag left out keeps the dataclass's default."""
    given = {f.name: getattr(args, f.name) for f in fields(GenerationParams)}
    return GenerationParams(**{name: value for name, value in given.items() if value is not None})


def prompt_from_args(args: argparse.Namespace) -> Prompt:
    """The prompt argument (stdin for "-") or the ids of --prompt-token-ids: exactly one."""
    if args.prompt is not None and args.prompt_token_ids is not None:
        raise ValueError("give a prompt or --prompt-token-ids, not both")
    if args.prompt_token_ids is not None:
        return parse_numbers(args.prompt_token_ids, int, "--prompt-token-ids")
    if args.prompt is None:
        raise ValueError("give a prompt (text, or '-' for stdin) or --prompt-token-ids")
    return sys.stdin.read() if args.prompt == "-" else args.prompt


def stream_to(
    out: TextIO | None, client: Client, prompt: Prompt, params: GenerationParams, request_id: str
) -> GenerationResult:
    """Write each delta as it arrives; any exit before the end (Ctrl-C) cancels it on the server."""
    with client.stream(prompt, params, request_id=request_id) as stream:
        for delta in stream:
            if out is not None:
                out.write(delta.text)
                out.flush()
        return stream.result()


def run(args: argparse.Namespace, out: TextIO | None = None) -> GenerationResult:
    """Generate as the flags say, printing to `out` (stdout); raises AttnserveError, Ctrl-C."""
    out = out or sys.stdout
    prompt = prompt_from_args(args)
    params = params_from_args(args)
    with client_from_args(args) as client:
        if args.no_stream:
            result = client.generate(prompt, params, request_id=args.request_id)
        else:
            result = stream_to(None if args.json else out, client, prompt, params, args.request_id)
    if args.json:
        out.write(json.dumps(result.to_dict()) + "\n")
    elif args.no_stream:
        out.write(result.text + "\n")
    else:
        out.write("\n")
    out.flush()
    return result


def main(args: argparse.Namespace) -> int:
    """CLI entry of `attnserve generate`: the exit status."""
    # SIGINT cancels the stream even when a non-interactive shell started us with it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run(args)
    except KeyboardInterrupt:
        return interrupted(PROG)
    except (AttnserveError, OSError, ValueError) as error:  # OSError, ValueError: files, target
        return fail(PROG, error)
    return 0
