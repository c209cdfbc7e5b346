"""The slot runner of an arena model directory: request keys in, logits out, the arena behind it.

The decoding requests hold slots [0, n) of runtime/arena.py's in-place arena, in admission
order; a finished request's slot is refilled by moving the last one into it, so every decode
step runs over one contiguous block. Fresh prompts are prefilled together, right-padded, into
the slots after the block (up to `chunk` tokens per run) and join it at once. A prompt longer
than a chunk is prefilled one chunk per call in the top slot (never leaving one token for a run of
its own: arena_decoder.next_run), then moved down to the block's end: a long prompt delays the
running batch by at most one chunk per step. With a prefix cache
(prefix_cache.py), a prompt whose first blocks are cached gets them copied into its slot when its
prefill begins and only the rest is prefilled (one extend run each, up to a chunk of such rests
per round); every prompt's whole blocks are cached once it is prefilled. A request that wants its
prompt's logits is prefilled whole. A burst of decode steps (decode_steps) feeds each step the tokens
the step before picked: the graph's own greedy tokens, and a drawn row's pick by the batched pass.
Knows nothing of sampling, queues or gRPC; the engine sees keys, token ids and logits.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from collections.abc import Collection, Iterator, Mapping

import numpy as np

from ..engine.seam import Bans, Draws, Enough, Logits, PassRow, Pick, PrefixReport, Verified, chain_steps, drawn
from .arena_decoder import ArenaDecoder, next_run
from .model_sessions import ModelSessions
from .prefix_cache import PrefixCache
from .run_ahead import RunAhead

log = logging.getLogger(__name__)
# steps a row the batched pass could not pick skips it (picked on the host) before the pass tries it again,
# on the CPU under --logits-pass auto (_passing)
HOLD_BACK = 16


class ArenaRunner:
    """Requests (by key) in the slots of one arena driver (ArenaDecoder or ArenaSeq2SeqDecoder)."""

    def __init__(
        self,
        model: ModelSessions,
        decoder: ArenaDecoder,
        chunk: int,
        prefix: PrefixCache | None = None,
        run_ahead: bool = False,
    ):
        """`chunk`: prompt tokens per prefill run (--prefill-chunk); `prefix`: the prefix cache, if on;
        `run_ahead`: a burst's next step runs while the engine takes the last one's tokens (run_ahead.py)."""
        self.model, self.decoder, self.chunk, self.prefix = model, decoder, chunk, prefix
        self.run_ahead = run_ahead
        self.ahead: RunAhead | None = None  # its worker thread, made at the first burst that runs ahead
        self.spec = model.spec
        self.capacity = decoder.arena.capacity
        self.decoding: list[int] = []  # key in each of slots [0, n)
        self.waiting: list[tuple[int, list[int]]] = []  # started, not yet prefilled
        self.chunking: tuple[int, list[int], int] | None = None  # key, prompt, tokens done (top slot)
        self.prompt_rows: dict[int, list[np.ndarray]] = {}  # key started with prompt_logits -> its chunks' rows
        self.forks: dict[int, list[int]] = {}  # key -> the keys its prefilled slot is copied to (n completions)
        self.cached: dict[int, int] = {}  # key -> its prompt's tokens copied from the prefix cache, once looked up
        self.lookups: list[int] = []  # this round's lookups: tokens copied, 0 for a miss
        self.held_back: dict[int, int] = {}  # key -> steps its row skips the pass, picked on the host (_passing)

    @property
    def nbytes(self) -> int:
        """The arena's size in bytes, fixed at start-up."""
        return self.decoder.nbytes

    @property
    def prefix_bytes(self) -> int:
        """The prefix cache's size in bytes, fixed at start-up (0: no prefix cache)."""
        return self.prefix.nbytes if self.prefix is not None else 0

    @property
    def pending(self) -> bool:
        """Prefill work is waiting for the next prefill() call."""
        return bool(self.waiting) or self.chunking is not None

    def free_slots(self) -> int:
        reserved = sum(map(len, self.forks.values()))  # slots held for forks whose prompt is not prefilled yet
        return self.capacity - len(self.decoding) - len(self.waiting) - (self.chunking is not None) - reserved

    def start(
        self, key: int, prompt: tuple[int, ...], prompt_logits: bool = False, forks: tuple[int, ...] = ()
    ) -> None:
        """Reserve a slot for a request (and one per fork); its prompt is prefilled by the next prefill()
        calls (with `prompt_logits` every position's logits are kept for it), then its slot is copied
        into each fork's, which starts decoding from the same last-token logits."""
        if self.free_slots() < 1 + len(forks):
            raise RuntimeError("no free slot")  # the engine admits only up to free_slots()
        self.waiting.append((key, list(prompt)))
        if prompt_logits:
            self.prompt_rows[key] = []
        if forks:
            self.forks[key] = list(forks)

    def prefill(self) -> Logits:
        """One round of prefill: prompts with a cached prefix (their rest), the fresh short prompts
        together, then one chunk of a long one. Returns the last-token logits of every request whose
        prompt is now complete."""
        done = self._prefill_cached()
        done.update(self._prefill_short())
        if self.chunking is None:
            long = next((item for item in self.waiting if len(item[1]) > self.chunk), None)
            if long is not None:
                self.waiting.remove(long)
                self.chunking = (*long, self._load(long[0], self.capacity - 1, long[1]))
        if self.chunking is not None:
            done.update(self._prefill_chunk())
        logits = Logits.of(done)
        for key in done.keys() & self.prompt_rows.keys():
            logits.prompts[key] = np.concatenate(self.prompt_rows.pop(key))
        if self.prefix is None:
            return logits
        logits.cached.update((key, self.cached.pop(key)) for key in done if key in self.cached)
        lookups, self.lookups = self.lookups, []
        hits = sum(map(bool, lookups))
        report = PrefixReport(hits, len(lookups) - hits, sum(lookups), self.prefix.held_bytes)
        return dataclasses.replace(logits, prefix=report)

    def _load(self, key: int, slot: int, prompt: list[int]) -> int:
        """The cached prefix of `key`'s prompt into its empty slot as its prefill begins; tokens copied.
        A request that wants every position's logits (prompt logprobs) is prefilled whole."""
        if self.prefix is None or key in self.prompt_rows:
            return 0
        cached = self.prefix.load(slot, prompt)
        self._looked_up(key, cached)
        return cached

    def _hit(self, key: int, prompt: list[int]) -> bool:
        """`key`'s prompt would find a cached prefix now."""
        return self.prefix is not None and key not in self.prompt_rows and self.prefix.match(prompt) > 0

    def _missed(self, key: int) -> None:
        """`key`'s prefill begins from its first token: a lookup that found nothing."""
        if self.prefix is not None and key not in self.prompt_rows:
            self._looked_up(key, 0)

    def _looked_up(self, key: int, cached: int) -> None:
        """`key`'s prompt got `cached` tokens from the cache: for its usage and this round's report."""
        self.cached[key] = cached
        self.lookups.append(cached)

    def _store(self, slot: int, prompt: list[int]) -> None:
        """The prompt just prefilled in `slot`: its whole blocks into the cache."""
        if self.prefix is not None:
            self.prefix.store(slot, prompt)

    def _prefill_cached(self) -> dict[int, np.ndarray]:
        """Waiting prompts whose cached prefix leaves at most a chunk: prefix copied, rest extended,
        one run each, until their rests reach a chunk of tokens."""
        if self.prefix is None:
            return {}
        done: dict[int, np.ndarray] = {}
        spent = 0
        for item in list(self.waiting):
            key, prompt = item
            rest = len(prompt) - (0 if key in self.prompt_rows else self.prefix.match(prompt))
            if rest == len(prompt) or rest > self.chunk or (spent and spent + rest > self.chunk):
                continue
            spent += rest
            self.waiting.remove(item)
            slot = len(self.decoding)
            self._load(key, slot, prompt)
            logits = self.decoder.extend(slot, prompt[len(prompt) - rest :]).copy()  # the next run reuses the buffer
            self.decoding.append(key)
            self._store(slot, prompt)
            done[key] = logits
            done.update(self._fork(key, slot, logits))
        return done

    def _keep_rows(self, key: int, row: int, count: int) -> None:
        """The last run's logits of `key`'s prompt (its row, `count` positions), if it asked for them."""
        if key in self.prompt_rows:
            self.prompt_rows[key].append(self.decoder.positions(row, count))

    def _prefill_short(self) -> dict[int, np.ndarray]:
        """Short prompts, longest first, as many as fit `chunk` tokens padded, into the slots after the block."""
        short = sorted((item for item in self.waiting if len(item[1]) <= self.chunk), key=lambda i: -len(i[1]))
        short = [item for item in short if not self._hit(*item)]  # a hit over this round's budget waits
        batch = [item for n, item in enumerate(short, 1) if n * len(short[0][1]) <= self.chunk] if short else []
        if not batch:
            return {}
        first = len(self.decoding)
        logits = self.decoder.prefill(first, [prompt for _, prompt in batch])  # (b, V)
        for row, item in enumerate(batch):
            self._keep_rows(item[0], row, len(item[1]))
            self.waiting.remove(item)
            self._missed(item[0])
            self._store(first + row, item[1])
        self.decoding += [key for key, _ in batch]
        done = {key: row for (key, _), row in zip(batch, logits)}
        for row, (key, _) in enumerate(batch):
            done.update(self._fork(key, first + row, logits[row]))
        return done

    def _fork(self, key: int, slot: int, logits: np.ndarray) -> dict[int, np.ndarray]:
        """`key`'s prefilled slot copied into a slot of each of its forks, which join the block with the
        same last-token logits (each picks its own first token)."""
        forks = self.forks.pop(key, [])
        for fork in forks:
            self.decoder.copy(slot, len(self.decoding))
            self.decoding.append(fork)
            if key in self.cached:  # each completion's usage says what its prompt got from the cache
                self.cached[fork] = self.cached[key]
        return dict.fromkeys(forks, logits)

    def _prefill_chunk(self) -> dict[int, np.ndarray]:
        """The next chunk of the long prompt in the top slot; when it is complete, it joins the block."""
        assert self.chunking is not None, "called only while a long prompt is being prefilled"
        key, prompt, done = self.chunking
        top = self.capacity - 1
        count = next_run(len(prompt) - done, self.chunk)
        logits = self.decoder.extend(top, prompt[done : done + count])
        self._keep_rows(key, 0, count)
        done += count
        if done < len(prompt):
            self.chunking = (key, prompt, done)
            return {}
        self.chunking = None
        slot = len(self.decoding)
        if slot != top:
            self.decoder.move(top, slot)
        self.decoding.append(key)
        self._store(slot, prompt)
        return {key: logits, **self._fork(key, slot, logits)}

    def decode(
        self,
        next_ids: dict[int, int],
        sampled: frozenset[int] | None = None,
        passes: Mapping[int, PassRow] | None = None,
        bans: Bans | None = None,
    ) -> Logits:
        """One token for every decoding request; their logits (B, V), a view valid until the next run.
        Given `sampled`, every request's greedy token comes back and only the sampled ones' logits
        leave the device (the others' rows are stale); of those, the keys in `passes` are picked where
        the logits are, in one batched pass (their Picks come back, and the rows of those it could
        not hold). A key in `bans` whose greedy token is one of its bans gets its likeliest other id."""
        tokens = np.array([next_ids[key] for key in self.decoding], np.int64)
        if sampled is None:
            return Logits(list(self.decoding), self.decoder.decode(tokens))
        passed, rows = self._passing(passes or {}, sampled)
        plan = [passes[self.decoding[row]] for row in passed] if passes else []
        picked, logits, picks = self.decoder.decode_passed(tokens, rows, passed, plan)
        self._unban(picked, self._banned(bans))
        got = self._passed(passed, picks)
        return Logits(list(self.decoding), logits, picked, picks=got)

    def decode_steps(
        self,
        next_ids: dict[int, int],
        steps: int,
        enough: Enough,
        bans: Bans | None = None,
        ahead: bool = False,
        draws: Draws | None = None,
    ) -> int:
        """Up to `steps` decode steps of the whole block, each fed the tokens the last picked, until `enough`
        says so; the steps run. A greedy step takes the graph's NEXT_TOKEN (no logits leave the device); a
        key in `bans` whose argmax is one of its bans takes the best of the rest (its row read then); a key
        in `draws` takes its step's PassRow's pick (decode_passed: the batched pass where the logits are,
        or Draws.pick_on_host from its row). With `ahead`, where this runner runs ahead (`run_ahead`),
        the steps run on its worker thread (run_ahead.py), one step ahead of `enough` (seam.SlotRunner's
        one-step lag)."""
        keys, banned = list(self.decoding), self._banned(bans)
        if draws is None:
            step = functools.partial(self._greedy, banned=banned)
        else:
            step = functools.partial(self._drawn, keys=keys, banned=banned, draws=draws, ran=itertools.count())
        fed = np.array([next_ids[key] for key in keys], np.int64)
        if ahead and self.run_ahead:
            self.ahead = self.ahead or RunAhead()
            return self.ahead.decode_steps(keys, functools.partial(step, fed), step, steps, enough)
        return chain_steps(keys, step(fed), steps, enough, step)

    def _greedy(self, tokens: np.ndarray, banned: list[tuple[int, tuple[int, ...]]]) -> np.ndarray:
        """One greedy step of the block fed `tokens` (read, never written): its tokens, a new array."""
        picked = self.decoder.decode_greedy(tokens)
        self._unban(picked, banned)
        return picked

    def _drawn(
        self,
        tokens: np.ndarray,
        keys: list[int],
        banned: list[tuple[int, tuple[int, ...]]],
        draws: Draws,
        ran: Iterator[int],
    ) -> np.ndarray:
        """One step of a burst with drawn keys, fed `tokens`: the greedy rows' argmax (with their bans),
        each drawn key's pick by its PassRow at this step (the `ran`-th: the pass, else on the host)."""
        index = next(ran)
        plans = draws.rows(index)
        passed, host = self._passing(plans, plans.keys())
        picked, logits, picks = self.decoder.decode_passed(tokens, host, passed, [plans[keys[row]] for row in passed])
        self._unban(picked, banned)
        return drawn(Logits(keys, logits, picks=self._passed(passed, picks)), plans, draws, index, picked)

    def _passing(self, plans: Mapping[int, PassRow], sampled: Collection[int]) -> tuple[list[int], list[int]]:
        """The rows (slots) of `plans`' keys this step's pass is asked to pick, and those of the other
        `sampled` keys, whose logits come to the host. The pass is asked every one, but on the CPU
        under --logits-pass auto not a key's whose row came back unpicked in the last HOLD_BACK steps (the
        pass could not pick it, a flat row under top-p: tried, it costs the pass's share and then the
        host's pick; or it was not worth passing, which it would not be now either). A row's own history
        picks its side, never its batch, and either side picks the same token."""
        passed = [row for row, key in enumerate(self.decoding) if key in plans and key not in self.held_back]
        host = [
            row
            for row, key in enumerate(self.decoding)
            if key in sampled and (key not in plans or key in self.held_back)
        ]
        for key in list(self.held_back):
            self.held_back[key] -= 1
            if not self.held_back[key]:
                del self.held_back[key]
        return passed, host

    def _passed(self, passed: list[int], picks: list[Pick | None]) -> dict[int, Pick]:
        """The picks the pass made, by key; a key it could not pick is held back (_passing), under auto on
        the CPU."""
        got = {self.decoding[row]: pick for row, pick in zip(passed, picks) if pick is not None}
        if self.decoder.logits_pass is not None and self.decoder.logits_pass.holds_back:
            self.held_back.update((self.decoding[row], HOLD_BACK) for row, pick in zip(passed, picks) if pick is None)
        return got

    def verify(
        self, next_ids: dict[int, int], proposals: Mapping[int, tuple[int, ...]], sampled: frozenset[int] = frozenset()
    ) -> Verified:
        """Each key's next token and its proposals fed in one run of its slot alone (ArenaDecoder.verify);
        the argmax after each id by key, or a key in `sampled` its rows. Its slot holds them all until
        rewind. Decoding keys not in `next_ids` are not run."""
        verified = Verified()
        for key, token in next_ids.items():
            slot, fed = self.decoding.index(key), [token, *proposals.get(key, ())]
            if key in sampled:
                verified.rows[key] = self.decoder.verify_rows(slot, fed)
            else:
                verified.tokens[key] = self.decoder.verify(slot, fed)
        return verified

    def rewind(self, key: int, count: int) -> None:
        """Key's slot forgets its last `count` positions (the proposals the engine did not keep)."""
        self.decoder.rewind(self.decoding.index(key), count)

    def _banned(self, bans: Bans | None) -> list[tuple[int, tuple[int, ...]]]:
        """(row, its bans) of each decoding key in `bans`."""
        return [(row, bans[key]) for row, key in enumerate(self.decoding) if key in bans] if bans else []

    def _unban(self, tokens: np.ndarray, banned: list[tuple[int, tuple[int, ...]]]) -> None:
        """Each row of `banned` whose greedy token in `tokens` (the last step's) is one of its bans takes
        its row's likeliest other id (the row read from where that step left its logits)."""
        for row, ids in banned:
            if tokens[row] in ids:
                tokens[row] = self.decoder.greedy_without(len(tokens), row, ids)

    def copy_cache(self, src: int, dst: int) -> None:
        """Key dst's slot takes a copy of key src's cache (a beam that continues another: one strided
        device copy per buffer of the used rows)."""
        self.decoder.copy_cache(self.decoding.index(src), self.decoding.index(dst))

    def release(self, key: int) -> None:
        """The request leaves: its slot is refilled by the last decoding one (its used rows only)."""
        self.prompt_rows.pop(key, None)
        self.cached.pop(key, None)
        self.held_back.pop(key, None)
        self.forks.pop(key, None)  # a request that leaves before its prompt is prefilled
        if key in self.decoding:
            slot, last = self.decoding.index(key), len(self.decoding) - 1
            if slot != last:
                self.decoder.move(last, slot)
            else:
                self.decoder.clear(slot)
            self.decoding[slot] = self.decoding[last]
            self.decoding.pop()
        elif self.chunking is not None and self.chunking[0] == key:
            self.decoder.clear(self.capacity - 1)
            self.chunking = None
        else:
            self.waiting = [item for item in self.waiting if item[0] != key]

    def reset(self) -> None:
        """Forget every request (after a failed run); the arena's memory stays allocated."""
        self.decoding, self.waiting, self.chunking = [], [], None
        self.prompt_rows.clear()
        self.forks.clear()
        self.cached.clear()
        self.held_back.clear()
        self.lookups.clear()
        for slot in range(self.capacity):
            self.decoder.clear(slot)
