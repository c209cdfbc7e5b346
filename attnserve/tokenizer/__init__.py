"""The tokenizers of attnserve models: byte-level UTF-8, a byte-level BPE kept as a Hugging Face
tokenizer.json (the format onnxruntime-genai and most inference stacks read), or a translation model's
two SentencePiece models and shared vocabulary (Marian's).

Torch-free and gRPC-free, below everything else: training (model/) trains and stores one in the
checkpoint, export writes it into the model directory, the server loads it from there. Every
tokenizer answers the same few questions (see `Tokenizer`).

utf8.py (the byte tokenizer), bpe.py (the byte-level BPE) and sentencepiece.py (Marian's); byte_stream.py
and fallback_stream.py (incremental decoding, for ids that stand for bytes and for byte fallback's byte
tokens); chat_template.py (a chat's messages rendered into one prompt); padding.py (a batch of sequences
left-padded, for model/ and runtime/ alike); errors.py (the package's one error).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from .errors import TokenizerError
from .utf8 import ByteTokenizer

KINDS = ("bytes", "bpe", "sentencepiece")


class Tokenizer(Protocol):
    kind: str  # "bytes", "bpe" or "sentencepiece"
    vocab_size: int  # ids are 0 .. vocab_size - 1, special ids included
    bos_id: int
    eos_id: int
    eos_ids: frozenset[int]  # every id that ends a completion, eos_id among them (an imported model may have several)
    suppressed_ids: frozenset[int]  # ids the model never generates (a translation model's pad: bad_words_ids)
    pad_id: int
    add_bos: bool  # a text prompt starts with BOS (bytes) or not (BPE, GPT-2's way)

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, nothing added (a corpus, a continuation)."""

    def encode_prompt(self, text: str) -> list[int]:
        """The ids a text prompt is given to the model as: BOS first where add_bos says so."""

    def encode_chat(self, text: str) -> list[int]:
        """The ids of a prompt a chat template rendered: the special tokens it wrote are their ids and
        nothing is added (how transformers' apply_chat_template tokenizes)."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`: special ids dropped, invalid UTF-8 replaced by U+FFFD."""

    def decode_stream(self) -> Callable[[int], str | None] | None:
        """A fresh incremental decoder, if the tokenizer has a native one: fed one id at a time, it
        returns the new text, or None while a character is still cut (engine/detokenizer.py's rule).
        None: the caller decodes slices of the ids itself."""

    def byte_lengths(self) -> list[int]:
        """UTF-8 bytes each id stands for (0 for special ids): bits per byte from bits per token."""

    def state(self) -> dict:
        """What a checkpoint stores to rebuild this tokenizer exactly (plain str/int values)."""


def from_state(state: dict | None) -> Tokenizer:
    """The tokenizer a checkpoint stored (checkpoints older than the BPE tokenizer hold none: bytes)."""
    state = state or {}
    kind = state.get("kind", "bytes")
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "bpe":
        from .bpe import BpeTokenizer

        return BpeTokenizer(state["json"], state.get("special"), state.get("tokenizer_config"))
    if kind == "sentencepiece":
        from .sentencepiece import SentencePieceTokenizer

        return SentencePieceTokenizer.from_state(state)
    raise TokenizerError(f"tokenizer kind {kind!r} is not one of {KINDS}")


def from_model_dir(model_dir: str | Path, entry: dict) -> Tokenizer:
    """The tokenizer of an exported model directory, from its manifest entry (files already verified)."""
    state = {"kind": entry.get("kind"), "special": entry.get("special")}
    if state["kind"] == "sentencepiece":
        from .sentencepiece import SentencePieceTokenizer

        suppressed = tuple(int(i) for i in entry.get("suppressed_ids", ()))
        return SentencePieceTokenizer.from_files(Path(model_dir), int(entry["bos_id"]), suppressed)
    if state["kind"] == "bpe":
        path = Path(model_dir) / entry["file"]
        try:
            state["json"] = path.read_text(encoding="utf-8")
        except OSError as e:
            raise TokenizerError(f"cannot read {path}: {e.strerror or e}") from None
    tokenizer = from_state(state)
    for field in ("vocab_size", "bos_id", "eos_id", "pad_id"):
        if field in entry and int(entry[field]) != getattr(tokenizer, field):
            raise TokenizerError(
                f"the manifest's tokenizer {field} is {entry[field]}, the tokenizer's is {getattr(tokenizer, field)}"
            )
    return tokenizer


def manifest_entry(tokenizer: Tokenizer) -> dict:
    """The manifest's "tokenizer" object (export adds the file and its sha256 for BPE); an imported
    model's special ids come back from its "special" entry, the rest from the tokenizer itself."""
    special = getattr(tokenizer, "special", None)
    return {
        "kind": tokenizer.kind,
        "vocab_size": tokenizer.vocab_size,
        "bos_id": tokenizer.bos_id,
        "eos_id": tokenizer.eos_id,
        "pad_id": tokenizer.pad_id,
        "add_bos": tokenizer.add_bos,
        **({"special": special} if special else {}),
        **({"suppressed_ids": sorted(tokenizer.suppressed_ids)} if tokenizer.suppressed_ids else {}),
    }


__all__ = ["KINDS", "ByteTokenizer", "Tokenizer", "TokenizerError", "from_model_dir", "from_state", "manifest_entry"]
