"""The engine core's channel (attnserve/core/channel.py) on a real Unix socket pair: frames of any size arrive
whole and in order however the stream cuts them, and the other end's close is an error, not a hang."""

from __future__ import annotations

import socket
import threading

import msgspec
import pytest

from attnserve.core import channel as core_channel
from attnserve.core.channel import CHUNK, Channel, ChannelClosed

DECODER = msgspec.msgpack.Decoder()


def pair() -> tuple[Channel, Channel]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return Channel(a, DECODER), Channel(b, DECODER)


def test_frames_of_every_size_arrive_whole_and_in_order():
    """Small frames many to a read, and frames larger than a read (3 MB) cut across reads, from a
    writer that blocks while the reader is a socket buffer behind."""
    writer, reader = pair()
    messages = [{"n": i, "body": "x" * size} for i, size in enumerate([0, 1, 100, 3 * CHUNK, 7, 65_000] * 20)]
    sending = threading.Thread(target=lambda: [writer.send(m) for m in messages])
    sending.start()
    got: list = []
    while len(got) < len(messages):
        assert reader.wait(10.0), "the writer stalled"
        got += reader.take()
    sending.join()
    assert got == messages
    assert reader.take() == []


def test_a_closed_end_is_channel_closed_after_what_it_sent():
    writer, reader = pair()
    writer.send(["last", 1])
    writer.close()
    assert reader.wait(1.0)
    assert reader.take() == [["last", 1]]
    with pytest.raises(ChannelClosed):
        reader.take()


def test_frames_sent_just_before_a_close_are_all_taken_first(monkeypatch):
    """Frames and the close already waiting, read a byte at a time here (so that the reads reach the
    end of the stream in the call that finds the frames): every frame is taken before ChannelClosed."""
    monkeypatch.setattr(core_channel, "CHUNK", 1)
    writer, reader = pair()
    messages = [{"n": i, "body": "y" * 50} for i in range(7)]
    for message in messages:
        writer.send(message)
    writer.close()
    assert reader.wait(1.0)
    assert reader.take() == messages
    with pytest.raises(ChannelClosed):
        reader.take()


def test_take_returns_nothing_while_a_frame_is_incomplete():
    writer, reader = pair()
    frame = bytearray(4)
    msgspec.msgpack.Encoder().encode_into("hello", frame, 4)
    frame[:4] = (len(frame) - 4).to_bytes(4, "little")
    writer.sock.sendall(frame[:6])
    assert reader.wait(1.0)
    assert reader.take() == []
    writer.sock.sendall(frame[6:])
    assert reader.wait(1.0)
    assert reader.take() == ["hello"]
