"""Drivers of arena graphs, slot by slot: what the server runs and the parity gate checks.

ArenaDecoder drives a decoder-only graph: fresh prompts prefilled together (right-padded) into
empty slots, one slot extended by a chunk, one token decoded for slots [0, B). ArenaSeq2SeqDecoder
drives an encoder-decoder: the encoder runs once per request at admission and its cross-attention
keys/values are written into the slot's cross segment, then the decoder starts from BOS. Inputs
are written into buffers preallocated on the device (step_inputs.py) and logits land in one
preallocated host buffer: a run allocates nothing. The device is the session's (arena.device_of).
Torch-free; knows nothing of requests or scheduling.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from ..engine.seam import PassRow, Pick, argmax_without
from . import contract
from .arena import Device, KVArena, device_of
from .fixed_steps import FixedSteps
from .logits_pass import LogitsPass
from .ort_session import HOST_DTYPES, to_float32
from .step_inputs import StepInputs

# A decode step's mask is as wide as the longest slot's positions rounded up to a multiple of this:
# GroupQueryAttention reads each row's length from the mask's sum and the total from its width, so
# zeros past the longest change nothing, and a step's binding keeps its mask for up to 32 steps.
MASK_COLUMNS = 32

# An encoder-decoder's cross arena is laid out as wide as its longest source rounded up to a multiple
# of this (ArenaSeq2SeqDecoder.fit_sources): the masked positions past a row's source add exact zeros
# to its sums, and a run at 48 positions cost about what one at 64 did (OPUS-MT's shape, 64 rows).
SOURCE_COLUMNS = 32

# The fewest prompt tokens one run computes after a slot's earlier positions (a chunk, or the rest of
# a prompt after a cached prefix). ONNX Runtime's CPU GroupQueryAttention takes another path for a
# single query, whose sums differ from a longer run's in the last bits at nearly every length, and a
# prompt position computed alone changes what follows it: a request's tokens would depend on how its
# prompt was split or cached. Runs of two or more give the same bits at most lengths (not all: the
# export's batch-invariance gate checks the tokens). A one-token prompt is one query whatever shares
# its batch, and attends only to itself.
SHORTEST_PROMPT_RUN = 2


def next_run(rest: int, chunk: int) -> int:
    """How many of a prompt's `rest` remaining tokens its next run takes, at most `chunk`: all of them
    if they fit, else a chunk, or one fewer where a chunk would leave a single token (a chunk of 3 or
    more; with a chunk of 1 or 2 every run is that size)."""
    if rest <= chunk:
        return rest
    return chunk - 1 if rest - chunk < SHORTEST_PROMPT_RUN and chunk > SHORTEST_PROMPT_RUN else chunk


def right_pad(seqs: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and attention_mask (B, T) of right-padded sequences."""
    t = max(len(s) for s in seqs)
    ids = np.full((len(seqs), t), pad_id, np.int64)
    mask = np.zeros((len(seqs), t), np.int64)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1
    return ids, mask


