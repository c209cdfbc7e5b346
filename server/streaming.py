"""Token ids -> text, incrementally: the byte-level tokenizer, UTF-8-safe deltas, stop strings.

Knows nothing of the engine or gRPC. The special ids come from the model's manifest; ids
0-255 are bytes. A character split across tokens is emitted whole once its last byte arrives;
text that might be the start of a stop string is held back until it is known not to be.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True)
class ByteTokenizer:
    """Byte-level tokenizer of the model directory: BOS + UTF-8 bytes; specials decode to nothing."""

    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int

    @classmethod
    def from_manifest(cls, manifest: dict) -> "ByteTokenizer":
        tok = manifest["tokenizer"]
        if tok.get("kind") != "bytes":
            raise ValueError(f"tokenizer kind {tok.get('kind')!r} is not supported (only 'bytes')")
        return cls(int(tok["vocab_size"]), int(tok["bos_id"]), int(tok["eos_id"]), int(tok["pad_id"]))

    def encode(self, text: str) -> list[int]:
        """BOS followed by the UTF-8 bytes of `text`."""
        return [self.bos_id, *text.encode("utf-8")]

    @staticmethod
    def token_bytes(token_id: int) -> bytes:
        """The bytes one token stands for: one byte, or nothing for a special id."""
        return bytes((token_id,)) if 0 <= token_id < 256 else b""


class Utf8Decoder:
    """Bytes -> str in pieces; an incomplete character waits for its remaining bytes."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        """Text of the complete characters `data` finished (invalid bytes become U+FFFD)."""
        return self._decoder.decode(data, final=False)

    def flush(self) -> str:
        """Whatever an unfinished character left behind, as U+FFFD."""
        return self._decoder.decode(b"", final=True)


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of some stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class TextStream:
    """One request's generated text: push token ids, get safe deltas; detects stop strings."""

    def __init__(self, tokenizer: ByteTokenizer, stops: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self._decoder = Utf8Decoder()
        self._pending = ""      # decoded text not emitted yet (a possible stop-string start)
        self.text = ""          # everything emitted so far
        self.stopped = False

    def push(self, token_id: int) -> str:
        """The delta this token makes safe to emit; sets `stopped` when a stop string appears."""
        if self.stopped:
            return ""
        self._pending += self._decoder.push(self.tokenizer.token_bytes(token_id))
        return self._release(final=False)

    def finish(self) -> str:
        """The rest of the text once generation ended (held-back text, a cut character)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        # Emitted text never holds the start of a stop string (see held_back), so searching
        # the pending text is enough.
        cut = min((i for i in (self._pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            return self._emit(self._pending[:cut], stopped=True)
        keep = 0 if final else held_back(self._pending, self.stops)
        return self._emit(self._pending[:len(self._pending) - keep], stopped=False)

    def _emit(self, delta: str, stopped: bool) -> str:
        self.text += delta
        self._pending = "" if stopped else self._pending[len(delta):]
        self.stopped = stopped
        return delta
