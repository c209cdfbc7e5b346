"""Torch-free driver of an exported model directory on ONNX Runtime: sessions, feeds, greedy loop.

Used by the parity gate and the benchmarks to decode exactly as a runtime would. The server
has its own batching engine; continuous_greedy is the simplest correct loop over an arena (the
gate's continuous-batching check, and greedy() on an arena directory), greedy() the concat
layout's. Sessions, dtypes and padding come from ort_session.py, names and dims from the
manifest (contract.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from . import contract
from .arena_decoder import ArenaDecoder, ArenaSeq2SeqDecoder
from .ort_session import NP_DTYPES, compute_stream, create_session, empty_past, left_pad


class OrtGraphs:
    """The graphs of a model directory on one provider (the CPU unless asked), and the manifest that
    describes them."""

    def __init__(
        self,
        model_dir: str | Path,
        threads: int = 0,
        verify: bool = True,
        manifest: contract.Manifest | None = None,
        provider: str = "cpu",
    ):
        """`manifest`: one not yet written (export's, before its gate); otherwise model_dir's is read.
        `provider` "cuda" puts every graph on one CUDA stream (raises ProviderError without CUDA)."""
        self.manifest = manifest or contract.read_manifest(model_dir, verify=verify)
        self.sessions: dict[str, ort.InferenceSession] = {}
        for role, graph in self.manifest.graphs.items():
            stream = compute_stream(next(iter(self.sessions.values()))) if self.sessions else 0
            self.sessions[role] = create_session(Path(model_dir) / graph.file, provider, threads, stream)
        self.provider = next(iter(self.sessions.values())).get_providers()[0]
        m = self.manifest
        self.n_layers, self.n_kv_heads, self.head_dim, self.context = (
            m.n_layers,
            m.n_kv_heads,
            m.head_dim,
            m.context_length,
        )
        self.dtype, self.pad_id, self.bos_id = NP_DTYPES.get(m.dtype), m.pad_id, m.bos_id
        self.arena_layout = m.kv_cache == contract.KV_ARENA

    def empty_past(self, batch: int) -> list[np.ndarray]:
        return empty_past(self.n_layers, self.n_kv_heads, self.head_dim, batch, self.manifest.dtype)

    def feeds(self, role: str, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
        """The role's graph inputs by name, from arrays in the contract's order."""
        return dict(zip(self.manifest.graphs[role].inputs, arrays))


class OrtDecoder(OrtGraphs):
    """One decoder-only graph and the manifest that describes it, in either KV cache layout."""

    _arena: ArenaDecoder | None = None  # the last arena driver, reused while it is large enough

    @property
    def session(self) -> ort.InferenceSession:
        return self.sessions[contract.DECODER]

    def arena(self, capacity: int, max_tokens: int = 0) -> ArenaDecoder:
        """An empty arena driver of at least this many slots (arena graphs only)."""
        if self._arena is None or self._arena.arena.capacity < capacity or self._arena.max_tokens < max_tokens:
            self._arena = ArenaDecoder(self.session, self.manifest, capacity, max_tokens or capacity)
        self._arena.arena.lengths[:] = 0
        return self._arena

    def logits(self, windows: np.ndarray) -> np.ndarray:
        """Logits (B, T, V) at every position of unpadded sequences (B, T), from an empty cache."""
        b, t = windows.shape
        mask, positions = np.ones_like(windows), np.broadcast_to(np.arange(t), windows.shape)
        if not self.arena_layout:
            return self.run(windows, mask, positions, self.empty_past(b))[0]
        return self.arena(b, b * t).run(0, windows, mask, positions).copy()

    def run(self, input_ids, attention_mask, position_ids, past: list[np.ndarray]):
        """(logits (B, T, V), present list) for T new tokens after `past`."""
        feeds = self.feeds(contract.DECODER, [input_ids, attention_mask, position_ids, *past])
        logits, *present = self.session.run(None, feeds)
        return logits, present

    def greedy(self, prompts: list[list[int]], steps: int, recompute: bool = False) -> np.ndarray:
        """(B, steps) greedy tokens, EOS ignored; `recompute` re-runs the whole sequence each step."""
        if self.arena_layout:
            return self.arena_greedy(prompts, steps, recompute)
        ids, mask, positions = left_pad(prompts, self.pad_id)
        logits, past = self.run(ids, mask, positions, self.empty_past(len(prompts)))
        out = []
        for _ in range(steps):
            token = logits[:, -1].argmax(-1)[:, None]  # (B, 1)
            out.append(token)
            ids, mask = np.concatenate([ids, token], 1), np.concatenate([mask, np.ones_like(token)], 1)
            positions = positions[:, -1:] + 1
            if recompute:
                full_positions = np.maximum(mask.cumsum(-1) - 1, 0)
                logits, _ = self.run(ids, mask, full_positions, self.empty_past(len(prompts)))
            else:
                logits, past = self.run(token, mask, positions, past)
        return np.concatenate(out, 1)

    def arena_greedy(self, prompts: list[list[int]], steps: int, recompute: bool = False) -> np.ndarray:
        """greedy() through the arena: continuous_greedy with every request arriving at once; or,
        with `recompute`, the whole sequences prefilled again at every step (no cache reused)."""
        longest = max(len(p) for p in prompts) + steps
        decoder = self.arena(len(prompts), len(prompts) * longest)
        if not recompute:
            return continuous_greedy(decoder, prompts, [0] * len(prompts), steps)
        logits, out, seqs = decoder.prefill(0, prompts), [], [list(p) for p in prompts]
        for _ in range(steps):
            token = logits.argmax(-1)  # (B,)
            out.append(token[:, None])
            seqs = [s + [int(t)] for s, t in zip(seqs, token)]
            decoder.arena.lengths[:] = 0
            logits = decoder.prefill(0, seqs)
        return np.concatenate(out, 1)


class OrtSeq2Seq(OrtGraphs):
    """The encoder and decoder graphs of an encoder-decoder model directory."""

    @property
    def encoder(self) -> ort.InferenceSession:
        return self.sessions[contract.ENCODER]

    @property
    def decoder(self) -> ort.InferenceSession:
        return self.sessions[contract.DECODER]

    def arena(self, capacity: int) -> ArenaSeq2SeqDecoder:
        """An empty arena driver of `capacity` slots (arena directories only)."""
        return ArenaSeq2SeqDecoder(self.encoder, self.decoder, self.manifest, capacity)

    def encode(self, src_ids, src_mask) -> list[np.ndarray]:
        """Cross-attention keys and values, (B, H, S, D) each, computed once per source."""
        return self.encoder.run(None, self.feeds(contract.ENCODER, [src_ids, src_mask]))

    def run(self, input_ids, attention_mask, position_ids, src_mask, past, cross):
        """(logits (B, T, V), present self-attention cache) for T new target tokens."""
        feeds = self.feeds(contract.DECODER, [input_ids, attention_mask, position_ids, src_mask, *past, *cross])
        logits, *present = self.decoder.run(None, feeds)
        return logits, present

    def greedy(self, sources: list[list[int]], steps: int) -> np.ndarray:
        """(B, steps) greedy target tokens from BOS, EOS ignored."""
        if self.arena_layout:
            return continuous_greedy(self.arena(len(sources)), sources, [0] * len(sources), steps)
        src, src_mask, _ = left_pad(sources, self.pad_id)
        cross = self.encode(src, src_mask)
        b = len(sources)
        token = np.full((b, 1), self.bos_id, np.int64)
        past, out = self.empty_past(b), []
        for step in range(steps):
            mask = np.ones((b, step + 1), np.int64)
            logits, past = self.run(token, mask, np.full((b, 1), step, np.int64), src_mask, past, cross)
            token = logits[:, -1].argmax(-1)[:, None]
            out.append(token)
        return np.concatenate(out, 1)


def continuous_greedy(
    decoder, prompts: list[list[int]], arrivals: list[int], steps: int, ids_only: bool = False
) -> np.ndarray:
    """(N, steps) greedy tokens with request i joining the batch at step arrivals[i] and leaving
    after its `steps` tokens, its slot refilled by the last one (the server's policy). `decoder`:
    an ArenaDecoder (prompts) or ArenaSeq2SeqDecoder (sources) of at least N slots. `ids_only`:
    decode steps bring back only the graph's greedy tokens (decode_greedy), as the server's
    all-greedy steps do."""
    out: list[list[int]] = [[] for _ in prompts]
    slot_of: list[int] = []  # request in each occupied slot
    picked: dict[int, int] = {}  # each request's next token, picked as soon as its logits come
    for step in range(max(arrivals) + steps):
        for i in [i for i, a in enumerate(arrivals) if a == step]:
            slot_of.append(i)
            picked[i] = int(decoder.prefill(len(slot_of) - 1, [prompts[i]])[0].argmax())
        for i in slot_of:
            out[i].append(picked[i])
        for i in [i for i in slot_of if len(out[i]) == steps]:  # done: the last slot moves into its place
            slot, last = slot_of.index(i), len(slot_of) - 1
            if slot != last:
                decoder.move(last, slot)
            else:
                decoder.clear(slot)
            slot_of[slot] = slot_of[last]
            slot_of.pop()
        if slot_of:
            tokens = np.array([out[i][-1] for i in slot_of])
            step = decoder.decode_greedy(tokens) if ids_only else decoder.decode(tokens).argmax(axis=1)
            picked.update(zip(slot_of, step.tolist()))
    return np.array(out)
