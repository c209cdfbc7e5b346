"""The engine core's model, loaded: the ONNX Runtime session, the tokenizer and the KV arena.

`load_model` builds what an engine runs on from a CoreConfig, in whichever process the core runs
(the server's own with --engine-core thread, core/process.py's otherwise). No gRPC here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..runtime.arena_runner import ArenaRunner
from ..runtime.contract import MANIFEST_FILE, Manifest, ModelDirError
from ..runtime.model_sessions import ORT_ERRORS, ModelSessions, ProviderError, one_line
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
    draft: ArenaRunner | None = None  # --speculative-config's draft model (engine/drafting.py), its own arena


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
            runner,
            capacity,
            config.prefill_chunk,
            config.prefix_cache,
            config.prefix_cache_memory,
            config.logits_pass,
            config.run_ahead,
        )
    except ValueError as e:
        raise StartupError(str(e)) from None
    except ORT_ERRORS as e:  # the arena's allocation, a first run: said, not a traceback
        raise StartupError(f"{runner.model_dir}: ONNX Runtime failed opening the KV arena: {one_line(e)}") from None
    draft = config.speculation.model if config.speculation is not None else None
    return LoadedModel(
        runner, tokenizer, capacity, slots, load_draft(config, draft, runner, capacity) if draft else None
    )


def load_draft(config: CoreConfig, model_dir: str, target: ModelSessions, capacity: int) -> ArenaRunner:
    """The draft model's runner (`capacity` slots: the target's; no prefix cache; picked by argmax on the
    target's provider); StartupError in one line where it is not a decoder-only model directory with the
    target's tokenizer and vocabulary."""
    where = f"--speculative-config's draft model {model_dir}"
    try:
        draft = ModelSessions(model_dir, config.provider, config.threads, False, config.spinning)
    except (ModelDirError, ProviderError) as e:
        raise StartupError(f"{where}: {e}") from None
    mine, theirs = draft.manifest, target.manifest
    if mine.seq2seq:
        raise StartupError(f"{where}: a draft model must be decoder-only, not an encoder-decoder")
    if mine.vocab_size != theirs.vocab_size:
        raise StartupError(f"{where}: its vocabulary has {mine.vocab_size} ids, the target's {theirs.vocab_size}")
    files = lambda manifest: {name: manifest.files.get(name) for name in tokenizer_files(manifest)}
    if mine.tokenizer != theirs.tokenizer or files(mine) != files(theirs):
        raise StartupError(f"{where}: its tokenizer is not the target's ({target.model_dir})")
    try:
        slots = arena_capacity(draft, capacity, None)
        return open_slot_runner(draft, slots, config.prefill_chunk, logits_pass="off")
    except ValueError as e:
        raise StartupError(f"{where}: {e}") from None
    except ORT_ERRORS as e:
        raise StartupError(f"{where}: ONNX Runtime failed opening its KV arena: {one_line(e)}") from None
