"""Byte-level tokenizer: ids 0-255 are the UTF-8 bytes, then BOS, EOS and PAD.

Any text round-trips. Torch-free, so that the server could share it; the server, though,
reads the special ids from the model manifest rather than from here.
"""
from __future__ import annotations

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 259


def encode(text: str, bos: bool = True) -> list[int]:
    """BOS followed by the UTF-8 bytes of `text`."""
    ids = list(text.encode("utf-8"))
    return [BOS_ID, *ids] if bos else ids


def decode(ids: list[int]) -> str:
    """Text of the byte ids in `ids`; special ids are dropped, invalid UTF-8 is replaced."""
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
