"""`attnserve generate`: one completion from a running server, streamed to the terminal.

The prompt is the positional text ('-' reads stdin) or --prompt-token-ids 256,105,109, token ids
the server uses as given; exactly one of them. Ctrl-C cancels the call on the server (its batch
slot frees at the next step) and exits 130. A failed call prints one line, "attnserve generate:
error: STATUS: details", and exits 2 for a request the caller must fix (INVALID_ARGUMENT, or
bad flags) or 1 otherwise; no traceback. The sampling flags are GenerationParams' fields.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
from dataclasses import fields
from typing import TextIO

from ..flags import add_field_flags, flag_name
from .cli_common import (
    STREAM_INTERVAL,
    add_client_flags,
    add_stream_interval_flags,
    check_client_flags,
    check_ranges,
    fail,
    interrupted,
    parse_numbers,
    tls_from_args,
    token_from_args,
)
from .client import DEFAULT_TIMEOUT, Client
from .errors import AttnserveError
from .types import GenerationParams, GenerationResult, Prompt

PROG = "attnserve generate"
SAMPLING = tuple(f.name for f in fields(GenerationParams) if "help" in f.metadata and f.name not in STREAM_INTERVAL)


FIELD = re.compile(r"(?:structured_output\.)?(\w+)(\[\d+\])?:")  # how the server's INVALID_ARGUMENT details begin
FLAG_FIELDS = {*(f.name for f in fields(GenerationParams)), "stop", "request_id", "prompt_token_ids"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`attnserve generate`'s flags: the prompt, GenerationParams' fields, output and connection."""
    p.description = (
        "Stream a completion to the terminal; Ctrl-C cancels it on the server (exit 130). The prompt is "
        "text or, with --prompt-token-ids, token ids. Errors print one line and exit 2 (bad request) or 1."
    )
    p.add_argument(
        "prompt",
        nargs="?",
        default=None,
        help="text to continue ('-' reads it from stdin); leave it out with --prompt-token-ids",
    )
    p.add_argument(
        "--prompt-token-ids",
        default=None,
        metavar="ID,ID,...",
        help="the prompt as comma-separated token ids, sent as given (nothing prepended), "
        "e.g. 256,105,109; instead of the text prompt",
    )
    add_field_flags(p, GenerationParams, only=SAMPLING)
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop when the text contains TEXT (repeat the flag for several)",
    )
    p.add_argument(
        "--stop-token-ids",
        default=None,
        metavar="ID,ID,...",
        help="comma-separated token ids that end the completion when generated, as EOS does (not returned)",
    )
    p.add_argument(
        "--logit-bias",
        default=None,
        metavar="ID=BIAS,...",
        help="comma-separated token id=bias pairs added to the logits, each bias in [-100, 100], e.g. 50=-100,7=2.5",
    )
    p.add_argument(
        "--json-schema",
        default=None,
        metavar="SCHEMA",
        help="the output is one JSON value this JSON schema validates: its JSON text, or @FILE to read it",
    )
    add_stream_interval_flags(p)
    p.add_argument("--request-id", default="", help="id echoed by the server and in its logs")
    p.add_argument("--no-stream", action="store_true", help="one unary Generate call instead of a stream")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: text, token_ids, finish_reason, usage, timings, request_id",
    )
    add_client_flags(p, timeout=DEFAULT_TIMEOUT)


def client_from_args(args: argparse.Namespace) -> Client:
    """A Client from the shared connection flags (--target, --timeout, --tls-*, --token-file)."""
    return Client(
        args.target,
        timeout=args.timeout,
        token=token_from_args(args),
        tls=tls_from_args(args),
    )


def params_from_args(args: argparse.Namespace) -> GenerationParams:
    """GenerationParams from the sampling flags; a flag left out keeps the dataclass's default."""
    given = {f.name: getattr(args, f.name) for f in fields(GenerationParams)}
    given["stop_token_ids"] = parse_numbers(args.stop_token_ids, int, "--stop-token-ids")
    given["logit_bias"] = parse_bias(args.logit_bias)
    check_ranges({**given, "logit_bias": dict(given["logit_bias"])})
    given["json_schema"] = read_schema(args.json_schema)
    if given["json_schema"] is not None and args.regex is not None:
        raise ValueError("give --json-schema or --regex, not both")
    return GenerationParams(**{name: value for name, value in given.items() if value is not None})


