"""Speculative decoding's proposals by a draft model (`--speculative-config '{"model": DIR}'`): a second,
smaller model with the target's tokenizer, in a SlotRunner of its own, proposes each request's next ids
by as many greedy steps of its own; the target checks them in one run (engine._decode_speculated).

The draft's slot of a request holds a prefix of the request's history (decoder prompt and output).
A request's first proposal prefills its whole history there; later ones feed what the history gained
since (its last token, or two where the target kept every proposal: the draft never ran its last
one), then run the rest as decode steps of every proposing request together. After a verification
the slot forgets the ids the target did not keep (SlotRunner.rewind). Only the requests proposing now
hold a slot: one that stops proposing (paused, or a batch above disable_by_batch_size) gives its slot
back, and prefills again when it next proposes. Knows nothing of runners' insides: keys and token ids.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .seam import SlotRunner

MAX_CATCH_UP = 32  # ids a held slot is fed at once before its proposal; more: it prefills again


class Drafts:
    """The draft model's runner and, by request key, how many ids of its history its slot holds."""

    def __init__(self, runner: SlotRunner, steps: int):
        """`steps`: num_speculative_tokens, the most ids a proposal holds."""
        self.runner, self.steps = runner, steps
        self.held: dict[int, int] = {}

    def room(self, history: list[int], most: int) -> int:
        """The ids a request with `history` may have proposed, at most `most`: as many as leave the
        draft's context room for the positions its steps feed."""
        return min(most, self.steps, self.runner.spec.context_length - len(history))

    def propose(self, rooms: Mapping[int, tuple[list[int], int]]) -> dict[int, tuple[int, ...]]:
        """Each key's proposal (key -> its history and the most ids it may propose, at least 1): the
        draft's greedy ids after its history. Every other key's slot is given back first."""
        for key in [key for key in self.held if key not in rooms]:
            self.release(key)
        if not rooms:
            return {}
        for key, (history, _) in rooms.items():
            if key in self.held and len(history) - self.held[key] > MAX_CATCH_UP:
                self.release(key)
        drafted = self._prefilled({key: history for key, (history, _) in rooms.items() if key not in self.held})
        behind = {key: history[self.held[key] :] for key, (history, _) in rooms.items() if key not in drafted}
        if behind:
            fed = self.runner.verify(
                {key: ids[0] for key, ids in behind.items()}, {k: tuple(i[1:]) for k, i in behind.items()}
            )
            for key, ids in behind.items():
                drafted[key] = [fed.tokens[key][-1]]
                self.held[key] += len(ids)
        steps = max(most for _, most in rooms.values()) - 1
        if steps:

            def take(keys: list[int], tokens: np.ndarray) -> bool:
                for key, token in zip(keys, tokens.tolist()):
                    drafted[key].append(token)
                return False

            ran = self.runner.decode_steps({key: ids[0] for key, ids in drafted.items()}, steps, take)
            for key in drafted:
                self.held[key] += ran
        return {key: tuple(drafted[key][:most]) for key, (_, most) in rooms.items()}

    def _prefilled(self, histories: dict[int, list[int]]) -> dict[int, list[int]]:
        """Each key's history prefilled into a fresh slot of the draft; by key, the draft's next id."""
        for key, history in histories.items():
            self.runner.start(key, tuple(history))
        drafted: dict[int, list[int]] = {}
        while len(drafted) < len(histories):
            logits = self.runner.prefill()
            for key, row in zip(logits.keys, logits.rows):
                drafted[key] = [int(row.argmax())]
                self.held[key] = len(histories[key])
        return drafted

    def keep(self, key: int, valid: int) -> None:
        """After a verification: the first `valid` ids of the key's history are right (its history less
        its next token); its slot forgets what it holds past them."""
        held = self.held.get(key)
        if held is not None and held > valid:
            self.runner.rewind(key, held - valid)
            self.held[key] = valid

    def release(self, key: int) -> None:
        """The key's slot given back (its request ended, or proposes no more for now)."""
        if self.held.pop(key, None) is not None:
            self.runner.release(key)

    def reset(self) -> None:
        """After a failed run: every slot given back."""
        self.held.clear()
        self.runner.reset()
