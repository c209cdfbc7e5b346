"""Server-sent events from an HTTP/1.1 POST, and a JSON GET, on asyncio's streams alone (a client host
has no HTTP library): what `attnserve bench --backend openai` reads an OpenAI-compatible server with.

One connection per call (`Connection: close`), TLS for https:// URLs. A response's body is read by its
framing: chunked, Content-Length, or to the end of the connection. Each `data:` line of the event
stream is one event, yielded as it arrives; `data: [DONE]` ends it. A status other than 200 raises
HttpError with the status and the server's message (OpenAI's `error.message` when the body has one).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_HEADER_BYTES = 64 * 1024  # a response head larger than this is not an HTTP server's


class HttpError(Exception):
    """A call that got no answer (status 0) or another status than 200."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Endpoint:
    """Where an OpenAI-compatible server answers: its scheme, host, port and path prefix (/v1)."""

    secure: bool
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """http(s)://HOST[:PORT][/PREFIX]; the prefix defaults to /v1. ValueError saying what is wrong."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// URL such as http://127.0.0.1:8000/v1")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"{url!r} has no valid port") from None
        return cls(parts.scheme == "https", parts.hostname, port, parts.path.rstrip("/") or "/v1")

    def __str__(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.host}:{self.port}{self.prefix}"


@dataclass(frozen=True)
class HttpTarget:
    """An endpoint with the headers every call sends (the bearer token) and TLS for https://."""

    endpoint: Endpoint
    headers: Mapping[str, str]
    tls: ssl.SSLContext | None = None
    server_name: str | None = None  # the name to verify instead of the URL's host

    async def request(
        self, method: str, path: str, body: Mapping[str, Any] | None, headers: Mapping[str, str]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, str]]:
        """Send one request; the connection and the response's headers once its status is 200."""
        endpoint = self.endpoint
        tls = (self.tls or ssl.create_default_context()) if endpoint.secure else None
        try:
            reader, writer = await asyncio.open_connection(
                endpoint.host,
                endpoint.port,
                ssl=tls,
                server_hostname=self.server_name if tls else None,
                limit=MAX_HEADER_BYTES,
            )
        except (OSError, ssl.SSLError) as e:
            raise HttpError(0, f"cannot connect to {endpoint}: {getattr(e, 'strerror', None) or e}") from None
        payload = json.dumps(body).encode() if body is not None else b""
        head = [
            f"{method} {endpoint.prefix}{path} HTTP/1.1",
            f"Host: {endpoint.host}:{endpoint.port}",
            "Connection: close",
            "Accept: text/event-stream, application/json",
            *(f"{name}: {value}" for name, value in {**self.headers, **headers}.items()),
        ]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        try:
            status, fields = await read_head(reader)
            if status != 200:
                raise HttpError(status, error_message(await read_body(reader, fields)))
        except BaseException:
            writer.close()
            raise
        return reader, writer, fields

    async def events(
        self, path: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """POST `body` and yield each event of the streamed answer (a JSON object) as it arrives, up to
        [DONE]. HttpError for a status other than 200, an event that is not JSON or an error, or a
        stream that breaks off."""
        reader, writer, fields = await self.request("POST", path, body, headers or {})
        pending = b""
        try:
            async for chunk in body_chunks(reader, fields):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    event = parse_event(line.rstrip(b"\r"))
                    if event is DONE:
                        return
                    if event is not None:
                        yield event
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as e:
            raise HttpError(200, f"the stream broke off ({type(e).__name__})") from None
        finally:
            writer.close()
        raise HttpError(200, "the stream ended without [DONE]")

    async def get_json(self, path: str) -> Any:
        """GET `path` and its JSON body."""
        reader, writer, fields = await self.request("GET", path, None, {})
        try:
            body = await read_body(reader, fields)
        finally:
            writer.close()
        try:
            return json.loads(body)
        except ValueError:
            raise HttpError(200, f"GET {self.endpoint.prefix}{path} answered no JSON: {body[:80]!r}") from None


DONE: dict[str, Any] = {}  # the event stream's [DONE] (told apart by identity)


def parse_event(line: bytes) -> dict[str, Any] | None:
    """One line of an event stream: its data's JSON object, DONE, or None (comments, event names, blank
    lines). HttpError for data that is not JSON, or an error event."""
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return DONE
    try:
        event = json.loads(data)
    except ValueError:
        raise HttpError(200, f"an event that is not JSON: {data[:80]!r}") from None
    if not isinstance(event, dict):
        raise HttpError(200, f"an event that is not a JSON object: {data[:80]!r}")
    if "error" in event:
        raise HttpError(200, error_message(data))
    return event


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The status and the headers (names lowercased) of a response."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as e:
        raise HttpError(0, f"the server sent no HTTP response head ({type(e).__name__})") from None
    status_line, *lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpError(0, f"not an HTTP/1.1 response: {status_line[:80]!r}")
    fields = {}
    for line in filter(None, lines):
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return int(parts[1]), fields


async def body_chunks(reader: asyncio.StreamReader, fields: Mapping[str, str]) -> AsyncIterator[bytes]:
    """The body's bytes as they come, by its framing (chunked, Content-Length, or to the end)."""
    if "chunked" in fields.get("transfer-encoding", "").lower():
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)  # the chunk's CRLF
    elif "content-length" in fields:
        yield await reader.readexactly(int(fields["content-length"]))
    else:
        while chunk := await reader.read(65536):
            yield chunk


async def read_body(reader: asyncio.StreamReader, fields: Mapping[str, str]) -> bytes:
    try:
        return b"".join([chunk async for chunk in body_chunks(reader, fields)])
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        return b""


def error_message(body: bytes) -> str:
    """OpenAI's error.message (or a plain `detail` or `message`), else the body's first 200 characters."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        return text[:200] or "(no body)"
    found = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(found, dict):
        found = found.get("message") or found.get("detail") or found
    return str(found)[:500]
