"""Which slot runner serves a model directory: the arena, or the concat cache it predates.

Both take request keys and prompts and give logits; the engine cannot tell them apart.
"""
from __future__ import annotations

from ..export import contract
from ..export.arena import KVArena
from .arena_runner import ArenaRunner
from .concat_runner import ConcatRunner
from .model_runner import ModelRunner

DEFAULT_PREFILL_CHUNK = 256   # tokens per prefill run: a long prompt delays the batch by at most this
AUTO = 0                      # --max-batch auto: as many slots as --kv-cache-memory holds
MAX_AUTO_BATCH = 1024         # the most slots `auto` picks


def arena_bytes(model: ModelRunner, capacity: int) -> int:
    """Bytes of an arena of `capacity` slots for this model."""
    return KVArena.bytes_needed(model.n_layers, model.n_heads, model.head_dim, model.context_length, capacity,
                                model.manifest["dtype"])


def arena_capacity(model: ModelRunner, max_batch: int, kv_cache_memory: int | None) -> int:
    """The number of slots to allocate; raises ValueError (one line naming both numbers) when the
    requested batch does not fit the memory cap."""
    if contract.kv_layout(model.manifest) != contract.KV_ARENA:
        if max_batch == AUTO or kv_cache_memory is not None:
            raise ValueError(f"--max-batch auto and --kv-cache-memory size the KV arena, and {model.model_dir} "
                             "uses the concat cache (encoder-decoder or exported before the arena)")
        return max_batch
    per_slot = arena_bytes(model, 1)
    if max_batch == AUTO:
        if kv_cache_memory is None:
            raise ValueError("--max-batch auto needs --kv-cache-memory BYTES (the arena's budget)")
        if kv_cache_memory < per_slot:
            raise ValueError(f"--kv-cache-memory {kv_cache_memory:,} bytes holds no slot: one slot of "
                             f"{model.context_length} positions needs {per_slot:,} bytes")
        return min(kv_cache_memory // per_slot, MAX_AUTO_BATCH)
    if kv_cache_memory is not None and per_slot * max_batch > kv_cache_memory:
        raise ValueError(f"--max-batch {max_batch} needs a {per_slot * max_batch:,}-byte KV arena ({per_slot:,} "
                         f"per slot), more than --kv-cache-memory {kv_cache_memory:,}")
    return max_batch


def open_slot_runner(model: ModelRunner, capacity: int, prefill_chunk: int = DEFAULT_PREFILL_CHUNK):
    """An ArenaRunner for arena directories, a ConcatRunner for the rest."""
    if contract.kv_layout(model.manifest) == contract.KV_ARENA:
        return ArenaRunner(model, capacity, prefill_chunk)
    return ConcatRunner(model, capacity, int(model.manifest["tokenizer"]["pad_id"]))
