"""The ONNX Runtime sessions of a model directory, on the provider they really got.

Reads the directory through the torch-free export contract (names, dims, sha256 check), opens the
decoder graph (and an encoder-decoder's encoder) on the provider asked for, and refuses a manifest
whose dims, context or external data the graphs contradict (their declared I/O, and graph_facts.py).
The arena runner (arena_runner.py) drives these sessions through runtime/arena_decoder.py. `prefill` and
`run` are the concat layout's forward pass, (input_ids, attention_mask, position_ids, past) ->
(logits, present), used only by benchmarks/concat_runner.py, the KV benchmark's baseline; on CUDA they use
IO binding so that present stays on the device. Knows nothing of batching, sampling or gRPC.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from ..engine.seam import ModelSpec
from . import contract
from .graph_facts import read_graph
from .ort_session import (
    CUDA,
    NP_DTYPES,
    ProviderError,
    compute_stream,
    create_session,
    cuda_available,
    empty_past,
    io_names,
    resolve_provider,
)

log = logging.getLogger(__name__)

__all__ = ["ORT_ERRORS", "ModelSessions", "Prefilled", "ProviderError", "default_threads", "model_spec", "one_line"]

# What ONNX Runtime raises (each class derives from Exception alone): caught where a model is opened.
ORT_ERROR_NAMES = "Fail InvalidArgument NoSuchFile NoModel EngineError RuntimeException InvalidProtobuf ModelLoaded"
ORT_ERROR_NAMES += " NotImplemented InvalidGraph EPFail"
ORT_ERRORS: tuple[type[Exception], ...] = tuple(
    getattr(ort_state, name) for name in ORT_ERROR_NAMES.split() if hasattr(ort_state, name)
)
KV_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16"}


def one_line(e: BaseException) -> str:
    """An exception as its class and its message on one line (ONNX Runtime's may span several)."""
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


# A model with this many bytes of graphs and weights or more gets every core and spinning intra-op
# threads by default; a smaller one leaves a core to the gRPC front end and lets its threads sleep
# (docs/design/decisions/intra-op-spinning.md).
LARGE_MODEL_BYTES = 32 << 20


def model_bytes(model_dir: str | Path) -> int:
    """Bytes of a model directory's graphs and their external weights (.onnx and .data files)."""
    return sum(f.stat().st_size for f in Path(model_dir).iterdir() if f.suffix in (".onnx", ".data"))


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_threads(weight_bytes: int = 0) -> int:
    """Intra-op threads when none are asked for: every core this process may use for a model of
    LARGE_MODEL_BYTES or more, whose steps are long enough to pay for them; every core but one for a
    smaller one, the one left to the gRPC front end, which then adds far less to each token
    (docs/design/decisions/default-threads.md)."""
    cores = usable_cores()
    return cores if weight_bytes >= LARGE_MODEL_BYTES else max(1, cores - 1)


def model_spec(manifest: contract.Manifest) -> ModelSpec:
    """What the engine may know of the model a manifest describes."""
    return ModelSpec(manifest.vocab_size, manifest.context_length, manifest.bos_id, manifest.seq2seq)


@dataclass
class Prefilled:
    """What a prefill leaves for the KV cache: per row, the self-attention present (b, H, T, D) and
    its mask (b, T); an encoder-decoder adds the cross-attention keys and values (b, H, S, D) and
    the source mask (b, S)."""

    present: list[Any]
    mask: np.ndarray
    cross: list[Any] = field(default_factory=list)
    cross_mask: np.ndarray | None = None


class ModelSessions:
    """The graphs of a model directory (decoder, and the encoder of an encoder-decoder) and its manifest."""

    def __init__(
        self,
        model_dir: str | Path,
        provider: str = "auto",
        threads: int = 0,
        cuda_graphs: bool = True,
        spinning: bool | None = None,
    ):
        """Raises contract.ModelDirError for a bad directory, ProviderError for a bad provider.
        `cuda_graphs`: on CUDA, a decoder-only graph is opened twice, the second time for decode
        steps replayed as CUDA graphs (fixed_steps.py). `threads` 0 and `spinning` None choose by the
        model's size (default_threads, LARGE_MODEL_BYTES); spinning: idle intra-op threads spin
        (ort_session.session_options)."""
        self.model_dir = Path(model_dir)
        self.manifest = contract.read_manifest(self.model_dir)
        m = self.manifest
        self.seq2seq, self.n_layers, self.n_kv_heads, self.head_dim = m.seq2seq, m.n_layers, m.n_kv_heads, m.head_dim
        self.vocab_size, self.context_length, self.bos_id = m.vocab_size, m.context_length, m.bos_id
        self.dtype = NP_DTYPES.get(m.dtype)  # the concat layout's (float32, float16)
        decoder = m.graphs[contract.DECODER]
        self.input_names, self.output_names = list(decoder.inputs), list(decoder.outputs)
        size = model_bytes(self.model_dir)
        threads = threads or default_threads(size)
        spinning = size >= LARGE_MODEL_BYTES if spinning is None else spinning
        self.threads, self.spinning = threads, spinning
        provider, self.provider_note = resolve_provider(provider, m.providers, *self.describe(), cuda_available())
        if self.provider_note:
            log.warning("--provider auto: %s", self.provider_note)
        self.session = self._open(decoder.file, provider, threads, spinning=spinning)
        self.provider = self.session.get_providers()[0]
        self.on_device = self.provider == CUDA
        self.graph_session: ort.InferenceSession | None = None
        if self.on_device and cuda_graphs and not self.seq2seq:
            stream = compute_stream(self.session)
            self.graph_session = self._open(decoder.file, "cuda", threads, stream, cuda_graph=True)
        self.encoder: ort.InferenceSession | None = None
        if self.seq2seq:
            encoder = m.graphs[contract.ENCODER].file
            on = "cuda" if self.on_device else "cpu"
            stream = compute_stream(self.session)
            self.encoder = self._open(encoder, on, threads, stream, spinning=spinning)
        self._check_graphs()
        self._check_names()
        self.spec = model_spec(m)

    def _open(self, file: str, *args: Any, **kwargs: Any) -> ort.InferenceSession:
        """create_session of one of the directory's graphs; ONNX Runtime's refusal as a ModelDirError."""
        path = self.model_dir / file
        try:
            return create_session(path, *args, **kwargs)
        except ORT_ERRORS as e:
            raise contract.ModelDirError(f"{path}: ONNX Runtime cannot load it: {one_line(e)}") from None

    def describe(self) -> tuple[str, str]:
        """What this export is, and the command that exports it for the other provider (for messages)."""
        m = self.manifest
        what = f"{self.model_dir} is a {m.dtype} {m.kv_cache} export"
        checkpoint = m.source_checkpoint.get("path", "CHECKPOINT")
        dtype = "float32" if m.dtype == "bfloat16" else "float16"
        return what, f"export it again: attnserve export {checkpoint} --out {self.model_dir}-{dtype} --dtype {dtype}"

    def _check_graphs(self) -> None:
        """The manifest must say what the graphs hold, before the arena and the request limits are sized
        by it: the decoder's dims (dim_problems), every graph's positions and external data (read_graph)."""
        m = self.manifest
        problems = dim_problems(m, self.session)
        for graph in m.graphs.values():
            path = self.model_dir / graph.file
            try:
                facts = read_graph(path)
            except (OSError, ValueError, IndexError) as e:
                raise contract.ModelDirError(f"{path}: not an ONNX graph attnserve can read ({e})") from None
            for location in facts.external:  # ONNX Runtime reads them relative to the graph's folder
                name = str(PurePosixPath(graph.file).parent / location)
                why = contract.outside(self.model_dir, name) or (
                    None if name in m.files else "which files does not list"
                )
                if why:
                    problems.append(f"{graph.file}'s external data names {name!r}, {why}")
            if facts.positions is not None and m.context_length > facts.positions:
                problems.append(
                    f"config.max_len is {m.context_length}, the graph's is {facts.positions} "
                    f"(the rows of {graph.file}'s positional table)"
                )
        if problems:
            raise contract.ModelDirError(f"{self.model_dir}: {problems[0]}")

    def _check_names(self) -> None:
        """The graphs must have the contract's I/O names: the runner feeds them by those names."""
        sessions = {contract.DECODER: self.session, contract.ENCODER: self.encoder}
        graphs = {role: io_names(session) for role, session in sessions.items() if session is not None}
        problems = contract.io_name_problems(self.manifest.architecture, self.n_layers, graphs)
        if problems:
            raise contract.ModelDirError(
                f"{self.model_dir}: {problems[0]} (export contract format_version {contract.FORMAT_VERSION})"
            )

    @property
    def n_past(self) -> int:
        return 2 * self.n_layers

    def empty_past(self, batch: int) -> list[np.ndarray]:
        return empty_past(self.n_layers, self.n_kv_heads, self.head_dim, batch, self.manifest.dtype)

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
        assert self.encoder is not None, "encode() of a decoder-only model"
        graph = self.manifest.graphs[contract.ENCODER]
        return self._run(self.encoder, list(graph.inputs), list(graph.outputs), [source_ids, source_mask], 0)

    def run(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[Any],
        cross_mask: np.ndarray | None = None,
        cross: Sequence[Any] = (),
    ) -> tuple[np.ndarray, list[Any]]:
        """Logits (B, T, V) as float32 on the host, and present (B, H, P+T, D) per past input.

        An encoder-decoder step also takes the source mask (B, S) and the cross keys and values."""
        feeds: list[Any] = [input_ids, attention_mask, position_ids]
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


def dim_problems(manifest: contract.Manifest, session: ort.InferenceSession) -> list[str]:
    """Where the manifest's dims differ from those the decoder graph declares: its layers (past keys), KV
    heads, head dim and dtype (past (B, H, L, D) and its type), its vocabulary (logits (B, T, V))."""
    m = manifest
    heads = "config.n_kv_heads" if m.config.get("n_kv_heads") else "config.n_heads"
    pasts = [i for i in session.get_inputs() if i.name.startswith("past_key_values.") and ".encoder." not in i.name]
    said: list[tuple[str, Any, Any]] = [("config.n_layers", m.n_layers, sum(i.name.endswith(".key") for i in pasts))]
    for past in pasts:
        _, h, _, d = past.shape if len(past.shape) == 4 else (None,) * 4  # (B, H, L, D)
        said += [(heads, m.n_kv_heads, h), ("head_dim", m.head_dim, d), ("dtype", m.dtype, KV_DTYPES.get(past.type))]
    logits = [o.shape[-1] for o in session.get_outputs() if o.name == contract.LOGITS and o.shape]
    said += [("config.vocab_size", m.vocab_size, v) for v in logits]
    return [  # a dynamic dim is a name or None: only declared ones are compared
        f"{name} is {ours!r}, the graph's is {graph!r}"
        for name, ours, graph in said
        if graph is not None and graph != ours and (name == "dtype" or isinstance(graph, int))
    ]
