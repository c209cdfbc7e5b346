"""Speculative decoding's proposals by a draft model (`--speculative-config '{"model": DIR}'`): a second,
smaller model with the target's tokenizer, in a SlotRunner of its own, proposes each request's next ids
by as many greedy steps of its own; the target checks them in one run (engine._decode_speculated).

The draft's slot of a request holds a prefix of the request's history (decoder prompt and output).
A request's first proposal prefills its whole history there; later ones feed what the history gained
since (its last token; two where the target kept every proposal, the draft never having run its last
one; more after a pause, CATCH_UP ids a run), then run the rest as steps of one id each. After a
verification the slot forgets the ids the target did not keep (SlotRunner.rewind). A request keeps its
draft slot until it ends. Every run is SlotRunner.verify's, a slot alone: a request that does not
propose now (paused) is not run with the others. Knows nothing of runners' insides: keys and token ids.
"""

from __future__ import annotations

from collections.abc import Mapping

from .seam import SlotRunner

CATCH_UP = 64  # ids fed to a draft slot in one run, at most, as it catches up with its request's history


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
        draft's greedy ids after its history."""
        if not rooms:
            return {}
        drafted = self._prefilled({key: history for key, (history, _) in rooms.items() if key not in self.held})
        behind = {key: history[self.held[key] :] for key, (history, _) in rooms.items() if key not in drafted}
        while behind:
            fed = {key: ids[:CATCH_UP] for key, ids in behind.items()}
            verified = self.runner.verify(
                {k: ids[0] for k, ids in fed.items()}, {k: tuple(i[1:]) for k, i in fed.items()}
            )
            for key, ids in fed.items():
                drafted[key] = [verified.tokens[key][-1]]
                self.held[key] += len(ids)
            behind = {key: ids[CATCH_UP:] for key, ids in behind.items() if len(ids) > CATCH_UP}
        for step in range(1, max(most for _, most in rooms.values())):
            going = {key: ids[-1] for key, ids in drafted.items() if rooms[key][1] > step}
            verified = self.runner.verify(going, {})
            for key in going:
                drafted[key].append(verified.tokens[key][0])
                self.held[key] += 1
        return {key: tuple(ids) for key, ids in drafted.items()}

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
        """The key's slot given back: its request ended."""
        if self.held.pop(key, None) is not None:
            self.runner.release(key)

    def reset(self) -> None:
        """After a failed run: every slot given back."""
        self.held.clear()
        self.runner.reset()
