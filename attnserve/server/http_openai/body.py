"""A request's JSON body, read within bounds before any work is spent on it: at most
--http-max-body-bytes (the declared Content-Length first, then the bytes as they arrive, so that an
oversized body is never read whole), UTF-8, nested at most MAX_JSON_DEPTH deep and holding at most
MAX_JSON_CONTAINERS objects and arrays (counted before the parse, whose cost they bound), then parsed
on a worker thread. What the body says is request.py's; no engine calls here.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from typing import Any

from starlette.requests import Request

from ...engine.domain import InvalidRequest
from .errors import BodyTooLarge

MAX_JSON_DEPTH = 64  # objects and arrays inside each other: a schema or a chat needs a handful
MAX_JSON_CONTAINERS = 65536  # objects and arrays in one body: 4096 messages with their parts fit
BODY_FLAG = "--http-max-body-bytes"
BRACKETS = bytes.maketrans(b"[{]}", b"(())")  # opening and closing, whatever their kind
NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[{]}")))


async def read_json(request: Request, max_bytes: int) -> Any:
    """The body's JSON value; BodyTooLarge (413) past `max_bytes`, InvalidRequest naming `body` otherwise."""
    raw = await read_bytes(request, max_bytes)
    return await asyncio.to_thread(parse, raw)


async def read_bytes(request: Request, max_bytes: int) -> bytearray:
    """The body, refused as soon as it is known to be larger than `max_bytes`: by its Content-Length
    before a byte is read, or by the bytes received so far (a chunked body). A bytearray, grown as the
    chunks come: no copy of the whole body on the event loop."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge("body", too_large(f"{int(declared)} bytes (Content-Length)", max_bytes))
    body = bytearray()
    async with aclosing(request.stream()) as stream:
        async for chunk in stream:
            if len(body) + len(chunk) > max_bytes:
                raise BodyTooLarge("body", too_large(f"more than {max_bytes} bytes", max_bytes))
            body += chunk
    return body


def too_large(size: str, max_bytes: int) -> str:
    return f"{size}, the limit is {max_bytes} bytes (the server's {BODY_FLAG})"


def parse(raw: bytes | bytearray) -> Any:
    """`raw` as JSON once its nesting and size are known to be in bounds (a worker thread's work)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest("body", f"not UTF-8 (byte {e.start}): JSON bodies are UTF-8") from None
    check_structure(raw)
    try:
        return json.loads(text)
    except ValueError as e:
        raise InvalidRequest("body", f"not JSON: {e}") from None


def check_structure(raw: bytes | bytearray) -> None:
    """InvalidRequest naming `body` if its JSON holds too many objects and arrays or nests them too deep:
    a few passes of bytes methods over its brackets outside strings, far cheaper than the parse (recursive,
    an object per value) that they guard."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return  # too few brackets, strings' included, to break either bound
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # escapes pair left to right: quotes left delimit
    brackets = b"".join(unescaped.split(b'"')[::2]).translate(BRACKETS, NOT_BRACKETS)
    containers = brackets.count(b"(")
    if containers > MAX_JSON_CONTAINERS:
        raise InvalidRequest("body", f"{containers} JSON objects and arrays, the limit is {MAX_JSON_CONTAINERS}")
    if nested_deeper(brackets, MAX_JSON_DEPTH):
        raise InvalidRequest("body", f"JSON nested more than {MAX_JSON_DEPTH} levels deep (the limit)")


def nested_deeper(brackets: bytes | bytearray, depth: int) -> bool:
    """Whether "(" and ")" nest deeper than `depth`: each round takes out the innermost pairs (a pair goes
    in the round of its height), so a pair left after `depth` rounds is deeper, as are more unclosed
    brackets than `depth`."""
    for _ in range(depth):
        brackets = brackets.replace(b"()", b"")
    return b"()" in brackets or brackets.count(b"(") > depth
