"""Continuous-batching decode loop over an ONNX Runtime session. Knows nothing about gRPC.

Decoder-only and encoder-decoder models run the same loop: the runner's prefill hides the
difference (an encoder-decoder's prompt is its source; its decoder starts from BOS).

One engine thread owns the session and the KV cache. At every step boundary it drops
cancelled and expired requests, admits queued ones up to max_batch (prefilled together with
left padding, then merged into the running batch), runs one decode step for the whole batch,
samples each request's token with its own parameters, and hands the events to each caller's
event loop with one call_soon_threadsafe per step. ONNX Runtime releases the GIL while it runs.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from .domain import Draining, FinishReason, GenerationRequest, QueueFull
from .kv_cache import KVCache
from .model_runner import ModelRunner
from .sequence import Event, Handle, Sequence, deliver
from .streaming import ByteTokenizer

log = logging.getLogger("attnserve.server")


@dataclass(frozen=True)
class EngineLimits:
    max_batch: int = 16     # requests decoded together in one step
    max_queue: int = 64     # requests waiting for a batch slot before submit raises QueueFull


class EngineObserver:
    """What the engine reports as it runs (metrics subclass it); every hook is a no-op here."""

    def on_step(self, batch_size: int, queue_depth: int) -> None: ...
    def on_first_token(self, seconds: float) -> None: ...
    def on_inter_token(self, seconds: float) -> None: ...
    def on_finish(self, reason: FinishReason, seconds: float, completion_tokens: int) -> None: ...


def left_pad(prompts: list[tuple[int, ...]], pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """input_ids, attention_mask and position_ids (B, T) of left-padded prompts."""
    t = max(len(p) for p in prompts)
    ids = np.array([[pad_id] * (t - len(p)) + list(p) for p in prompts], dtype=np.int64)
    mask = np.array([[0] * (t - len(p)) + [1] * len(p) for p in prompts], dtype=np.int64)
    return ids, mask, np.maximum(mask.cumsum(-1) - 1, 0)


class Engine:
    """Owns the model session, the KV cache and the queue; callers submit and await events."""

    def __init__(self, runner: ModelRunner, tokenizer: ByteTokenizer, limits: EngineLimits = EngineLimits(),
                 observer: EngineObserver | None = None):
        self.runner, self.tokenizer, self.limits = runner, tokenizer, limits
        self.observer = observer or EngineObserver()
        self.cache = KVCache(runner.n_past, runner.to_host, runner.to_device)
        self._queue: collections.deque[Sequence] = collections.deque()
        self._active: dict[int, Sequence] = {}           # KV cache slot -> sequence
        self._cond = threading.Condition()
        self._outbox: list[tuple[Handle, Event]] = []
        self._admitting: list[Sequence] = []              # taken from the queue, being prefilled
        self._accepting, self._running, self._abort = True, False, False
        self._thread = threading.Thread(target=self._run, name="attnserve-engine", daemon=True)

    # ---- caller side (any thread, usually the event loop) -------------------------------
    def start(self) -> None:
        self._running = True
        self._thread.start()

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> Handle:
        """Queue a validated request; raises QueueFull or Draining."""
        handle = Handle(request, loop or asyncio.get_running_loop())
        decoder_prompt = (self.runner.bos_id,) if self.runner.seq2seq else request.prompt_ids
        sequence = Sequence(request, handle, self.tokenizer, self.runner.vocab_size, self.runner.context_length,
                            decoder_prompt)
        if sequence.budget < 1:
            raise ValueError(f"prompt of {len(request.prompt_ids)} tokens leaves no room in the context")
        with self._cond:
            if not self._accepting:
                raise Draining("the server is shutting down and takes no new requests")
            if len(self._queue) >= self.limits.max_queue:
                raise QueueFull(f"the queue is full ({self.limits.max_queue} requests waiting, --max-queue); "
                                "retry later")
            self._queue.append(sequence)
            self._cond.notify()
        return handle

    def release(self, handle: Handle) -> None:
        """The caller is gone: drop its request now if queued, else at the next step."""
        if handle.finished:
            return
        handle.cancel()
        with self._cond:
            for sequence in self._queue:
                if sequence.handle is handle:
                    self._queue.remove(sequence)
                    break

    def stats(self) -> dict[str, int]:
        """Active (in the batch or its prefill) and queued request counts."""
        with self._cond:   # a request being admitted may already sit in _active too: count it once
            active = {id(s) for s in [*self._active.values(), *self._admitting]}
            return {"active": len(active), "queued": len(self._queue)}

    def close(self) -> None:
        """Refuse new requests (Draining); queued and active ones go on."""
        with self._cond:
            self._accepting = False

    def abort(self) -> None:
        """End every queued and active request at the next step with FinishReason.CANCELLED."""
        with self._cond:
            self._abort = True
            self._cond.notify()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort everything and join the engine thread."""
        self.close()
        self.abort()
        with self._cond:
            self._running = False
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---- engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while self._running and not self._queue and not self._active and not self._abort:
                    self._cond.wait()
                if not self._running and not self._active and not self._queue:
                    break
            try:
                self._step()
            except Exception as e:  # noqa: BLE001 - a failed run must not kill the engine
                log.exception("engine step failed; failing %d active requests", len(self._active))
                self._fail_active(e)
            self._flush()

    def _step(self) -> None:
        """One step boundary: drop finished callers, admit, then decode the batch once."""
        self._drop_gone()
        admitted = self._take_queued()
        if admitted:
            self._prefill(admitted)
            self._flush()                  # first tokens go out now, not after the next decode step
        with self._cond:
            self._admitting = []
        self.observer.on_step(len(self._active), len(self._queue))
        if self._active:
            self._decode()
            if not self._active:           # the batch emptied: the gauges must not keep its last size
                self.observer.on_step(0, len(self._queue))

    def _drop_gone(self) -> None:
        """Finish aborted, cancelled and expired requests and free their slots."""
        now = time.monotonic()
        with self._cond:
            abort, self._abort = self._abort, False
            dropped = list(self._queue) if abort else [s for s in self._queue if s.expired(now)]
            for sequence in dropped:
                self._queue.remove(sequence)
        for sequence in dropped:
            reason = FinishReason.CANCELLED if abort else FinishReason.DEADLINE
            self._emit(sequence, [sequence.finish(reason)])
        for sequence in list(self._active.values()):
            if abort or sequence.handle.cancelled:
                self._retire(sequence, FinishReason.CANCELLED)
            elif sequence.expired(now):
                self._retire(sequence, FinishReason.DEADLINE)
        self.cache.compact()

    def _take_queued(self) -> list[Sequence]:
        """Up to the free batch room of queued requests whose callers are still waiting."""
        taken = []
        with self._cond:
            while self._queue and len(taken) < self.limits.max_batch - len(self._active):
                sequence = self._queue.popleft()
                if not sequence.handle.cancelled:
                    taken.append(sequence)
            self._admitting = taken
        return taken

    def _prefill(self, sequences: list[Sequence]) -> None:
        """Run the prompts together (left-padded), sample each first token, merge the rest in."""
        start = time.perf_counter()
        for sequence in sequences:
            sequence.admitted = start
        ids, mask, positions = left_pad([s.request.prompt_ids for s in sequences], self.tokenizer.pad_id)
        logits, rows = self.runner.prefill(ids, mask, positions)                     # (b, V)
        survivors = []
        for row, sequence in enumerate(sequences):
            self._emit(sequence, sequence.step(logits[row]))
            self.observer.on_first_token(sequence.first_token - sequence.arrival)
            if not sequence.done:
                survivors.append(row)
        if not survivors:
            return
        if len(survivors) < len(sequences):
            rows = rows.select(survivors, self.runner.to_host)
        for row, slot in zip(survivors, self.cache.admit(rows.present, rows.mask, rows.cross, rows.cross_mask)):
            sequences[row].slot = slot
            self._active[slot] = sequences[row]

    def _decode(self) -> None:
        """One token for every active request."""
        rows = [self._active[slot] for slot in self.cache.slots]
        ids = np.array([[s.next_token] for s in rows], dtype=np.int64)                # (B, 1)
        mask, positions, past = self.cache.step_inputs()
        logits, present = self.runner.run(ids, mask, positions, past, self.cache.cross_mask, self.cache.cross)
        self.cache.append(present, mask)
        for row, sequence in enumerate(rows):
            previous = sequence.last_token
            self._emit(sequence, sequence.step(logits[row, -1]))
            self.observer.on_inter_token(sequence.last_token - previous)
            if sequence.done:
                self._free(sequence)
        self.cache.compact()

    def _retire(self, sequence: Sequence, reason: FinishReason) -> None:
        self._emit(sequence, [sequence.finish(reason)])
        self._free(sequence)

    def _free(self, sequence: Sequence) -> None:
        self.cache.free(sequence.slot)
        with self._cond:
            del self._active[sequence.slot]

    def _fail_active(self, error: Exception) -> None:
        """After a failed run: every active request gets the error, and the cache starts over."""
        failed = {id(s): s for s in [*self._admitting, *self._active.values()] if not s.done}
        self._outbox.extend((sequence.handle, error) for sequence in failed.values())
        with self._cond:
            self._active.clear()
        self._admitting = []
        self.cache = KVCache(self.runner.n_past, self.runner.to_host, self.runner.to_device)

    def _emit(self, sequence: Sequence, events: list[Event]) -> None:
        self._outbox.extend((sequence.handle, event) for event in events)
        final = sequence.final
        if final is not None and events and events[-1] is final:
            self.observer.on_finish(final.reason, final.timings.total_ms / 1000.0, final.usage.completion_tokens)

    def _flush(self) -> None:
        """Hand this step's events to the callers' event loops, one call per loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Handle, Event]]] = {}
        for handle, event in self._outbox:
            by_loop.setdefault(handle.loop, []).append((handle, event))
        self._outbox = []
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(deliver, batch)
            except RuntimeError:  # the caller's loop has closed: nobody is listening
                pass
