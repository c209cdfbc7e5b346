"""The engine core's model, loaded: the ONNX Runtime session, the tokenizer and the KV arena.

`load_model` builds what an engine runs on from a CoreConfig, in whichever process the core runs
(the server's own with --engine-core thread, core/process.py's otherwise). No gRPC here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..runtime.arena_runner import ArenaRunner
from ..runtime.contract import Manifest
from ..runtime.model_sessions import ModelSessions
from ..runtime.opening import arena_capacity, open_slot_runner
from ..tokenizer import Tokenizer, TokenizerError, from_model_dir
from .config import CoreConfig


class StartupError(Exception):
    """The server cannot start; the message is the one-line reason."""


@dataclass
class LoadedModel:
    runner: ModelSessions
    tokenizer: Tokenizer
    capacity: int  # KV arena slots
    slots: ArenaRunner


def load_tokenizer(model_dir: Path, manifest: Manifest) -> Tokenizer:
    """The model directory's tokenizer; raises StartupError naming the directory."""
    try:
        tokenizer = from_model_dir(model_dir, manifest.tokenizer)
    except TokenizerError as e:
        raise StartupError(f"{model_dir}: {e}") from None
    tokenizer.decode_stream()  # a BPE's byte table (byte_stream.py) is made now, not at the first request
    return tokenizer


def load_model(config: CoreConfig) -> LoadedModel:
    """The session, tokenizer and arena of config.model; raises ModelDirError, ProviderError or StartupError."""
    runner = ModelSessions(config.model, config.provider, config.threads, config.cuda_graphs, config.spinning)
    tokenizer = load_tokenizer(runner.model_dir, runner.manifest)
    try:
        capacity = arena_capacity(runner, config.max_batch, config.kv_cache_memory)
        slots = open_slot_runner(
            runner, capacity, config.prefill_chunk, config.prefix_cache, config.prefix_cache_memory
        )
    except ValueError as e:
        raise StartupError(str(e)) from None
    return LoadedModel(runner, tokenizer, capacity, slots)
