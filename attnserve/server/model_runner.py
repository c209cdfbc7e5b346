"""The ONNX Runtime sessions of a model directory, on the provider they really got.

Reads the directory through the torch-free export contract (names, dims, sha256 check) and
opens the decoder graph (and an encoder-decoder's encoder) on the provider asked for. The arena
runner (arena_runner.py) drives these sessions through export/arena_decoder.py. `prefill` and
`run` are the concat layout's forward pass, (input_ids, attention_mask, position_ids, past) ->
(logits, present), used only by concat_runner.py, the KV benchmark's baseline; on CUDA they use
IO binding so that present stays on the device. Knows nothing of batching, sampling or gRPC.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from ..export import contract

log = logging.getLogger("attnserve.server")

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
NP_DTYPES = {"float32": np.float32, "float16": np.float16}


class ProviderError(Exception):
    """The requested execution provider cannot run this model here."""


def default_threads() -> int:
    """Intra-op threads when none are asked for: every core this process may use but one, which
    is left to the gRPC event loop (measured on 2 cores: gRPC adds 5-15% per token instead of
    25-35%, and end-to-end tokens/s rises 15-35% at one stream)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


def session_options(threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or default_threads()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options


def create_session(path: Path, provider: str, threads: int = 0) -> ort.InferenceSession:
    """A session on `provider` (auto|cuda|cpu); auto keeps CUDA only if the session really runs on it."""
    if provider == "cpu":
        return ort.InferenceSession(str(path), session_options(threads), providers=[CPU])
    if CUDA not in ort.get_available_providers():
        if provider == "cuda":
            raise ProviderError(
                "--provider cuda: this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
            )
        return create_session(path, "cpu", threads)
    try:
        session = ort.InferenceSession(str(path), session_options(threads), providers=[CUDA, CPU])
    except Exception as e:  # noqa: BLE001 - ORT raises several types when CUDA fails to start
        session, reason = None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    else:
        reason = "the session fell back to the CPU (CUDA libraries or device missing?)"
    if session is not None and session.get_providers()[0] == CUDA:
        return session
    if provider == "cuda":
        raise ProviderError(f"--provider cuda: {reason}")
    log.warning("--provider auto: CUDA unavailable (%s); using the CPU", reason)
    return create_session(path, "cpu", threads)


DECODER, SEQ2SEQ = "decoder", "encoder-decoder"


@dataclass
class Prefilled:
    """What a prefill leaves for the KV cache: per row, the self-attention present (b, H, T, D) and
    its mask (b, T); an encoder-decoder adds the cross-attention keys and values (b, H, S, D) and
    the source mask (b, S)."""

    present: list[Any]
    mask: np.ndarray
    cross: list[Any] = field(default_factory=list)
    cross_mask: np.ndarray | None = None


class ModelRunner:
    """The graphs of a model directory (decoder, and the encoder of an encoder-decoder) and its manifest."""

    def __init__(self, model_dir: str | Path, provider: str = "auto", threads: int = 0):
        """Raises contract.ModelDirError for a bad directory, ProviderError for a bad provider."""
        self.model_dir = Path(model_dir)
        self.manifest = contract.read_manifest(self.model_dir)
        self.architecture = self.manifest.get("architecture")
        if self.architecture not in (DECODER, SEQ2SEQ):
            raise contract.ModelDirError(f"{self.model_dir}: unknown architecture {self.architecture!r}")
        config = self.manifest["config"]
        self.n_layers, self.n_heads = int(config["n_layers"]), int(config["n_heads"])
        self.head_dim, self.vocab_size = int(self.manifest["head_dim"]), int(config["vocab_size"])
        self.context_length = int(config["max_len"])
        self.dtype = NP_DTYPES[self.manifest["dtype"]]
        self.bos_id = int(self.manifest["tokenizer"]["bos_id"])
        graphs = self._check_names(self.manifest.get("graphs", {}))
        self.input_names, self.output_names = graphs["decoder"]["inputs"], graphs["decoder"]["outputs"]
        self.session = create_session(self.model_dir / graphs["decoder"]["file"], provider, threads)
        self.provider = self.session.get_providers()[0]
        self.on_device = self.provider == CUDA
        self.encoder = None
        if self.seq2seq:
            self.encoder = create_session(
                self.model_dir / graphs["encoder"]["file"], "cuda" if self.on_device else "cpu", threads
            )

    @property
    def seq2seq(self) -> bool:
        return self.architecture == SEQ2SEQ

    def _check_names(self, graphs: dict) -> dict:
        """The manifest's graphs, after checking that they record the contract's I/O names."""
        n = self.n_layers
        expected = {"decoder": (contract.decoder_inputs(n), contract.decoder_outputs(n))}
        if self.seq2seq:
            expected = {
                "encoder": (contract.seq2seq_encoder_inputs(), contract.seq2seq_encoder_outputs(n)),
                "decoder": (contract.seq2seq_decoder_inputs(n), contract.seq2seq_decoder_outputs(n)),
            }
        for role, (inputs, outputs) in expected.items():
            graph = graphs.get(role, {})
            if graph.get("inputs") != inputs or graph.get("outputs") != outputs:
                raise contract.ModelDirError(
                    f"{self.model_dir}: the {role} graph's I/O names differ from the "
                    f"export contract (format_version {contract.FORMAT_VERSION})"
                )
        return graphs

    @property
    def n_past(self) -> int:
        return 2 * self.n_layers

    def empty_past(self, batch: int) -> list[np.ndarray]:
        shape = (batch, self.n_heads, 0, self.head_dim)  # (B, H, 0, D)
        return [np.zeros(shape, self.dtype) for _ in range(self.n_past)]

    def prefill(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray
    ) -> tuple[np.ndarray, Prefilled]:
        """Last-position logits (b, V) of left-padded prompts, and their rows for the KV cache.

        Decoder-only: the prompts run with an empty past. Encoder-decoder: the prompts are the
        sources; the encoder runs once, then the decoder runs BOS at position 0."""
        b = input_ids.shape[0]
        if not self.seq2seq:
            logits, present = self.run(input_ids, attention_mask, position_ids, self.empty_past(b))
            return logits[:, -1], Prefilled(present, attention_mask)
        cross = self.encode(input_ids, attention_mask)
        bos, ones = np.full((b, 1), self.bos_id, np.int64), np.ones((b, 1), np.int64)
        logits, present = self.run(bos, ones, np.zeros((b, 1), np.int64), self.empty_past(b), attention_mask, cross)
        return logits[:, -1], Prefilled(present, ones, cross, attention_mask)

    def encode(self, source_ids: np.ndarray, source_mask: np.ndarray) -> list[Any]:
        """Cross-attention keys and values (B, H, S, D), two per decoder layer."""
        feeds = [source_ids, source_mask]
        return self._run(
            self.encoder,
            contract.seq2seq_encoder_inputs(),
            contract.seq2seq_encoder_outputs(self.n_layers),
            feeds,
            host_outputs=0,
        )

    def run(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[Any],
        cross_mask: np.ndarray | None = None,
        cross: list[Any] = (),
    ) -> tuple[np.ndarray, list[Any]]:
        """Logits (B, T, V) as float32 on the host, and present (B, H, P+T, D) per past input.

        An encoder-decoder step also takes the source mask (B, S) and the cross keys and values."""
        feeds = [input_ids, attention_mask, position_ids]
        feeds += [cross_mask, *past, *cross] if self.seq2seq else list(past)
        logits, *present = self._run(self.session, self.input_names, self.output_names, feeds, host_outputs=1)
        return self.to_host(logits).astype(np.float32, copy=False), present

    def _run(
        self, session: ort.InferenceSession, inputs: list[str], outputs: list[str], feeds: list[Any], host_outputs: int
    ) -> list[Any]:
        """One run; under IO binding the first `host_outputs` outputs come to the host, the rest stay
        on the GPU, and inputs already there (OrtValues) are bound where they are."""
        if not self.on_device:
            return session.run(outputs, dict(zip(inputs, feeds)))
        binding = session.io_binding()
        for name, value in zip(inputs, feeds):
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for i, name in enumerate(outputs):
            if i < host_outputs:
                binding.bind_output(name, "cpu")
            else:
                binding.bind_output(name, "cuda", 0)
        session.run_with_iobinding(binding)
        return binding.get_outputs()

    def to_device(self, value: Any) -> Any:
        """A host array as an OrtValue on the GPU under IO binding; device arrays and the CPU pass through."""
        if not self.on_device or isinstance(value, ort.OrtValue):
            return value
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), "cuda", 0)

    @staticmethod
    def to_host(value: Any) -> np.ndarray:
        """A device array (OrtValue) as numpy; numpy arrays pass through."""
        return value.numpy() if isinstance(value, ort.OrtValue) else value
