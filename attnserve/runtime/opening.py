"""The slot runner that serves a model directory: its in-place KV arena, sized at start-up.

attnserve serve runs arena directories only; a directory exported with the concat cache is
refused with the command that re-exports it (benchmarks/concat_runner.py keeps that engine as the KV
benchmark's baseline).
"""

from __future__ import annotations

from . import contract
from .arena import KVArena, device_of
from .arena_decoder import ArenaDecoder, ArenaSeq2SeqDecoder
from .arena_runner import ArenaRunner
from .model_sessions import ModelSessions
from .prefix_cache import PrefixCache
from .run_ahead import may_run_ahead

AUTO = 0  # --max-batch auto: as many slots as --kv-cache-memory holds
MAX_AUTO_BATCH = 1024  # the most slots `auto` picks


def arena_bytes(model: ModelSessions, capacity: int) -> int:
    """Bytes of an arena of `capacity` slots for this model (an encoder-decoder's slots also hold
    their source's cross-attention keys and values: twice the size)."""
    size = KVArena.bytes_needed(
        model.n_layers, model.n_kv_heads, model.head_dim, model.context_length, capacity, model.manifest.dtype
    )
    return 2 * size if model.seq2seq else size


def arena_capacity(model: ModelSessions, max_batch: int, kv_cache_memory: int | None) -> int:
    """The number of slots to allocate; raises ValueError (one line naming the numbers) when the
    requested batch does not fit the memory cap or the memory free on the model's device."""
    capacity = requested_capacity(model, max_batch, kv_cache_memory)
    needed, device = arena_bytes(model, capacity), device_of(model.session)
    free = device.free_bytes()
    if needed > free:
        auto = max_batch == AUTO
        raise ValueError(
            f"--max-batch {f'auto ({capacity} slots)' if auto else max_batch} with a {model.context_length}-position "
            f"context needs a {needed:,}-byte KV arena, more than the {free:,} bytes available on {device.kind}: "
            f"lower {'--kv-cache-memory' if auto else '--max-batch'}"
        )
    return capacity


def requested_capacity(model: ModelSessions, max_batch: int, kv_cache_memory: int | None) -> int:
    """The slots --max-batch and --kv-cache-memory ask for (ValueError where they disagree)."""
    if model.manifest.kv_cache != contract.KV_ARENA:
        raise ValueError(
            f"{model.model_dir} was exported with the concat KV cache, which attnserve serve no longer "
            "runs; export its checkpoint again: attnserve export CHECKPOINT --out DIR"
        )
    per_slot = arena_bytes(model, 1)
    if max_batch == AUTO:
        if kv_cache_memory is None:
            raise ValueError("--max-batch auto needs --kv-cache-memory BYTES (the arena's budget)")
        if kv_cache_memory < per_slot:
            raise ValueError(
                f"--kv-cache-memory {kv_cache_memory:,} bytes holds no slot: one slot of "
                f"{model.context_length} positions needs {per_slot:,} bytes"
            )
        return min(kv_cache_memory // per_slot, MAX_AUTO_BATCH)
    if kv_cache_memory is not None and per_slot * max_batch > kv_cache_memory:
        raise ValueError(
            f"--max-batch {max_batch} needs a {per_slot * max_batch:,}-byte KV arena ({per_slot:,} "
            f"per slot), more than --kv-cache-memory {kv_cache_memory:,}"
        )
    return max_batch


def open_prefix_cache(arena: KVArena, memory: int | None) -> PrefixCache:
    """The prefix cache beside `arena`: `memory` bytes, or (None) as large as the arena but at most
    half the device's free memory; raises ValueError (one line, both numbers) when it does not fit."""
    free = arena.device.free_bytes()
    if memory is None:
        memory = min(arena.nbytes, free // 2)
    elif memory > free:
        raise ValueError(
            f"--prefix-cache-memory {memory:,} bytes does not fit: {free:,} bytes are free on {arena.device.kind}"
        )
    return PrefixCache(arena, memory)


def open_slot_runner(
    model: ModelSessions,
    capacity: int,
    prefill_chunk: int,
    prefix_cache: bool = False,
    prefix_memory: int | None = None,
    logits_pass: str = "auto",
    run_ahead: str = "off",
) -> ArenaRunner:
    """The arena runner of an arena directory (checked by arena_capacity), on the model's device, with
    a prefix cache of `prefix_memory` bytes (open_prefix_cache) if `prefix_cache` (never for an
    encoder-decoder, whose prompt is a source: its decoder starts from BOS), its rows picked by the
    batched logits pass as `logits_pass` says (auto, on, off: logits_pass.worth_passing), a burst's next
    step run while the engine takes the last one's tokens where `run_ahead` lets it (auto, on, off:
    run_ahead.may_run_ahead)."""
    device = device_of(model.session)
    ahead = may_run_ahead(run_ahead, model.session, device)
    if model.seq2seq:  # a source is encoded whole: never in chunks
        decoder: ArenaDecoder = ArenaSeq2SeqDecoder(
            model.encoder, model.session, model.manifest, capacity, device, logits_pass
        )
        return ArenaRunner(model, decoder, model.context_length, run_ahead=ahead)
    chunk = max(prefill_chunk, capacity)
    decoder = ArenaDecoder(model.session, model.manifest, capacity, chunk, device, model.graph_session, logits_pass)
    prefix = open_prefix_cache(decoder.arena, prefix_memory) if prefix_cache else None
    return ArenaRunner(model, decoder, prefill_chunk, prefix, ahead)
