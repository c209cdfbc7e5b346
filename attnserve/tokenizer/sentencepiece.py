"""A translation model's tokenizer as Marian keeps it: a SentencePiece model for the source language, one
for the target, and vocab.json, the ids the model was trained with, shared by both (each piece's id
there, not its SentencePiece index).

Source text in: the source model's pieces, each looked up in vocab.json (<unk> where it lacks one), a
language code like ">>fra<<" at the start kept whole, EOS appended. Target ids out: the pieces
vocab.json names, special ids dropped, joined by the target model, "▁" read as a space, stripped:
what transformers' MarianTokenizer decodes (tests/test_marian.py compares the two). The ids the model
must never generate go with it (OPUS-MT's generation config bans the pad id, which Marian's own
vocabulary never had). Reads the files with Google's sentencepiece library; knows nothing of models
or serving.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path

from .errors import TokenizerError

SOURCE_FILE, TARGET_FILE, VOCAB_FILE = "source.spm", "target.spm", "vocab.json"  # Marian's names
FILES = {"source": SOURCE_FILE, "target": TARGET_FILE, "vocab": VOCAB_FILE}
SPECIAL_TOKENS = {"eos_id": "</s>", "unk_id": "<unk>", "pad_id": "<pad>"}
LANGUAGE_CODE = re.compile(r">>[^<>]+<<")  # a multilingual model's target language, first in a source
SPACE = "\u2581"  # "▁": SentencePiece's space
STATE_KEYS = ("source", "target", "vocab", "decoder_start_id")  # what a checkpoint stores (state()), and
SUPPRESSED = "suppressed_ids"  # the ids never generated, where there are any


def processor(model: bytes, name: str):
    import sentencepiece

    if not model:
        raise TokenizerError(f"{name}: not a SentencePiece model (empty)")
    try:
        return sentencepiece.SentencePieceProcessor(model_proto=model)
    except (RuntimeError, TypeError) as e:
        raise TokenizerError(f"{name}: not a SentencePiece model ({str(e).strip()})") from None


class SentencePieceTokenizer:
    """Marian's two SentencePiece models and vocab.json behind the `Tokenizer` interface. A target starts
    from `bos_id`, the model's decoder start id (Marian's is its pad id); a source is not given one."""

    kind = "sentencepiece"
    add_bos = False

    def __init__(
        self,
        source: bytes,
        target: bytes,
        vocab: dict[str, int],
        decoder_start_id: int,
        suppressed: tuple[int, ...] = (),
    ):
        self.source, self.target, self.vocab = source, target, vocab
        self._source, self._target = processor(source, SOURCE_FILE), processor(target, TARGET_FILE)
        missing = [token for token in SPECIAL_TOKENS.values() if token not in vocab]
        if missing:
            raise TokenizerError(f"{VOCAB_FILE} lacks {', '.join(missing)}")
        ids = sorted(vocab.values())
        if ids != list(range(len(ids))):
            raise TokenizerError(f"{VOCAB_FILE}: its ids are not 0 to {len(ids) - 1}, each once")
        self.vocab_size = len(ids)
        self.eos_id, self.unk_id, self.pad_id = (vocab[token] for token in SPECIAL_TOKENS.values())
        if not 0 <= decoder_start_id < self.vocab_size:
            raise TokenizerError(f"decoder start id {decoder_start_id} is outside [0, {self.vocab_size})")
        self.bos_id = decoder_start_id
        self.eos_ids = frozenset({self.eos_id})
        outside = [i for i in suppressed if not 0 <= i < self.vocab_size]
        if outside:
            raise TokenizerError(f"suppressed id {outside[0]} is outside [0, {self.vocab_size})")
        self.suppressed_ids = frozenset(suppressed)
        self.special_ids = frozenset({self.eos_id, self.unk_id, self.pad_id})
        self.pieces = {i: piece for piece, i in vocab.items()}

    @classmethod
    def from_files(
        cls, directory: Path, decoder_start_id: int, suppressed: tuple[int, ...] = ()
    ) -> SentencePieceTokenizer:
        """The tokenizer of a directory holding source.spm, target.spm and vocab.json."""
        try:
            source, target = ((directory / name).read_bytes() for name in (SOURCE_FILE, TARGET_FILE))
            vocab = json.loads((directory / VOCAB_FILE).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TokenizerError(f"{directory}: {e}") from None
        except RecursionError:  # JSON nested past Python's recursion limit
            raise TokenizerError(f"{directory / VOCAB_FILE}: JSON nested too deep") from None
        if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
            raise TokenizerError(f"{directory / VOCAB_FILE}: not an object of piece -> id")
        return cls(source, target, vocab, decoder_start_id, suppressed)

    def encode(self, text: str) -> list[int]:
        """The source model's pieces of `text` as vocab.json's ids; a leading language code is one id."""
        code = LANGUAGE_CODE.match(text)
        head = [self.vocab.get(code.group(), self.unk_id)] if code else []
        pieces = self._source.encode(text[code.end() :] if code else text, out_type=str)
        return head + [self.vocab.get(piece, self.unk_id) for piece in pieces]

    def encode_prompt(self, text: str) -> list[int]:
        """A source as the model reads one: its pieces, then EOS."""
        return [*self.encode(text), self.eos_id]

    def encode_chat(self, text: str) -> list[int]:
        return self.encode_prompt(text)  # no chat templates for a translation model (export refuses one)

    def decode(self, ids: Sequence[int]) -> str:
        pieces = [self.pieces.get(i, "") for i in ids if i not in self.special_ids]
        return self._target.decode_pieces(pieces).replace(SPACE, " ").strip()

    def decode_stream(self) -> Callable[[int], str | None] | None:
        return None  # the detokenizer decodes slices (a piece's leading space needs the one before)

    @cached_property
    def _byte_lengths(self) -> list[int]:
        return [
            0 if i in self.special_ids else len(self.pieces.get(i, "").replace(SPACE, " ").encode("utf-8"))
            for i in range(self.vocab_size)
        ]

    def byte_lengths(self) -> list[int]:
        return self._byte_lengths

    def state(self) -> dict:
        """The models as base64 text and the vocabulary: plain values a checkpoint stores."""
        return {
            "kind": self.kind,
            "source": base64.b64encode(self.source).decode("ascii"),
            "target": base64.b64encode(self.target).decode("ascii"),
            "vocab": self.vocab,
            "decoder_start_id": self.bos_id,
            SUPPRESSED: sorted(self.suppressed_ids),
        }

    @classmethod
    def from_state(cls, state: dict) -> SentencePieceTokenizer:
        missing = [key for key in STATE_KEYS if key not in state]
        if missing:
            raise TokenizerError(f"a SentencePiece tokenizer's state lacks {', '.join(missing)}")
        source, target = (base64.b64decode(state[side]) for side in ("source", "target"))
        suppressed = tuple(int(i) for i in state.get(SUPPRESSED, ()))
        return cls(source, target, dict(state["vocab"]), int(state["decoder_start_id"]), suppressed)

    def write(self, directory: Path) -> list[str]:
        """source.spm, target.spm and vocab.json into `directory` (an export's); their names."""
        (directory / SOURCE_FILE).write_bytes(self.source)
        (directory / TARGET_FILE).write_bytes(self.target)
        (directory / VOCAB_FILE).write_text(json.dumps(self.vocab, ensure_ascii=False, indent=1) + "\n", "utf-8")
        return list(FILES.values())
