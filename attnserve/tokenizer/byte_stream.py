"""Incremental decoding for tokenizers whose every id stands for bytes: the byte tokenizer, and a
byte-level BPE whose decoder only maps its characters back to bytes (GPT-2's scheme, what
`attnserve train` makes).

The text of such ids is their bytes joined, decoded as UTF-8 with invalid bytes replaced by
U+FFFD, special ids standing for no bytes. A stream fed one id at a time keeps the bytes since the
text it last returned; it returns the new text, or None while that text ends in U+FFFD (a character
still cut between tokens: it waits for the next id) or is empty. That is the rule of Hugging Face's
DecodeStream and of engine/detokenizer.py's slices, with the same deltas (tests/test_server_streaming.py
compares them over ids that cut characters, hold special ids and invalid bytes), in a list lookup
per id where the id's bytes are whole characters on their own, and one decode of the bytes since the
last text otherwise: several times cheaper than DecodeStream, a cost the engine core pays for every
token it takes (docs/design/decisions/byte-table-text.md).
"""

from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT = "\ufffd"  # what an invalid or cut UTF-8 sequence decodes to (engine/detokenizer.py waits on it too)


def whole_text(piece: bytes) -> str | None:
    """The text of `piece` if it is whole UTF-8 characters, else None."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return None


class ByteTable:
    """Each id's bytes, and its text where those bytes are whole characters on their own."""

    def __init__(self, pieces: Sequence[bytes]):
        self.pieces = list(pieces)
        self.texts = [whole_text(piece) for piece in self.pieces]

    def stream(self) -> ByteStream:
        return ByteStream(self)


class ByteStream:
    """One sequence of ids -> its text, a piece at a time (a tokenizer's decode_stream())."""

    __slots__ = ("cut", "pieces", "texts")

    def __init__(self, table: ByteTable):
        self.pieces, self.texts = table.pieces, table.texts
        self.cut = b""  # the bytes since the last text returned (a character still cut, or none)

    def __call__(self, token_id: int) -> str | None:
        """The text `token_id` completes, or None while there is none yet."""
        if self.cut:
            data = self.cut + self.pieces[token_id]
        else:
            text = self.texts[token_id]
            if text is not None:
                return text or None  # whole characters, or a special id's nothing
            data = self.pieces[token_id]
        text = data.decode("utf-8", "replace")
        if not text or text.endswith(REPLACEMENT):
            self.cut = data
            return None
        self.cut = b""
        return text
