"""A byte-level BPE (GPT-2's scheme), trained and run by the Hugging Face `tokenizers` library.

Byte-level: text is split by GPT-2's pattern, each byte becomes one of 256 printable characters,
and merges join them, so every UTF-8 string round-trips and no text is unknown. The special
tokens come first: ids 0, 1, 2 are BOS, EOS and PAD. Prompts start with no BOS (GPT-2's way),
so text encoded here and by onnxruntime-genai from the same tokenizer.json gives the same ids
(genai does not apply a file's post-processor). Text that spells a special token ("<|eos|>") is
encoded as text, so any string round-trips and no prompt can smuggle in a control token (genai
maps it to the special id; send ids with prompt_token_ids). The tokenizer.json string is the state.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cached_property

from .byte_stream import ByteTable
from .errors import TokenizerError
from .fallback_stream import FallbackStream, byte_token_ids

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>")  # ids 0, 1, 2
MIN_VOCAB = len(SPECIAL_TOKENS) + 256  # the specials and the 256 bytes, no merges
MAX_VOCAB = 1 << 20


def train_bpe(text: str, vocab_size: int) -> BpeTokenizer:
    """Learn merges on `text` until `vocab_size` ids (fewer if the text runs out of pairs); deterministic."""
    if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise TokenizerError(
            f"--vocab-size {vocab_size} is outside [{MIN_VOCAB}, {MAX_VOCAB}] "
            f"({len(SPECIAL_TOKENS)} special tokens and 256 bytes at least)"
        )
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([text], trainer)
    return BpeTokenizer(tok.to_str())


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level characters -> the bytes they stand for: printable bytes stand for
    themselves, the other 68 for characters from U+0100 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    alphabet = {chr(b): b for b in printable}
    alphabet.update({chr(256 + n): b for n, b in enumerate(others)})
    return alphabet


def library_tokenizer(json_text: str):
    """Hugging Face's Tokenizer of a tokenizer.json; TokenizerError if it is not one."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(json_text)
    except Exception as e:  # noqa: BLE001 (the library raises a bare Exception for a malformed file)
        raise TokenizerError(f"not a valid tokenizer.json ({e})") from None


SPECIAL_FIELDS = ("bos_id", "eos_id", "pad_id", "add_bos")  # an imported model's, from its tokenizer_config.json
EXTRA_EOS = "eos_ids"  # optional beside them: every id that ends a completion (generation_config.json's list)


