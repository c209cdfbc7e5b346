"""What the engine core reads of the server's configuration, and nothing else.

The server builds a CoreConfig from its ServerConfig (ServerConfig.core(); the defaults and the
flags' help live there, once) and hands it to the core, in a thread of its process or across the
process boundary to core/process.py. No flags here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.speculation import Speculation
from ..tracing.settings import TraceSettings

MAX_NICE = 19  # the least CPU priority Unix has, nice's highest value: --core-nice's limit


@dataclass(frozen=True)
class CoreConfig:
    model: str  # the model directory
    provider: str  # auto, cuda or cpu
    threads: int  # intra-op threads; 0: ONNX Runtime's choice by the model's size (model_sessions.py)
    intra_op_spinning: str  # auto, off or on
    cuda_graphs: bool  # capture decode steps on CUDA
    max_batch: int  # KV arena slots; 0: as many as kv_cache_memory holds
    kv_cache_memory: int | None  # bytes for the arena; None: max_batch decides
    prefill_chunk: int  # prompt tokens prefilled per round
    prefix_cache: bool
    prefix_cache_memory: int | None  # bytes for the prefix cache's pool; None: its default
    max_queue: int  # requests the front end lets wait for a slot
    engine_core: str = "process"  # where the engine runs: a process of its own, or a thread of the server's
    traces: TraceSettings | None = None  # where the core's spans go (None: tracing off)
    log_format: str = "text"  # the core's log lines: text, or JSON lines (core/log_lines.py)
    nice: int = 0  # how much lower the core process's CPU priority is than the front end's (process.py)
    logits_pass: str = "auto"  # which rows the batched logits pass picks: auto, on or off (runtime/logits_pass.py)
    run_ahead: str = "auto"  # whether a burst's next step runs while the engine takes the last's: auto, on, off
    max_waiting_steps: int = 0  # decode steps a request may wait to start beside other arrivals (0: none)
    speculation: Speculation | None = None  # --speculative-config (engine/speculation.py); None: off
    front_ends: int = 1  # front-end processes over this core (--api-server-count): the first starts it

    @property
    def spinning(self) -> bool | None:
        """The intra-op threads spin (True), sleep (False), or as the model's size says (None)."""
        return {"on": True, "off": False}.get(self.intra_op_spinning)
