"""Byte-level tokenizer: ids 0-255 are the UTF-8 bytes, then BOS, EOS and PAD.

Any text round-trips. A prompt is BOS followed by its bytes; training windows start with BOS too.
"""

from __future__ import annotations

from collections.abc import Sequence

from .byte_stream import ByteStream, ByteTable

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 259


def encode(text: str, bos: bool = True) -> list[int]:
    """BOS followed by the UTF-8 bytes of `text` (the bytes alone with bos=False)."""
    ids = list(text.encode("utf-8"))
    return [BOS_ID, *ids] if bos else ids


def decode(ids: Sequence[int]) -> str:
    """Text of the byte ids in `ids`; special ids are dropped, invalid UTF-8 is replaced."""
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


BYTES = ByteTable([bytes([i]) for i in range(256)] + [b""] * (VOCAB_SIZE - 256))


class ByteTokenizer:
    """The byte tokenizer behind the `Tokenizer` interface."""

    kind = "bytes"
    vocab_size, bos_id, eos_id, pad_id = VOCAB_SIZE, BOS_ID, EOS_ID, PAD_ID
    eos_ids = frozenset({EOS_ID})
    suppressed_ids: frozenset[int] = frozenset()
    add_bos = True

    def encode(self, text: str) -> list[int]:
        return encode(text, bos=False)

    def encode_prompt(self, text: str) -> list[int]:
        return encode(text, bos=True)

    def encode_chat(self, text: str) -> list[int]:
        return self.encode_prompt(text)  # no chat templates for the byte tokenizer (export refuses one)

    def decode(self, ids: Sequence[int]) -> str:
        return decode(ids)

    def decode_stream(self) -> ByteStream:
        """A byte stream (byte_stream.py): each id below 256 is its byte, the special ids none."""
        return BYTES.stream()

    def byte_lengths(self) -> list[int]:
        return [1] * 256 + [0] * (VOCAB_SIZE - 256)

    def state(self) -> dict:
        return {"kind": self.kind}