class BpeTokenizer:
    """A tokenizer.json behind the `Tokenizer` interface. Its special ids are the fixed tokens
    attnserve train writes (SPECIAL_TOKENS), or, for an imported model, `special`: bos_id, eos_id,
    pad_id and add_bos as the model's own tokenizer_config.json says, and `tokenizer_config` that
    file itself (written again beside tokenizer.json by the export)."""

    kind = "bpe"
    suppressed_ids: frozenset[int] = frozenset()

    def __init__(self, json_text: str, special: dict | None = None, tokenizer_config: dict | None = None):
        self._tok = library_tokenizer(json_text)
        self._tok.encode_special_tokens = True  # text that spells a special token stays text
        self.json = json_text
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.special, self.imported_config = special, tokenizer_config
        ids = self.configured_ids(special) if special is not None else self.fixed_ids()
        self.bos_id, self.eos_id, self.pad_id = ids
        self.eos_ids = frozenset([self.eos_id, *(special or {}).get(EXTRA_EOS, ())])
        self.add_bos = bool(special and special["add_bos"])
        added = self._tok.get_added_tokens_decoder()
        self.special_ids = frozenset(ids) | {i for i, token in added.items() if token.special}

    def fixed_ids(self) -> list[int]:
        found = [self._tok.token_to_id(t) for t in SPECIAL_TOKENS]
        ids = [i for i in found if i is not None]
        if len(ids) < len(SPECIAL_TOKENS):
            raise TokenizerError(f"tokenizer.json lacks the special tokens {', '.join(SPECIAL_TOKENS)}")
        return ids

    def configured_ids(self, special: dict) -> list[int]:
        if not set(SPECIAL_FIELDS) <= set(special) <= {*SPECIAL_FIELDS, EXTRA_EOS}:
            raise TokenizerError(
                f"a tokenizer's special ids need exactly {', '.join(SPECIAL_FIELDS)} (and {EXTRA_EOS}), "
                f"got {sorted(special)}"
            )
        ids = [special[field] for field in SPECIAL_FIELDS[:3]]
        named = [*zip(SPECIAL_FIELDS, ids), *((EXTRA_EOS, i) for i in special.get(EXTRA_EOS, ()))]
        for field, value in named:
            if not (isinstance(value, int) and 0 <= value < self.vocab_size):
                raise TokenizerError(f"{field} {value!r} is outside the tokenizer's [0, {self.vocab_size})")
        return ids

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        return [self.bos_id, *self.encode(text)] if self.add_bos else self.encode(text)

    def encode_chat(self, text: str) -> list[int]:
        return self.chat_library.encode(text, add_special_tokens=False).ids

    @cached_property
    def chat_library(self):
        """The library's tokenizer reading special tokens in text, for what a chat template wrote (a
        prompt never is: `_tok` keeps them text)."""
        return library_tokenizer(self.json)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def decode_stream(self) -> Callable[[int], str | None]:
        """A byte stream over each id's bytes (byte_stream.py) where the file is plain byte-level BPE;
        a stream that holds runs of byte tokens (fallback_stream.py) where its decoder has byte
        fallback; else Hugging Face's DecodeStream: the same two-offset incremental decoding as
        engine/detokenizer.py's, in Rust (one call per token instead of two decodes of Python lists)."""
        table = self.byte_table
        if table is not None:
            return table.stream()
        if self.byte_fallback_ids:
            return FallbackStream(self.decode, self.byte_fallback_ids | self.special_ids)
        return self.library_stream()

    @cached_property
    def byte_fallback_ids(self) -> frozenset[int]:
        """The byte tokens' ids where the file's model and decoder fall back to bytes; else none."""
        spec = json.loads(self.json)
        decoder = spec.get("decoder") or {}
        steps = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        if not (spec.get("model") or {}).get("byte_fallback") or all(s.get("type") != "ByteFallback" for s in steps):
            return frozenset()
        return byte_token_ids(self._tok.get_vocab(with_added_tokens=False))

    def library_stream(self) -> Callable[[int], str | None]:
        """Hugging Face's DecodeStream, whatever the file (decode_stream's fallback)."""
        from tokenizers.decoders import DecodeStream

        stream, tok = DecodeStream(skip_special_tokens=True), self._tok
        return lambda token_id: stream.step(tok, token_id)

    @cached_property
    def byte_table(self) -> ByteTable | None:
        """Each id's bytes, if this file's decoder only maps byte-level characters back to bytes and
        every other id is a special token (decoded to nothing); checked id by id against the library's
        own decode, once, at the first decode_stream(). None otherwise."""
        spec = json.loads(self.json)
        decoder = spec.get("decoder") or {}
        added = spec.get("added_tokens") or []
        if decoder.get("type") != "ByteLevel":
            return None
        to_byte = byte_level_alphabet()
        special = {token["id"] for token in added if token.get("special")}
        pieces = []
        for i in range(self.vocab_size):
            token = "" if i in special else self._tok.id_to_token(i)
            if token is None or any(c not in to_byte for c in token):
                return None
            piece = bytes(to_byte[c] for c in token)
            if piece.decode("utf-8", "replace") != self.decode([i]):
                return None
            pieces.append(piece)
        return ByteTable(pieces)

    def byte_lengths(self) -> list[int]:
        """Each byte-level token's characters are one byte each; special tokens stand for none."""
        return [0 if i in self.special_ids else len(self._tok.id_to_token(i) or "") for i in range(self.vocab_size)]

    def state(self) -> dict:
        imported = {"special": self.special, "tokenizer_config": self.imported_config} if self.special else {}
        return {"kind": self.kind, "json": self.json, **imported}

    def tokenizer_config(self, context_length: int) -> dict:
        """tokenizer_config.json beside tokenizer.json: what Hugging Face and onnxruntime-genai read (an
        imported model's own, with the context length the export serves)."""
        if self.imported_config is not None:
            return {**self.imported_config, "model_max_length": context_length}
        bos, eos, pad = SPECIAL_TOKENS
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos,
            "eos_token": eos,
            "pad_token": pad,
            "add_bos_token": False,
            "add_eos_token": False,
            "model_max_length": context_length,
            "clean_up_tokenization_spaces": False,
        }
