"""Token ids -> text, incrementally: UTF-8-safe deltas that never rewrite sent text, and stop strings.

Knows nothing of the engine or gRPC, and nothing of how a tokenizer maps ids to text: it calls
`decode`, or the tokenizer's own incremental decoder where it has one (`decode_stream`: a stream
over each id's bytes, tokenizer/byte_stream.py, or Hugging Face's DecodeStream; the same rule, and
the same deltas). Detokenization keeps two offsets into the generated
ids, as vLLM and TGI do:
text is decoded from `prefix` (a token already sent, so a tokenizer that decodes a token
differently after another, like SentencePiece's leading space, gets its context) and only what
lies beyond the text up to `read` is new. New text ending in U+FFFD is a character still cut
between tokens: it waits for the next token. Text that might be the start of a stop string is
held back until it is known not to be.
"""

from __future__ import annotations

from ..tokenizer import Tokenizer
from ..tokenizer.byte_stream import REPLACEMENT


class Detokenizer:
    """One request's generated ids -> text deltas; their concatenation is decode(all ids)."""

    def __init__(self, tokenizer: Tokenizer, native: bool = True) -> None:
        """`native`: use the tokenizer's decode_stream if it has one (False: always decode slices here)."""
        self.decode = tokenizer.decode
        self.step = tokenizer.decode_stream() if native else None
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] decode to text already emitted
        self.read = 0  # ids before read have all been emitted

    def _new_text(self) -> tuple[str, str]:
        before = self.decode(self.ids[self.prefix : self.read])
        return before, self.decode(self.ids[self.prefix :])

    def push(self, token_id: int) -> str:
        """The text this token completes ("" while a character is still cut)."""
        self.ids.append(token_id)
        new = self._native(token_id) if self.step is not None else self._sliced()
        if not new:
            return ""
        self.prefix, self.read = self.read, len(self.ids)  # as the native decoder's offsets move
        return new

    def _native(self, token_id: int) -> str | None:
        try:
            return self.step(token_id) if self.step is not None else None
        except Exception:  # noqa: BLE001 (its text was not prefix-stable): decode slices from here on
            self.step = None
            return self._sliced()

    def _sliced(self) -> str | None:
        before, now = self._new_text()
        return None if len(now) <= len(before) or now.endswith(REPLACEMENT) else now[len(before) :]

    def flush(self) -> str:
        """Whatever is left at the end, a cut character as U+FFFD."""
        before, now = self._new_text()
        self.prefix = self.read = len(self.ids)
        return now[len(before) :]


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

    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...] = ()) -> None:
        self.stops = tuple(s for s in stops if s)
        self._decoder = Detokenizer(tokenizer)
        self._pending = ""  # decoded text not emitted yet (a possible stop-string start)
        self.text = ""  # everything emitted so far
        self.stopped = False

    def push(self, token_id: int, look: bool = True) -> str:
        """The delta this token makes safe to emit; sets `stopped` when a stop string appears. Without
        `look` (before a request's min_new_tokens) the text goes out as it comes, unsearched."""
        if self.stopped:
            return ""
        if not self.stops:  # nothing is ever held back: the text goes out as it comes
            delta = self._decoder.push(token_id)
            self.text += delta
            return delta
        self._pending += self._decoder.push(token_id)
        return self._release(final=False) if look else self._emit(self._pending, stopped=False)

    def finish(self) -> str:
        """The rest of the text once generation ended (held-back text, a cut character)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if not self.stops:
            return self._emit(self._pending, stopped=False)
        # Emitted text never holds the start of a stop string (see held_back), so searching
        # the pending text is enough.
        cut = min((i for i in (self._pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            return self._emit(self._pending[:cut], stopped=True)
        keep = 0 if final else held_back(self._pending, self.stops)
        return self._emit(self._pending[: len(self._pending) - keep], stopped=False)

    def _emit(self, delta: str, stopped: bool) -> str:
        self.text += delta
        self._pending = "" if stopped else self._pending[len(delta) :]
        self.stopped = stopped
        return delta
