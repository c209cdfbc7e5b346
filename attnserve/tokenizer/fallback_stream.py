"""Incremental decoding for tokenizers with byte fallback (Llama 2's and Mistral's, converted from
SentencePiece): characters the merges lack are spelled by byte tokens <0x00>..<0xFF>.

Their decoder turns each run of consecutive byte tokens into its text when the run is valid UTF-8,
else into one U+FFFD per byte. So a run's text is known only once the run is over. For example,
<0xC3><0xA9> is "é", but <0xC3><0xA9><0xFF> is three U+FFFD. Hugging Face's DecodeStream sends
"é" early and can then differ from decode() of the same ids, as a random model's invalid bytes
show. This stream holds a run until a token that is not a byte ends it, then returns what the
library's own decode adds. Special ids are held as well: decode() skips them, so they do not end a
run. It keeps two offsets, as engine/detokenizer.py does, so that a decoder
that strips the first token's leading space strips the same one from both slices. The flush at
the end of a completion (engine/detokenizer.py) decodes a run still open as decode() would.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def byte_token_ids(tokens: dict[str, int]) -> frozenset[int]:
    """The ids of a vocabulary's byte tokens, <0x00> to <0xFF>."""
    return frozenset(i for token, i in tokens.items() if BYTE_TOKEN.fullmatch(token))


class FallbackStream:
    """One sequence of ids -> its text, a piece at a time (a tokenizer's decode_stream())."""

    __slots__ = ("decode", "held", "ids", "prefix", "read")

    def __init__(self, decode: Callable[[Sequence[int]], str], held: frozenset[int]):
        """`held`: the byte tokens' ids and the special ids (which decode() skips)."""
        self.decode, self.held = decode, held
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] decode to the text returned last
        self.read = 0  # ids before read have all been returned

    def __call__(self, token_id: int) -> str | None:
        """The text `token_id` completes, or None while a run of byte tokens may go on (or nothing is new)."""
        self.ids.append(token_id)
        if token_id in self.held:
            return None
        before = self.decode(self.ids[self.prefix : self.read])
        now = self.decode(self.ids[self.prefix :])
        if len(now) <= len(before):
            return None
        self.prefix, self.read = self.read, len(self.ids)
        return now[len(before) :]
