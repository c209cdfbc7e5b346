"""The byte stream between the front end and the engine core: one Unix socket, msgpack frames both ways.

Each message (protocol.py) goes as its length (4 bytes, little-endian) and its msgpack bytes.
The front end listens on a socket in a folder of its own and the core it started connects. With
--api-server-count N the core listens in turn, in the same folder, for the N - 1 front ends more
(FRONTS, `fronts_path`), and each of them connects to it.

A plain socket and not ZeroMQ: a ZeroMQ send wakes the sender's own I/O thread, which on virtual
CPUs costs the engine core about 30 us a step, where a write to a Unix socket whose reader is not
asleep costs about 4 us (docs/design/decisions/core-channel.md). So the core writes its steps from
the engine thread itself, and the front end's receiver, while requests are in flight, naps between
looks for what has come instead of sleeping until woken (200 us, or 1 ms while its event loop is
busy: naps.py); with nothing in flight it sleeps in poll, and the first message wakes it.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
from typing import Any

import msgspec

HEADER = struct.Struct("<I")
FRONTS = "fronts.sock"  # the core's own listening socket, beside the first front end's
CHUNK = 1 << 20  # bytes read at once
ENCODER = msgspec.msgpack.Encoder()


class ChannelClosed(Exception):
    """The other end closed the socket (its process ended, or it stopped)."""


class Channel:
    """One end of the socket: send() from any thread (one at a time), take() and wait() from one."""

    def __init__(self, sock: socket.socket, decoder: msgspec.msgpack.Decoder):
        self.sock, self.decoder = sock, decoder
        self.sock.setblocking(True)
        self._buffer = bytearray()
        self._ended = False  # the other end closed: what is left in the buffer is all there is
        self._sending = threading.Lock()

    def send(self, message: Any) -> None:
        """Write one frame (blocks while the reader is a socket buffer behind: back-pressure, not loss)."""
        frame = bytearray(HEADER.size)
        ENCODER.encode_into(message, frame, HEADER.size)
        HEADER.pack_into(frame, 0, len(frame) - HEADER.size)
        with self._sending:
            self.sock.sendall(frame)

    def take(self) -> list[Any]:
        """Every whole message that has come, without waiting; once they are all taken, ChannelClosed
        at the end of the stream."""
        while not self._ended:
            try:
                data = self.sock.recv(CHUNK, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            self._ended = not data
            self._buffer += data
            if len(data) < CHUNK:
                break
        messages = self._frames()
        if self._ended and not messages:
            raise ChannelClosed("the other end closed the channel")
        return messages

    def _frames(self) -> list[Any]:
        messages, start, buffer = [], 0, self._buffer
        with memoryview(buffer) as view:
            while len(buffer) - start >= HEADER.size:
                (size,) = HEADER.unpack_from(buffer, start)
                end = start + HEADER.size + size
                if end > len(buffer):
                    break
                messages.append(self.decoder.decode(view[start + HEADER.size : end]))
                start = end
        if start:
            del buffer[:start]
        return messages

    def wait(self, timeout_s: float) -> bool:
        """Sleep until something can be read (or the other end closed) or `timeout_s` passed; True if so."""
        readable, _, _ = select.select([self.sock], [], [], timeout_s)
        return bool(readable)

    def close(self) -> None:
        self.sock.close()


def readable(socks: list[socket.socket], timeout_s: float) -> list[socket.socket]:
    """Those of `socks` that can be read (or were closed by the other end), after at most `timeout_s`."""
    return select.select(socks, [], [], timeout_s)[0]


def listen(path: str, backlog: int = 1) -> socket.socket:
    """A listening socket at `path`: the front end's (one connection: the core's), or the core's for the
    front ends more (`backlog` of them)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(backlog)
    return listener


def connect(path: str, decoder: msgspec.msgpack.Decoder) -> Channel:
    """Connect to the listening socket at `path`: the core to its front end's, a front end more to the core's."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return Channel(sock, decoder)


def fronts_path(path: str) -> str:
    """The core's socket for the front ends more, beside the first front end's socket at `path`."""
    return os.path.join(os.path.dirname(path), FRONTS)
