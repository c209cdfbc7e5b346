"""The OpenAI-compatible HTTP door bounds what it reads before it works on it (issue 58, item 2): a body
over --http-max-body-bytes is 413 by its Content-Length, or while a chunked one arrives (256 MB never
read whole); JSON nested too deep or holding too many objects and arrays is 400, never 500; a chat's
model is checked first, its messages' count and bytes before the template renders them, the rendered
prompt's bytes before it is tokenized; and while a 16 MB chat request is refused, /health answers
within 50 ms (rendering and tokenizing run off the event loop).

The big bodies go over a raw socket, written lazily by a thread of their own while the test reads the
answer: a server that refuses before the body ends is seen doing so, and how much was written by then
says how much it could have read.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx  # the HTTP library of the openai client pinned in [dev]
import pytest
from fixtures_server import ServeProcess, idle, wait_until

from attnserve.server.http_openai.body import MAX_JSON_CONTAINERS, MAX_JSON_DEPTH
from attnserve.server.http_openai.request import MAX_CHAT_MESSAGES

DEFAULT_BODY_LIMIT = 4 * 2**20  # --http-max-body-bytes' default, as gRPC's largest received message
ROOMY_BODY_LIMIT = 32 * 2**20  # a server whose body limit lets a 16 MB chat reach the chat's own bounds
MB = 2**20
TIMEOUT = 60


@pytest.fixture(scope="module")
def roomy_server(chat_model_dir):
    """`attnserve serve` in a process of its own, as it runs in production: the test's threads do not
    share its GIL; its body limit lets a 16 MB chat reach the chat's own bounds. (port, model name)"""
    served = ServeProcess(
        *("--model", str(chat_model_dir), "--port", "0", "--http-port", "0", "--provider", "cpu", "--threads", "1"),
        *("--http-max-body-bytes", str(ROOMY_BODY_LIMIT), "--log-stats-interval", "0"),
    )
    try:
        yield http_port_of(served), chat_model_dir.name
    finally:
        served.proc.terminate()
        served.wait()


def http_port_of(served: ServeProcess) -> int:
    """The HTTP port `attnserve serve --http-port 0` prints after the gRPC one."""
    for line in served.proc.stdout:
        served.lines.append(line)
        found = re.search(r"OpenAI-compatible API on http://\S+:(\d+)/v1", line)
        if found:
            return int(found.group(1))
    pytest.fail(f"no HTTP port printed:\n{''.join(served.lines)}")


@pytest.fixture
def live(chat_server):
    yield chat_server
    wait_until(lambda: idle(chat_server.engine), what="the chat server to go idle")


class RawPost:
    """A POST whose body a thread of its own writes from `chunks` (with a Content-Length if given, else
    chunked) while the caller reads the answer; `sent` counts the body's bytes written so far."""

    def __init__(self, port: int, path: str, chunks: Iterable[bytes], length: int | None = None):
        self.socket = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
        self.socket.sendall(head.encode())
        self.sent, self.answered = 0, threading.Event()
        self.writer = threading.Thread(target=self.write, args=(chunks, length is None), daemon=True)
        self.writer.start()

    def write(self, chunks: Iterable[bytes], chunked: bool) -> None:
        try:
            for chunk in chunks:
                if self.answered.is_set():
                    return
                self.socket.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                self.sent += len(chunk)
            if chunked:
                self.socket.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server closed the connection: the rest of the body is refused unread

    def answer(self) -> tuple[int, dict[str, str], dict]:
        """The status, headers and JSON body of the answer; the writer stops once it has come."""
        response = http.client.HTTPResponse(self.socket)
        response.begin()
        self.answered.set()
        body = json.loads(response.read())
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body

    def close(self) -> None:
        self.answered.set()
        self.socket.close()
        self.writer.join(TIMEOUT)


def lazily(prefix: bytes, filler: int, size: int, suffix: bytes) -> Iterator[bytes]:
    """`prefix`, `size` bytes of the byte `filler` a MiB at a time (never held whole), then `suffix`."""
    yield prefix
    chunk = bytes([filler]) * MB
    for start in range(0, size, MB):
        yield chunk[: min(MB, size - start)]
    yield suffix


