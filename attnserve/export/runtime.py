"""Torch-free driver of an exported model directory on ONNX Runtime: sessions, feeds, greedy loop.

Used by the parity gate and the benchmarks to decode exactly as a runtime would. The server
has its own batching engine; this is the simplest correct loop, one batch at a time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from . import contract
from .arena import NP_DTYPES
from .arena_decoder import ArenaDecoder, ArenaSeq2SeqDecoder


def make_session(path: str | Path, threads: int = 0) -> ort.InferenceSession:
    """A CPU session; `threads` 0 lets ONNX Runtime choose."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def left_pad(seqs: list[list[int]], pad_id: int):
    """input_ids, attention_mask, position_ids (int64, (B, T)) of left-padded sequences."""
    t = max(len(s) for s in seqs)
    ids = np.array([[pad_id] * (t - len(s)) + list(s) for s in seqs], dtype=np.int64)
    mask = np.array([[0] * (t - len(s)) + [1] * len(s) for s in seqs], dtype=np.int64)
    return ids, mask, np.maximum(mask.cumsum(-1) - 1, 0)


class OrtDecoder:
    """One decoder-only graph and the manifest that describes it, in either KV cache layout."""

    def __init__(self, model_dir: str | Path, threads: int = 0, verify: bool = True):
        self.manifest = contract.read_manifest(model_dir, verify=verify)
        graph = self.manifest["graphs"]["decoder"]
        self.session = make_session(Path(model_dir) / graph["file"], threads)
        self.n_layers = self.manifest["config"]["n_layers"]
        self.n_heads, self.head_dim = self.manifest["config"]["n_heads"], self.manifest["head_dim"]
        self.context = int(self.manifest["config"]["max_len"])
        self.dtype = NP_DTYPES[self.manifest["dtype"]]
        self.pad_id = self.manifest["tokenizer"]["pad_id"]
        self.arena_layout = contract.kv_layout(self.manifest) == contract.KV_ARENA
        self._arena: ArenaDecoder | None = None

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

    def empty_past(self, batch: int) -> list[np.ndarray]:
        shape = (batch, self.n_heads, 0, self.head_dim)  # (B, H, 0, D)
        return [np.zeros(shape, self.dtype) for _ in range(2 * self.n_layers)]

    def run(self, input_ids, attention_mask, position_ids, past: list[np.ndarray]):
        """(logits (B, T, V), present list) for T new tokens after `past`."""
        feeds = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            **dict(zip(contract.past_names(self.n_layers), past)),
        }
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
        """greedy() through the arena: the prompts prefilled together, then one token per step."""
        longest = max(len(p) for p in prompts) + steps
        decoder = self.arena(len(prompts), len(prompts) * longest)
        logits, out, seqs = decoder.prefill(0, prompts), [], [list(p) for p in prompts]
        for _ in range(steps):
            token = logits.argmax(-1)  # (B,)
            out.append(token[:, None])
            if recompute:
                seqs = [s + [int(t)] for s, t in zip(seqs, token)]
                decoder.arena.lengths[:] = 0
                logits = decoder.prefill(0, seqs)
            else:
                logits = decoder.decode(token)
        return np.concatenate(out, 1)


class OrtSeq2Seq:
    """The encoder and decoder graphs of an encoder-decoder model directory."""

    def __init__(self, model_dir: str | Path, threads: int = 0, verify: bool = True):
        self.manifest = contract.read_manifest(model_dir, verify=verify)
        graphs = self.manifest["graphs"]
        self.encoder = make_session(Path(model_dir) / graphs["encoder"]["file"], threads)
        self.decoder = make_session(Path(model_dir) / graphs["decoder"]["file"], threads)
        self.n_layers = self.manifest["config"]["n_layers"]
        self.n_heads, self.head_dim = self.manifest["config"]["n_heads"], self.manifest["head_dim"]
        self.dtype = NP_DTYPES[self.manifest["dtype"]]
        tokenizer = self.manifest["tokenizer"]
        self.pad_id, self.bos_id = tokenizer["pad_id"], tokenizer["bos_id"]
        self.arena_layout = contract.kv_layout(self.manifest) == contract.KV_ARENA

    def arena(self, capacity: int) -> ArenaSeq2SeqDecoder:
        """An empty arena driver of `capacity` slots (arena directories only)."""
        return ArenaSeq2SeqDecoder(self.encoder, self.decoder, self.manifest, capacity)

    def encode(self, src_ids, src_mask) -> list[np.ndarray]:
        """Cross-attention keys and values, (B, H, S, D) each, computed once per source."""
        return self.encoder.run(None, {"input_ids": src_ids, "attention_mask": src_mask})

    def empty_past(self, batch: int) -> list[np.ndarray]:
        shape = (batch, self.n_heads, 0, self.head_dim)  # (B, H, 0, D)
        return [np.zeros(shape, self.dtype) for _ in range(2 * self.n_layers)]

    def run(self, input_ids, attention_mask, position_ids, src_mask, past, cross):
        """(logits (B, T, V), present self-attention cache) for T new target tokens."""
        feeds = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "encoder_attention_mask": src_mask,
            **dict(zip(contract.past_names(self.n_layers, "decoder"), past)),
            **dict(zip(contract.past_names(self.n_layers, "encoder"), cross)),
        }
        logits, *present = self.decoder.run(None, feeds)
        return logits, present

    def greedy(self, sources: list[list[int]], steps: int) -> np.ndarray:
        """(B, steps) greedy target tokens from BOS, EOS ignored."""
        if self.arena_layout:
            decoder = self.arena(len(sources))
            logits, out = decoder.prefill(0, sources), []
            for _ in range(steps):
                out.append(logits.argmax(-1)[:, None])
                logits = decoder.decode(out[-1][:, 0])
            return np.concatenate(out, 1)
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
