"""The engine the arena replaced, kept as the KV benchmark's baseline: the same keys-in,
logits-out interface as ArenaRunner over a concat directory (`attnserve export --kv-cache concat`)
and the left-padded KVCache.

Each decode step feeds the whole cache as past and takes present back; a membership change
rebuilds it through the host (concat_cache.py). attnserve serve does not run it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from attnserve.engine.seam import Bans, Draws, Enough, Logits, PassRow, Verified, stepwise
from attnserve.runtime.model_sessions import ModelSessions
from attnserve.runtime.ort_session import left_pad
from benchmarks.concat_cache import KVCache


class ConcatRunner:
    """Requests (by key) in the rows of the concat KV cache."""

    nbytes = 0  # the concat cache grows and shrinks with the batch; nothing is preallocated

    def __init__(self, model: ModelSessions, capacity: int, pad_id: int):
        self.model, self.capacity, self.pad_id = model, capacity, pad_id
        self.spec = model.spec
        self.cache = KVCache(model.n_past, model.to_host, model.to_device)
        self.waiting: list[tuple[int, list[int]]] = []
        self.slot_of: dict[int, int] = {}  # key -> KVCache slot
        self.key_of: dict[int, int] = {}  # KVCache slot -> key

    @property
    def pending(self) -> bool:
        return bool(self.waiting)

    def free_slots(self) -> int:
        return self.capacity - len(self.slot_of) - len(self.waiting)

    def start(
        self, key: int, prompt: tuple[int, ...], prompt_logits: bool = False, forks: tuple[int, ...] = ()
    ) -> None:
        if prompt_logits or forks:
            raise ValueError("the concat runner (a benchmark's baseline) keeps no prompt logits and no forks")
        self.waiting.append((key, list(prompt)))

    def prefill(self) -> Logits:
        """Every waiting prompt at once (an encoder-decoder's prompt is its source)."""
        self.cache.compact()
        keys, prompts = zip(*self.waiting)
        self.waiting = []
        logits, rows = self.model.prefill(*left_pad(list(prompts), self.pad_id))  # (b, V)
        for key, slot in zip(keys, self.cache.admit(rows.present, rows.mask, rows.cross, rows.cross_mask)):
            self.slot_of[key], self.key_of[slot] = slot, key
        return Logits(list(keys), np.asarray(logits, np.float32))

    def decode(
        self,
        next_ids: dict[int, int],
        sampled: frozenset[int] | None = None,  # noqa: ARG002 (every row comes back)
        passes: Mapping[int, PassRow] | None = None,  # noqa: ARG002 (the engine picks them)
        bans: Bans | None = None,  # noqa: ARG002 (every row comes back: the engine applies them)
    ) -> Logits:
        self.cache.compact()
        keys = [self.key_of[slot] for slot in self.cache.slots]
        ids = np.array([[next_ids[key]] for key in keys], dtype=np.int64)  # (B, 1)
        mask, positions, past = self.cache.step_inputs()
        logits, present = self.model.run(ids, mask, positions, past, self.cache.cross_mask, self.cache.cross)
        self.cache.append(present, mask)
        return Logits(keys, np.asarray(logits[:, -1], np.float32))

    def decode_steps(
        self,
        next_ids: dict[int, int],
        steps: int,
        enough: Enough,
        bans: Bans | None = None,
        ahead: bool = False,
        draws: Draws | None = None,
    ) -> int:
        return stepwise(self, next_ids, steps, enough, bans, ahead, draws)

    def verify(
        self,
        next_ids: dict[int, int],  # noqa: ARG002 (the seam's signature)
        proposals: Mapping[int, tuple[int, ...]],  # noqa: ARG002
        sampled: frozenset[int] = frozenset(),  # noqa: ARG002
    ) -> Verified:
        raise ValueError("the concat runner (a benchmark's baseline) does not speculate")

    def rewind(self, key: int, count: int) -> None:  # noqa: ARG002 (the seam's signature)
        raise ValueError("the concat runner (a benchmark's baseline) does not speculate")

    def copy_cache(self, src: int, dst: int) -> None:  # noqa: ARG002 (the seam's signature)
        raise ValueError("the concat runner (a benchmark's baseline) keeps no forks, so no beams")

    def release(self, key: int) -> None:
        if key in self.slot_of:
            slot = self.slot_of.pop(key)
            del self.key_of[slot]
            self.cache.free(slot)
        else:
            self.waiting = [item for item in self.waiting if item[0] != key]

    def reset(self) -> None:
        self.cache = KVCache(self.model.n_past, self.model.to_host, self.model.to_device)
        self.waiting, self.slot_of, self.key_of = [], {}, {}