class ArenaDecoder:
    """A decoder-only arena graph driven slot by slot: prefill fresh prompts into empty slots
    (right-padded, together), extend one slot by a chunk, or decode one token for slots [0, B).

    Logits land in one preallocated host buffer of `max_tokens` rows (B * T of any run)."""

    def __init__(
        self,
        session: ort.InferenceSession,
        manifest: contract.Manifest,
        capacity: int,
        max_tokens: int,
        device: Device | None = None,
        graph_session: ort.InferenceSession | None = None,
        logits_pass: str = "auto",
    ):
        """`graph_session`: the same graph opened with CUDA graphs on: decode steps go through it with
        fixed shapes (fixed_steps.py); prefill and chunks stay on `session`. `logits_pass`: which rows the
        batched logits pass picks (auto, on, off: logits_pass.worth_passing)."""
        self.session, self.pad_id = session, manifest.pad_id
        self.context, self.vocab_size = manifest.context_length, manifest.vocab_size
        self.n_layers, self.device, self.dtype = manifest.n_layers, device or device_of(session), manifest.dtype
        self.arena = self.make_arena(
            manifest,
            capacity,
            contract.past_names(self.n_layers, self.part),
            contract.present_names(self.n_layers, self.part),
        )
        self.max_tokens = max(max_tokens, capacity)
        self.logits = np.empty(self.max_tokens * self.vocab_size, HOST_DTYPES[self.dtype])
        self.greedy_outputs = contract.NEXT_TOKEN in [o.name for o in session.get_outputs()]
        self.next_ids = np.empty(self.max_tokens, np.int64)  # a picked step's NEXT_TOKEN output
        self.step_logits = self.device.allocate((capacity, 1, self.vocab_size), self.arena.dtype)  # ... and logits
        self.step_address = self.step_logits.data_ptr()
        # those logits read where they are, on the host (None on CUDA: read_rows copies them out)
        view = self.device.host_view(self.step_logits, HOST_DTYPES[self.dtype])
        self.step_rows = None if view is None else view.reshape(capacity, self.vocab_size)
        self._verified_logits: ort.OrtValue | None = None  # a verification's logits (verified_logits)
        # the sampling rows of a picked step as float32 (a float32 graph's host buffer is that already)
        self.picked_rows = np.empty((capacity, self.vocab_size), np.float32) if self.dtype != "float32" else None
        widest = max(self.max_tokens, capacity * self.context)  # a decode step's mask is (B, longest + 1)
        sizes = {contract.INPUT_IDS: self.max_tokens, contract.POSITION_IDS: self.max_tokens}
        self.inputs = StepInputs(self.device, {**sizes, contract.ATTENTION_MASK: widest, **self.extra_inputs(capacity)})
        self._bindings: dict[tuple[int, int, int, bool], ort.IOBinding] = {}  # (first slot, B, T, ids) -> binding
        self._mask_widths: dict[tuple[int, int, int, bool], int] = {}  # a kept binding -> its mask's width
        self.last_shape = (0, 0)  # (B, T) of the last run whose logits are in the host buffer
        self.columns = np.arange(self.context + 1)[None, :]  # a decode step's mask compares positions to these
        self.fixed = FixedSteps(graph_session, self) if graph_session is not None else None
        threads = session.get_session_options().intra_op_num_threads
        # the batched logits pass over a picked step's logits buffer (a graph with NEXT_TOKEN has one)
        passing = self.greedy_outputs and logits_pass != "off"
        self.logits_pass = LogitsPass(self.dtype, self.device, threads, logits_pass) if passing else None

    part = ""  # the segment of the self-attention names (Optimum's seq2seq names add "decoder")

    def extra_inputs(self, capacity: int) -> dict[str, int]:  # noqa: ARG002 (an encoder-decoder's use it)
        """Inputs besides ids, mask and positions, and their largest size (none for a decoder-only graph)."""
        return {}

    def make_arena(self, manifest: contract.Manifest, capacity: int, inputs: list[str], outputs: list[str]) -> KVArena:
        return KVArena(
            self.n_layers,
            manifest.n_kv_heads,
            manifest.head_dim,
            self.context,
            capacity,
            manifest.dtype,
            self.device,
            inputs,
            outputs,
        )

    def bind_fixed(self, binding: ort.IOBinding, first: int, count: int) -> None:
        """What stays bound across runs of the same slots: the cache."""
        self.arena.bind(binding, first, count)

    def bind_inputs(self, binding: ort.IOBinding, first: int, count: int) -> None:
        """Inputs that change with every run besides the tokens (none for a decoder-only graph)."""

    def run(
        self, first: int, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, picked: bool = False
    ) -> np.ndarray:
        """One run over slots [first, first + B): logits (B, T, V) in the graph's dtype (bfloat16 as
        uint16 bits), a view of the host buffer. `picked` (graphs with NEXT_TOKEN): each row's greedy
        token (B, T) comes to the host instead, and the logits stay in the device buffer `step_logits`."""
        b, t = ids.shape
        key = (first, b, t, picked)
        binding = self._bindings.get(key)
        cached = binding is not None  # ids and positions are bound with this shape already
        if binding is None:
            binding = self.binding(*key)
        self.inputs.bind(binding, contract.INPUT_IDS, ids, bound=cached)
        self.inputs.bind(binding, contract.ATTENTION_MASK, mask)
        self._mask_widths.pop(key, None)  # a decode step rebinds its own
        self.inputs.bind(binding, contract.POSITION_IDS, positions, bound=cached)
        self.bind_inputs(binding, first, b)
        self.session.run_with_iobinding(binding)
        if picked:
            return self.next_ids[: b * t].reshape(b, t)
        self.last_shape = (b, t)
        return self.logits[: b * t * self.vocab_size].reshape(b, t, self.vocab_size)

    def binding(self, first: int, b: int, t: int, picked: bool) -> ort.IOBinding:
        """A binding of slots [first, first + b) and of the outputs of a (b, t) run; kept when t is 1
        (decode steps and one-token runs repeat their shapes) or its tokens are picked (a verification's
        few shapes)."""
        if b * t > self.max_tokens:
            raise ValueError(f"a run of {b} x {t} tokens exceeds the logits buffer ({self.max_tokens} tokens)")
        binding = self.session.io_binding()
        self.bind_fixed(binding, first, b)
        shape = [b, t, self.vocab_size]
        if picked:
            binding.bind_output(contract.NEXT_TOKEN, "cpu", 0, np.int64, [b, t], self.next_ids.ctypes.data)
            kind, device = self.device.kind, self.device.id
            logits = self.step_logits if t == 1 else self.verified_logits(b * t)
            binding.bind_output(contract.LOGITS, kind, device, self.arena.dtype, shape, logits.data_ptr())
        else:
            binding.bind_output(contract.LOGITS, "cpu", 0, self.arena.dtype, shape, self.logits.ctypes.data)
        if t == 1 or picked:
            self._bindings[first, b, t, picked] = binding
        return binding

    def verified_logits(self, rows: int) -> ort.OrtValue:
        """The device buffer a verification's logits land in (they never leave it), at least `rows` rows
        of V; made at the first verification (a server that does not speculate never holds it)."""
        if self._verified_logits is None or self._verified_logits.shape()[0] < rows:
            self._verified_logits = self.device.allocate((rows, self.vocab_size), self.arena.dtype)
            self._bindings = {key: bound for key, bound in self._bindings.items() if key[2] == 1}  # none reads the old
        return self._verified_logits

    def prefill(self, first: int, prompts: list[list[int]]) -> np.ndarray:
        """Fresh prompts into the empty slots [first, first + b), right-padded; last-token logits (b, V)."""
        lengths = np.array([len(p) for p in prompts])
        assert not self.arena.lengths[first : first + len(prompts)].any(), "prefill into slots that hold state"
        ids, mask = right_pad(prompts, self.pad_id)
        positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
        logits = self.run(first, ids, mask, positions)
        self.arena.lengths[first : first + len(prompts)] = lengths
        return to_float32(logits[np.arange(len(prompts)), lengths - 1], self.dtype)

    def extend(self, slot: int, tokens: list[int]) -> np.ndarray:
        """Append a chunk of tokens to one slot that holds state (batch 1); last-token logits (V,)."""
        if not self.arena.lengths[slot]:
            return self.prefill(slot, [tokens])[0]
        return to_float32(self.append(slot, tokens, picked=False)[0, -1], self.dtype)

    def append(self, slot: int, tokens: list[int], picked: bool) -> np.ndarray:
        """One run of `tokens` after the positions one slot holds (batch 1), which then holds them too:
        its logits (1, T, V) in the graph's dtype, or (picked) each position's greedy token (1, T)."""
        held = int(self.arena.lengths[slot])
        total = held + len(tokens)
        ids, mask, positions = np.array([tokens], np.int64), np.ones((1, total), np.int64), np.arange(held, total)[None]
        out = self.run(slot, ids, mask, positions, picked)
        self.arena.lengths[slot] = total
        return out

    def verify(self, slot: int, tokens: list[int]) -> list[int]:
        """Feed `tokens` to one slot that holds state, in one run, and bring back the argmax after each
        (first index on ties; the graph's NEXT_TOKEN where it has one, and no logits leave the device).
        One slot a run: ONNX Runtime's GroupQueryAttention takes several new positions beside a past for a
        batch of one sequence only."""
        if self.greedy_outputs:
            return self.append(slot, tokens, picked=True)[0].tolist()
        return self.verify_rows(slot, tokens).argmax(axis=1).tolist()

    def verify_rows(self, slot: int, tokens: list[int]) -> np.ndarray:
        """verify(), but the logits after each id come back, (T, V) float32 (a copy): for a sampled pick."""
        return np.array(to_float32(self.append(slot, tokens, picked=False)[0], self.dtype), np.float32)

    def rewind(self, slot: int, count: int) -> None:
        """Forget the slot's last `count` positions (their keys and values are overwritten by the next)."""
        self.arena.lengths[slot] -= count

    def positions(self, row: int, count: int) -> np.ndarray:
        """The last run's logits of its row `row` at positions [0, count), float32 (a copy): a prompt's
        every position after prefill or extend, for its logprobs."""
        b, t = self.last_shape
        logits = self.logits[: b * t * self.vocab_size].reshape(b, t, self.vocab_size)
        return np.array(to_float32(logits[row, :count], self.dtype), np.float32)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """One new token for each of slots [0, B); logits (B, V) float32: for a float32 model a view of
        the output buffer, valid until the next run (a decode step's logits are read before it)."""
        if self.fixed is not None:
            return self.fixed.decode(tokens)
        return to_float32(self.step(tokens, picked=False), self.dtype)

    def decode_picked(self, tokens: np.ndarray, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """decode(), but what comes back is each slot's greedy token (B,) int64 (the graph's
        NEXT_TOKEN: argmax, first index on ties) and the logits (B, V) float32 of `rows` only (the
        slots that sample): the other rows of that array are left as they were. A graph exported
        without NEXT_TOKEN brings back every row's logits."""
        if not self.greedy_outputs:
            logits = self.decode(tokens)
            return logits.argmax(axis=1), logits
        if self.fixed is not None:
            return self.fixed.decode_picked(tokens, rows)
        picked = self.step(tokens, picked=True)
        address = self.step_address if rows else 0  # no rows: nothing is read from it
        return picked, self.read_rows(address, len(tokens), rows)

    def decode_passed(
        self, tokens: np.ndarray, rows: list[int], passed: list[int], plan: list[PassRow]
    ) -> tuple[np.ndarray, np.ndarray, list[Pick | None]]:
        """decode_picked, and the slots `passed` picked where the logits are by the batched pass
        (logits_pass.py), each by its PassRow in `plan`: a Pick each, or None for a row the pass could
        not hold or was not worth it for (LogitsPass.worth), whose logits come back with those
        of `rows`. A graph without NEXT_TOKEN picks nothing."""
        if self.logits_pass is None or not any(worth := self.logits_pass.worth(plan, self.vocab_size)):
            picked, logits = self.decode_picked(tokens, rows + passed)
            return picked, logits, [None] * len(passed)
        picked = self.fixed.step_ids(tokens) if self.fixed is not None else self.step(tokens, picked=True)
        chosen = [i for i, passing in enumerate(worth) if passing]
        ran = self.logits_pass.run(self.step_logits, [passed[i] for i in chosen], [plan[i] for i in chosen])
        picks: list[Pick | None] = [None] * len(passed)
        for i, pick in zip(chosen, ran):
            picks[i] = pick
        host = rows + [row for row, pick in zip(passed, picks) if pick is None]
        address = self.step_address if host else 0  # no rows: nothing is read from it
        return picked, self.read_rows(address, len(tokens), host), picks

    def decode_greedy(self, tokens: np.ndarray) -> np.ndarray:
        """Each slot's greedy next token (B,) int64, and no logits leave the device."""
        if self.greedy_outputs and self.fixed is None:
            return self.step(tokens, picked=True)
        return self.decode_picked(tokens, [])[0]

    def greedy_without(self, b: int, row: int, banned: tuple[int, ...]) -> int:
        """The greedy token of slot `row` after the last decode_greedy (over `b` slots), over every id but
        `banned` (its row of logits read from where that step left them: the device buffer, or the host's)."""
        if self.greedy_outputs:
            logits = self.read_rows(self.step_address, b, [row])
        else:
            logits = to_float32(self.logits[: b * self.vocab_size].reshape(b, self.vocab_size), self.dtype)
        return argmax_without(logits[row], banned)

    def read_rows(self, address: int, b: int, rows: list[int] | None) -> np.ndarray:
        """Rows `rows` (None: all, in one copy) of (b, V) logits on the device at `address` into the
        host buffer; (b, V) float32, of which only `rows` are converted (a step of greedy requests
        converts nothing). On the host, a step's logits are not copied: a float32 graph's rows come back
        as a read-only view of the step's buffer (valid until the next picked run writes it), another
        dtype's are converted from there."""
        if self.step_rows is not None and address == self.step_address:
            host = self.step_rows[:b]
        else:
            host = self.logits[: b * self.vocab_size].reshape(b, self.vocab_size)
            if rows is None:
                self.device.read(address, host)
            for row in rows or []:
                self.device.read(address + row * host[row].nbytes, host[row])
        if rows is None:
            return to_float32(host, self.dtype)
        if self.picked_rows is None:
            return host
        if rows:
            self.picked_rows[rows] = to_float32(host[rows], self.dtype)
        return self.picked_rows[:b]

    def step(self, tokens: np.ndarray, picked: bool) -> np.ndarray:
        """One decode run over slots [0, B): logits (B, V) in the graph's dtype, a view of the host
        buffer, or (picked) each slot's greedy token (B,), a copy. The serving loop's hot path, so it
        does as few array operations as it can (each costs microseconds after a run has emptied the
        caches): the step's binding is kept per batch size, its ids and positions are only written,
        and its mask, as wide as the longest slot's positions rounded up to MASK_COLUMNS, is rebound
        only when that width changes."""
        b = len(tokens)
        key = (0, b, 1, picked)
        binding = self._bindings.get(key)
        cached = binding is not None
        if binding is None:
            binding = self.binding(*key)
        held = self.arena.lengths[:b]
        longest = int(held.max()) + 1
        width = min(-(-longest // MASK_COLUMNS) * MASK_COLUMNS, max(self.context, longest))
        inputs = self.inputs
        ids = inputs.write(contract.INPUT_IDS, (b, 1))
        ids[:, 0] = tokens
        positions = inputs.write(contract.POSITION_IDS, (b, 1))
        positions[:, 0] = held
        mask = inputs.write(contract.ATTENTION_MASK, (b, width))  # right-padded
        np.less_equal(self.columns[:, :width], held[:, None], out=mask, casting="unsafe")
        inputs.bind_written(binding, contract.INPUT_IDS, ids, bound=cached)
        inputs.bind_written(binding, contract.POSITION_IDS, positions, bound=cached)
        inputs.bind_written(binding, contract.ATTENTION_MASK, mask, bound=self._mask_widths.get(key) == width)
        self._mask_widths[key] = width
        self.bind_inputs(binding, 0, b)
        self.session.run_with_iobinding(binding)
        held += 1
        if picked:
            return self.next_ids[:b].copy()
        self.last_shape = (b, 1)
        return self.logits[: b * self.vocab_size].reshape(b, self.vocab_size)

    @property
    def nbytes(self) -> int:
        return self.arena.nbytes

    def clear(self, slot: int) -> None:
        self.arena.lengths[slot] = 0

    def move(self, src: int, dst: int) -> None:
        self.arena.move(src, dst)

    def copy(self, src: int, dst: int) -> None:
        self.arena.copy(src, dst)

    def copy_cache(self, src: int, dst: int) -> None:
        """The self-attention cache only (an encoder-decoder's source keys and values stay)."""
        self.arena.copy(src, dst)


class ArenaSeq2SeqDecoder(ArenaDecoder):
    """An encoder-decoder arena: a slot holds its self-attention cache and, written once at admission,
    its source's cross-attention keys/values (right-padded, length = the source's) in a second arena."""

    part = "decoder"

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        manifest: contract.Manifest,
        capacity: int,
        device: Device | None = None,
        logits_pass: str = "auto",
    ):
        super().__init__(decoder, manifest, capacity, capacity, device, logits_pass=logits_pass)
        self.encoder, self.bos_id = encoder, manifest.bos_id
        self.cross = self.make_arena(manifest, capacity, contract.past_names(self.n_layers, "encoder"), [])

    def extra_inputs(self, capacity: int) -> dict[str, int]:
        return {contract.ENCODER_ATTENTION_MASK: capacity * self.context}

    def bind_fixed(self, binding: ort.IOBinding, first: int, count: int) -> None:
        self.arena.bind(binding, first, count)
        self.cross.bind(binding, first, count)

    def bind_inputs(self, binding: ort.IOBinding, first: int, count: int) -> None:
        held = self.cross.lengths[first : first + count]
        source_mask = (np.arange(self.cross.width)[None, :] < held[:, None]).astype(np.int64)  # (B, S)
        self.inputs.bind(binding, contract.ENCODER_ATTENTION_MASK, source_mask)

    def fit_sources(self, arriving: int = 0) -> None:
        """The cross arena laid out as wide as the longest source it holds (or `arriving`, about to be
        written), rounded up to SOURCE_COLUMNS: the decoder's cross-attention reads every position it is
        bound with, so a step over sources of 3 to 80 ids reads 96 a row, not the context's. Wider at
        once when a longer source arrives; narrower only once half the width would do, so that sources
        coming and going do not lay it out again every step."""
        cross = self.cross
        longest = max(int(cross.lengths.max(initial=0)), arriving, 1)
        fitted = min(-(-longest // SOURCE_COLUMNS) * SOURCE_COLUMNS, self.context)
        if fitted > cross.width or fitted <= cross.width // 2:
            cross.refit(fitted)
            self._bindings.clear()  # they bound the cross arena's old shape
            self._mask_widths.clear()

    def encode(self, first: int, sources: list[list[int]]) -> None:
        """Run the encoder once and write each source's cross keys/values into its slot."""
        self.fit_sources(max(len(source) for source in sources))
        ids, mask = right_pad(sources, self.pad_id)
        binding = self.encoder.io_binding()
        for name, value in zip(contract.seq2seq_encoder_inputs(), (ids, mask)):
            binding.bind_cpu_input(name, value)
        for name in contract.seq2seq_encoder_outputs(self.n_layers):
            binding.bind_output(name, self.device.kind, self.device.id)
        self.encoder.run_with_iobinding(binding)
        outputs = binding.get_outputs()  # (b, H, S, D) each
        for row, source in enumerate(sources):
            self.cross.write(first + row, outputs, row, len(source))

    def prefill(self, first: int, sources: list[list[int]]) -> np.ndarray:
        """Fresh sources into the empty slots [first, first + b): encode, then the decoder's BOS step."""
        b = len(sources)
        assert not self.arena.lengths[first : first + b].any(), "prefill into slots that hold state"
        self.encode(first, sources)
        ones = np.ones((b, 1), np.int64)
        logits = self.run(first, ones * self.bos_id, ones, ones * 0)
        self.arena.lengths[first : first + b] = 1
        return to_float32(logits[:, 0], self.dtype)

    @property
    def nbytes(self) -> int:
        return self.arena.nbytes + self.cross.nbytes

    def extend(self, slot: int, tokens: list[int]) -> np.ndarray:  # noqa: ARG002 (the decoder's signature)
        raise ValueError("an encoder-decoder's source is encoded whole; it is never prefilled in chunks")

    def clear(self, slot: int) -> None:
        self.arena.lengths[slot] = self.cross.lengths[slot] = 0
        self.fit_sources()

    def move(self, src: int, dst: int) -> None:
        self.arena.move(src, dst)
        self.cross.move(src, dst)
        self.fit_sources()

    def copy(self, src: int, dst: int) -> None:
        self.arena.copy(src, dst)
        self.cross.copy(src, dst)
