"""The engine core started, whatever the mode: one value the server composes its doors over.

--engine-core thread loads the model here and runs the Engine in a thread of this process;
--engine-core process starts core/process.py's process and answers the engine's calls through
client.py's EngineClient, reading here only the manifest and the tokenizer. Either way the caller
gets a StartedCore: the engine's calls, the tokenizer, and the facts of the model and its arena.
No gRPC here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine.engine import Engine, EngineCalls, EngineLimits, EngineObserver
from ..engine.outbox import LoopOutbox
from ..runtime import contract
from ..runtime.contract import Manifest
from ..tokenizer import Tokenizer
from .channel import fronts_path
from .client import EngineClient
from .config import CoreConfig
from .loading import load_model, load_tokenizer
from .slow_steps import slowed, step_delay_ms
from .traced_outbox import TracedOutbox

if TYPE_CHECKING:
    from ..tracing.exporting import Tracing


@dataclass(frozen=True)
class StartedCore:
    engine: EngineCalls  # not started: the server starts it once its doors are bound
    tokenizer: Tokenizer
    model_dir: Path
    manifest: Manifest
    provider: str  # the execution provider the session really got
    provider_note: str  # why it is not the one asked for ("": it is)
    capacity: int  # KV arena slots
    kv_cache_bytes: int
    prefix_cache_bytes: int
    pid: int  # the process that runs the engine (this one with a thread)
    fronts: str = ""  # the core's socket for front ends more (--api-server-count; "": none listens)


def start_core(
    config: CoreConfig,
    observer: EngineObserver,
    max_buffered: int,
    on_death: Callable[[str], None] | None = None,
    tracing: Tracing | None = None,
    attach: str | None = None,
) -> StartedCore:
    """The engine core of `config.engine_core`, reporting to `observer`; raises ModelDirError,
    ProviderError or StartupError. `on_death`: called when a core process dies (never with a thread);
    `tracing`: the front end's, which a core in a thread writes its spans with (a core process starts
    its own from config.traces). Either core reads a test's brake from its environment (slow_steps.py).
    `attach`: a running core's socket for front ends more, which this one joins (--api-server-count)."""
    if config.engine_core == "process" or attach is not None:
        model_dir = Path(config.model)
        manifest = contract.read_manifest(model_dir, verify=False)  # the core verifies every file
        tokenizer = load_tokenizer(model_dir, manifest)
        client = EngineClient(config, observer, max_buffered, on_death, attach)
        ready = client.ready
        fronts = fronts_path(client.path) if attach is None and config.front_ends > 1 else ""
        return StartedCore(
            client,
            tokenizer,
            model_dir,
            manifest,
            ready.provider,
            ready.provider_note,
            client.capacity,
            ready.kv_cache_bytes,
            ready.prefix_cache_bytes,
            client.pid,
            fronts,
        )
    delay = step_delay_ms()
    loaded = load_model(config)
    limits = EngineLimits(
        loaded.capacity, config.max_queue, max_buffered, config.speculation, config.run_ahead, config.max_waiting_steps
    )
    outbox = None
    if tracing is not None:  # the front end's: this process's spans go through one exporter
        from ..tracing.core_spans import CoreSpans

        outbox = TracedOutbox(LoopOutbox(), CoreSpans(tracing, config.prefill_chunk, loaded.runner.manifest.seq2seq))
    engine = Engine(loaded.slots, loaded.tokenizer, limits, slowed(observer, delay), outbox, loaded.draft)
    runner = loaded.runner
    return StartedCore(
        engine,
        loaded.tokenizer,
        runner.model_dir,
        runner.manifest,
        runner.provider,
        runner.provider_note,
        loaded.capacity,
        loaded.slots.nbytes,
        loaded.slots.prefix_bytes,
        os.getpid(),
    )