def chat_chunks(model: str, content_bytes: int) -> tuple[Iterator[bytes], int]:
    """A chat body with one user message of `content_bytes` x's, as chunks, and its length."""
    prefix = json.dumps({"model": model, "messages": [{"role": "user", "content": ""}]})[:-4].encode()
    suffix = b'"}]}'
    return lazily(prefix, ord("x"), content_bytes, suffix), len(prefix) + content_bytes + len(suffix)


def http_url(running, path: str) -> str:
    return f"http://127.0.0.1:{running.server.http.port}{path}"


def model(running) -> str:
    return running.server.info.model_name


def post(running, path: str, body: bytes | dict) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    return httpx.post(http_url(running, path), content=content, headers=headers, timeout=TIMEOUT)


def refusal(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


# ---- the body's bytes ----------------------------------------------------------------------------


def test_a_body_declared_over_the_limit_is_413_naming_the_limit_and_the_flag_before_it_is_read(live):
    raw = RawPost(live.server.http.port, "/v1/completions", lazily(b'{"prompt": "', ord("x"), 16 * MB, b'"}'), 300 * MB)
    try:
        status, headers, body = raw.answer()
    finally:
        raw.close()
    assert status == 413 and headers["connection"] == "close"
    error = body["error"]
    assert error["param"] == "body" and error["code"] == "request_too_large"
    assert error["message"] == (
        f"body: {300 * MB} bytes (Content-Length), the limit is {DEFAULT_BODY_LIMIT} bytes "
        "(the server's --http-max-body-bytes)"
    )


def test_a_256_mb_chunked_body_is_refused_with_413_before_it_is_read_whole(live):
    """Generated a MiB at a time and stopped once answered: the server answered after at most the limit
    and what the sockets' buffers hold, not after 256 MB."""
    chunks = lazily(b'{"model": "%s", "prompt": "' % model(live).encode(), ord("x"), 256 * MB, b'"}')
    raw = RawPost(live.server.http.port, "/v1/completions", chunks)
    try:
        status, headers, body = raw.answer()
        sent_when_answered = raw.sent
    finally:
        raw.close()
    assert status == 413 and headers["connection"] == "close"
    assert body["error"]["message"] == (
        f"body: more than {DEFAULT_BODY_LIMIT} bytes, the limit is {DEFAULT_BODY_LIMIT} bytes "
        "(the server's --http-max-body-bytes)"
    )
    assert sent_when_answered < 64 * MB, f"{sent_when_answered} bytes were written before the answer"


# ---- the body's JSON -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 10_000])
def test_json_nested_too_deep_is_400_naming_the_limit(live, path, depth):
    """10,000 levels were a RecursionError (500) in the JSON parser; 65 would reach the template."""
    nested = "[" * depth + "]" * depth
    body = f'{{"model": "{model(live)}", "prompt": {nested}}}'.encode()
    error = refusal(post(live, path, body), 400)
    assert error["param"] == "body" and error["type"] == "invalid_request_error"
    assert error["message"] == f"body: JSON nested more than {MAX_JSON_DEPTH} levels deep (the limit)"


def test_json_nested_to_the_limit_and_brackets_in_strings_are_read(live):
    nested = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    body = {"model": model(live), "prompt": "[{" * 1000 + '\\"[', "max_tokens": 1, "logit_bias": json.loads(nested)}
    error = refusal(post(live, "/v1/completions", body), 400)
    assert error["param"] == "logit_bias"  # the body was read: its fields are judged


def test_json_holding_too_many_objects_and_arrays_is_400_naming_the_limit(live):
    body = {"model": model(live), "prompt": [[]] * (MAX_JSON_CONTAINERS + 1)}
    error = refusal(post(live, "/v1/completions", body), 400)
    held = 1 + 1 + MAX_JSON_CONTAINERS + 1  # the body, its prompt, and the prompt's lists
    assert error["message"] == f"body: {held} JSON objects and arrays, the limit is {MAX_JSON_CONTAINERS}"


# ---- a chat's bounds -----------------------------------------------------------------------------


def test_a_chats_model_is_checked_before_its_messages(live):
    body = {"model": "gpt-4", "messages": [{"role": "user"}] * (MAX_CHAT_MESSAGES + 1)}
    error = refusal(post(live, "/v1/chat/completions", body), 404)
    assert error["param"] == "model" and error["code"] == "model_not_found"


def test_an_unknown_models_name_is_not_echoed_whole(live):
    error = refusal(post(live, "/v1/completions", {"model": "m" * 1_000_000, "prompt": "x"}), 404)
    assert f"the model `{'m' * 80}...` does not exist" in error["message"] and len(error["message"]) < 300


def test_too_many_messages_are_400_naming_messages_and_the_limit(live):
    body = {"model": model(live), "messages": [{"role": "user", "content": "hi"}] * (MAX_CHAT_MESSAGES + 1)}
    error = refusal(post(live, "/v1/chat/completions", body), 400)
    assert error["param"] == "messages"
    assert error["message"] == f"messages: {MAX_CHAT_MESSAGES + 1} messages, the limit is {MAX_CHAT_MESSAGES}"


def test_messages_longer_than_a_prompt_are_400_naming_the_message_that_passes_the_bound(live):
    limits = live.server.limits
    third = limits.max_prompt_bytes // 3 + 1
    body = {"model": model(live), "messages": [{"role": "user", "content": "x" * third}] * 3}
    error = refusal(post(live, "/v1/chat/completions", body), 400)
    assert error["param"] == "messages[2].content"
    assert error["message"] == (
        f"messages[2].content: the contents so far are {3 * third} UTF-8 bytes, more than any "
        f"{limits.max_prompt_tokens} tokens can hold (the limit is {limits.max_prompt_bytes} bytes)"
    )


def test_a_rendered_prompt_longer_than_a_prompt_is_400_before_it_is_tokenized(live):
    limits = live.server.limits
    body = {"model": model(live), "messages": [{"role": "user", "content": "x" * limits.max_prompt_bytes}]}
    rendered = len(f"User: {'x' * limits.max_prompt_bytes}\nAssistant:")
    error = refusal(post(live, "/v1/chat/completions", body), 400)
    assert error["param"] == "messages"
    assert error["message"] == (
        f"messages: the chat template renders them as {rendered} UTF-8 bytes, more than any "
        f"{limits.max_prompt_tokens} tokens can hold (the limit is {limits.max_prompt_bytes} bytes)"
    )


# ---- one big request never holds up the others ----------------------------------------------------


def refused_while_probing(port: int, chunks: Iterable[bytes], length: int) -> tuple[tuple, list[float]]:
    """The answer to a chat request of `chunks`, and the latency of each GET /health (each answered 200)
    made from the moment its body starts until it is answered and its writer has stopped (at least
    three). The latencies are not judged against a clock (a busy machine's scheduler sets them); what
    held every door for 20 s was the render and tokenizing, which the refusal's field shows never ran."""
    health = f"http://127.0.0.1:{port}/health"
    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=TIMEOUT) as client:
        client.get(health)  # the probes' connection, open before the big request
        raw = RawPost(port, "/v1/chat/completions", chunks, length)
        try:
            answered = pool.submit(raw.answer)
            latencies: list[float] = []
            while not answered.done() or raw.writer.is_alive() or len(latencies) < 3:
                start = time.perf_counter()
                assert client.get(health).status_code == 200
                latencies.append(time.perf_counter() - start)
            return answered.result(TIMEOUT), latencies
        finally:
            raw.close()


def test_health_answers_while_a_16_mb_chat_request_is_refused(live):
    """The issue's case, at the default body limit: refused by its Content-Length (413), never read;
    the probes beside it are answered (200)."""
    port = live.server.http.port
    (status, _, body), _ = refused_while_probing(port, *chat_chunks(model(live), 16 * MB))
    assert status == 413 and body["error"]["param"] == "body"


def test_health_answers_while_a_16_mb_chat_is_read_and_refused_by_its_bounds(roomy_server):
    """With a body limit above 16 MB, the body is read, parsed off the event loop and refused by the
    messages' bytes, never rendered nor tokenized (which held every door for 20 s)."""
    port, name = roomy_server
    (status, _, body), latencies = refused_while_probing(port, *chat_chunks(name, 16 * MB))
    assert status == 400 and body["error"]["param"] == "messages[0].content"
    assert len(latencies) >= 3