def parse_bias(text: str | None) -> tuple[tuple[int, float], ...]:
    """--logit-bias "50=-100,7=2.5" -> ((50, -100.0), (7, 2.5)); ValueError naming the flag otherwise."""
    pairs = []
    for part in filter(None, (piece.strip() for piece in (text or "").split(","))):
        token, _, bias = part.partition("=")
        try:
            pairs.append((int(token), float(bias)))
        except ValueError:
            raise ValueError(f"--logit-bias takes comma-separated ID=BIAS pairs (e.g. 50=-100), not {text!r}") from None
    return tuple(pairs)


def read_schema(text: str | None) -> str | None:
    """--json-schema's text, or the file that @PATH names (the server checks the schema)."""
    if text is None or not text.startswith("@"):
        return text
    try:
        with open(text[1:], encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--json-schema {text}: {getattr(e, 'strerror', None) or e}") from None


def prompt_from_args(args: argparse.Namespace) -> Prompt:
    """The prompt argument (stdin for "-") or the ids of --prompt-token-ids: exactly one."""
    if args.prompt is not None and args.prompt_token_ids is not None:
        raise ValueError("give a prompt or --prompt-token-ids, not both")
    if args.prompt_token_ids is not None:
        ids = parse_numbers(args.prompt_token_ids, int, "--prompt-token-ids")
        check_ranges({"prompt_token_ids": ids})
        return ids
    if args.prompt is None:
        raise ValueError("give a prompt (text, or '-' for stdin) or --prompt-token-ids")
    return read_stdin() if args.prompt == "-" else args.prompt


def read_stdin() -> str:
    """The prompt piped in, which must be UTF-8 text (the server takes text as UTF-8)."""
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"the prompt on stdin is not UTF-8 text (byte {e.start}: {data[e.start : e.start + 1]!r}); "
            "pass token ids with --prompt-token-ids instead"
        ) from None


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
    check_client_flags(args)
    prompt = prompt_from_args(args)
    params = params_from_args(args)
    # n completions (or a beam search's hypotheses) are printed whole, one after the other
    whole = args.no_stream or (params.n or 1) > 1 or (params.num_beams or 1) > 1
    client = client_from_args(args)
    try:
        if whole:
            result = client.generate(prompt, params, request_id=args.request_id)
        else:
            result = stream_to(None if args.json else out, client, prompt, params, args.request_id)
    except KeyboardInterrupt:
        # The call is cancelled (the stream's exit, or _wait's) and the process exits next: the channel is
        # left to that. Closed now, before grpc's own thread has taken the cancelled call's last events
        # (a busy CPU delays it), that thread takes the closing queue's event instead and prints a TypeError
        # (grpc 1.85's _run_channel_spin_thread).
        raise
    except BaseException:
        client.close()
        raise
    client.close()
    if args.json:
        out.write(json.dumps(result.to_dict()) + "\n")
    elif (params.num_beams or 1) > 1:  # each hypothesis with its score, best first
        for c in result.completions or (result,):
            index = getattr(c, "index", 0)
            out.write(f"[{index}, score {c.score:.4f}] {c.text}\n")
    elif result.completions:
        out.write("".join(f"[{c.index}] {c.text}\n" for c in result.completions))
    elif whole:
        out.write(result.text + "\n")
    else:
        out.write("\n")
    out.flush()
    return result


def in_flag_words(error: AttnserveError) -> AttnserveError:
    """The server names a request's field ("max_new_tokens: 0 is outside [1, 127]", "stop[0]: ..."); the
    command line says the flag that set it ("--max-new-tokens: 0 is outside [1, 127]")."""
    field_name = FIELD.match(error.details)
    if field_name is None or field_name.group(1) not in FLAG_FIELDS:
        return error
    return type(error)(flag_name(field_name.group(1)) + error.details[field_name.end(1) :], error.code)


def main(args: argparse.Namespace) -> int:
    """CLI entry of `attnserve generate`: the exit status."""
    # SIGINT cancels the stream even when a non-interactive shell started us with it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run(args)
    except KeyboardInterrupt:
        return interrupted(PROG)
    except AttnserveError as error:
        return fail(PROG, in_flag_words(error))
    except (OSError, ValueError) as error:  # files, target
        return fail(PROG, error)
    return 0
