"""One ONNX Runtime session of a model directory's decoder graph, on the provider it really got.

Reads the directory through the torch-free export contract (names, dims, sha256 check) and
runs one forward pass: (input_ids, attention_mask, position_ids, past) -> (logits, present).
On CUDA the run uses IO binding so that present stays on the device and is bound back as the
next step's past. Knows nothing of batching, sampling or gRPC.
"""
from __future__ import annotations

import logging
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


def session_options(threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads      # 0: ONNX Runtime's choice (one per core)
    options.log_severity_level = 3
    return options


def create_session(path: Path, provider: str, threads: int = 0) -> ort.InferenceSession:
    """A session on `provider` (auto|cuda|cpu); auto keeps CUDA only if the session really runs on it."""
    if provider == "cpu":
        return ort.InferenceSession(str(path), session_options(threads), providers=[CPU])
    if CUDA not in ort.get_available_providers():
        if provider == "cuda":
            raise ProviderError("--provider cuda: this onnxruntime has no CUDAExecutionProvider "
                                "(install onnxruntime-gpu)")
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


class ModelRunner:
    """The decoder graph of a model directory and the manifest that describes it."""

    def __init__(self, model_dir: str | Path, provider: str = "auto", threads: int = 0):
        """Raises contract.ModelDirError for a bad directory, ProviderError for a bad provider."""
        self.model_dir = Path(model_dir)
        self.manifest = contract.read_manifest(self.model_dir)
        if self.manifest.get("architecture") != "decoder" or "decoder" not in self.manifest.get("graphs", {}):
            raise contract.ModelDirError(f"{self.model_dir}: architecture {self.manifest.get('architecture')!r}; "
                                         "the server runs decoder-only models")
        config = self.manifest["config"]
        self.n_layers, self.n_heads = int(config["n_layers"]), int(config["n_heads"])
        self.head_dim, self.vocab_size = int(self.manifest["head_dim"]), int(config["vocab_size"])
        self.context_length = int(config["max_len"])
        self.dtype = NP_DTYPES[self.manifest["dtype"]]
        graph = self.manifest["graphs"]["decoder"]
        self.input_names, self.output_names = self._check_names(graph)
        self.session = create_session(self.model_dir / graph["file"], provider, threads)
        self.provider = self.session.get_providers()[0]
        self.on_device = self.provider == CUDA

    def _check_names(self, graph: dict) -> tuple[list[str], list[str]]:
        """The contract's I/O names, after checking that the manifest records the same."""
        inputs, outputs = contract.decoder_inputs(self.n_layers), contract.decoder_outputs(self.n_layers)
        if graph.get("inputs") != inputs or graph.get("outputs") != outputs:
            raise contract.ModelDirError(f"{self.model_dir}: graph I/O names differ from the export contract "
                                         f"(format_version {contract.FORMAT_VERSION})")
        return inputs, outputs

    @property
    def n_past(self) -> int:
        return 2 * self.n_layers

    def empty_past(self, batch: int) -> list[np.ndarray]:
        shape = (batch, self.n_heads, 0, self.head_dim)                          # (B, H, 0, D)
        return [np.zeros(shape, self.dtype) for _ in range(self.n_past)]

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
            past: list[Any]) -> tuple[np.ndarray, list[Any]]:
        """Logits (B, T, V) as float32 on the host, and present (B, H, P+T, D) per past input."""
        host = [input_ids, attention_mask, position_ids]
        if self.on_device:
            return self._run_bound(host, past)
        logits, *present = self.session.run(self.output_names, dict(zip(self.input_names, host + list(past))))
        return logits.astype(np.float32, copy=False), present

    def _run_bound(self, host: list[np.ndarray], past: list[Any]) -> tuple[np.ndarray, list[Any]]:
        """IO binding: past and present stay on the GPU, only ids, mask and logits cross."""
        binding = self.session.io_binding()
        for name, value in zip(self.input_names, host + list(past)):
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        binding.bind_output(self.output_names[0], "cpu")
        for name in self.output_names[1:]:
            binding.bind_output(name, "cuda", 0)
        self.session.run_with_iobinding(binding)
        logits, *present = binding.get_outputs()
        return logits.numpy().astype(np.float32, copy=False), present

    @staticmethod
    def to_host(value: Any) -> np.ndarray:
        """A device array (OrtValue) as numpy; numpy arrays pass through."""
        return value.numpy() if isinstance(value, ort.OrtValue) else value
