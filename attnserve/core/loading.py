"""The engine core's model, loaded: the ONNX Runtime session, the tokenizer and the KV arena.

`load_model` builds what an engine runs on from a CoreConfig, in whichever process the core runs
(the server's own with --engine-core thread, core/process.py's otherwise). No gRPC here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..runtime.arena_runner import ArenaRunner
from ..runtime.contract import MANIFEST_FILE, Manifest
from ..runtime.model_sessions import ORT_ERRORS, ModelSessions, one_line
from ..runtime.opening import arena_capacity, open_slot_runner
from ..tokenizer import Tokenizer, TokenizerError, from_model_dir
from ..tokenizer.sentencepiece import FILES as SENTENCEPIECE_FILES
from .config import CoreConfig

# The largest tokenizer file read (whole, before anything could refuse it); common ones are tens of MB at most.
TOKENIZER_MAX_BYTES = 64 << 20


class StartupError(Exception):
    """The server cannot start; the message is the one-line reason."""


@dataclass
class LoadedModel:
    runner: ModelSessions
    tokenizer: Tokenizer
    capacity: int  # KV arena slots
    slots: ArenaRunner


def tokenizer_files(manifest: Manifest) -> list[str]:
    """The files the manifest's tokenizer reads: a BPE's tokenizer.json, a translation model's SentencePiece files."""
    kind = manifest.tokenizer.get("kind")
    if kind == "sentencepiece":
        return list(SENTENCEPIECE_FILES.values())
    return [str(manifest.tokenizer.get("file", ""))] if kind == "bpe" else []


def check_tokenizer_files(model_dir: Path, manifest: Manifest) -> None:
    """StartupError (one line) unless each file the tokenizer reads has its sha256 in the manifest and
    at most TOKENIZER_MAX_BYTES."""
    for name in tokenizer_files(manifest):
        path = model_dir / name
        if not name:
            raise StartupError(f"{model_dir / MANIFEST_FILE}: tokenizer.file is missing (a BPE's tokenizer.json)")
        if name not in manifest.files:
            raise StartupError(f"{path}: the tokenizer reads it, and the manifest's files has no sha256 for it")
        size = path.stat().st_size if path.is_file() else 0
        if size > TOKENIZER_MAX_BYTES:
            raise StartupError(
                f"{path}: {size:,} bytes, more than the {TOKENIZER_MAX_BYTES:,} a tokenizer file may have"
            )


def load_tokenizer(model_dir: Path, manifest: Manifest) -> Tokenizer:
    """The model directory's tokenizer; raises StartupError naming the directory."""
    check_tokenizer_files(model_dir, manifest)
    try:
        tokenizer = from_model_dir(model_dir, manifest.tokenizer)
    except TokenizerError as e:
        raise StartupError(f"{model_dir}: {e}") from None
    if tokenizer.vocab_size > manifest.vocab_size:  # an id past the embedding would fail every request of its step
        raise StartupError(
            f"{model_dir}: the tokenizer has {tokenizer.vocab_size} ids, more than the model's "
            f"{manifest.vocab_size} (config.vocab_size)"
        )
    tokenizer.decode_stream()  # a BPE's byte table (byte_stream.py) is made now, not at the first request
    return tokenizer


def load_model(config: CoreConfig) -> LoadedModel:
    """The session, tokenizer and arena of config.model; raises ModelDirError, ProviderError or StartupError."""
    runner = ModelSessions(config.model, config.provider, config.threads, config.cuda_graphs, config.spinning)
    tokenizer = load_tokenizer(runner.model_dir, runner.manifest)
    if config.speculation is not None and runner.manifest.seq2seq:
        raise StartupError(
            f"{runner.model_dir}: --speculative-config needs a decoder-only model, not an encoder-decoder"
        )
    try:
        capacity = arena_capacity(runner, config.max_batch, config.kv_cache_memory)
        slots = open_slot_runner(
            runner, capacity, config.prefill_chunk, config.prefix_cache, config.prefix_cache_memory, config.logits_pass
        )
    except ValueError as e:
        raise StartupError(str(e)) from None
    except ORT_ERRORS as e:  # the arena's allocation, a first run: said, not a traceback
        raise StartupError(f"{runner.model_dir}: ONNX Runtime failed opening the KV arena: {one_line(e)}") from None
    return LoadedModel(runner, tokenizer, capacity, slots)
