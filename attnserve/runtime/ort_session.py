"""ONNX Runtime, set up once for export and server: sessions, providers, dtypes, padded feeds.

Torch-free, below both runtime/ort_decoder.py (the parity gate's loop) and the runners (the serving
engine), so that the gate opens and feeds a graph exactly as serving does. Knows nothing of
batching, KV layouts or requests: a session, its options, and the arrays every run needs.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..tokenizer import padding
from .cuda_runtime import cuda_runtime, preload_cuda_libraries

log = logging.getLogger(__name__)

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
NP_DTYPES = {"float32": np.float32, "float16": np.float16}  # the manifest's dtype -> numpy's (concat layout)
BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16: numpy has no bfloat16, ONNX Runtime takes the ONNX type's number
ELEMENT_TYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": BFLOAT16}  # what IO binding takes
HOST_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}  # host buffers of each


class ProviderError(Exception):
    """The requested execution provider cannot run this model here."""


SPINNING = "session.intra_op.allow_spinning"  # idle intra-op threads spin (1) or sleep (0)
SPINNING_STOP = "session.force_spinning_stop"  # 1: they stop spinning when a run returns


def session_options(
    threads: int = 0,
    optimization: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    spinning: bool = False,
) -> ort.SessionOptions:
    """`threads` 0 lets ONNX Runtime choose. Idle intra-op threads sleep unless `spinning`: a sleeping
    thread costs a wake-up at every parallel node, a spinning one burns a core the process may share.
    Spinning threads spin within a run and sleep once it returns (ONNX Runtime's force_spinning_stop),
    leaving the cores between runs to the host's work: the draws, the front end
    (docs/design/decisions/intra-op-spinning.md)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = optimization
    options.add_session_config_entry(SPINNING, "1" if spinning else "0")
    options.add_session_config_entry(SPINNING_STOP, "1")
    options.log_severity_level = 3
    return options


def to_float32(values: np.ndarray, dtype: str) -> np.ndarray:
    """Host values of a graph's `dtype` as float32 (bfloat16 is the top half of a float32's bits)."""
    if dtype == "bfloat16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32, copy=False)


def cuda_available() -> bool:
    return CUDA in ort.get_available_providers()


def resolve_provider(asked: str, suits: tuple[str, ...], what: str, export_hint: str, cuda: bool) -> tuple[str, str]:
    """The provider to open a model's graphs on, and why when it is not the one asked for.

    `suits`: the manifest's providers (which ones run these graphs); `what`: the model, for
    messages ("models/x is a float32 arena export"); `export_hint`: the command that re-exports
    it; `cuda`: whether this onnxruntime has the CUDA provider. auto means CUDA where it may run.
    Raises ProviderError (one line) where the model cannot run on what was asked."""
    if asked == "cpu" and "cpu" not in suits:
        raise ProviderError(f"--provider cpu: {what}, which only ONNX Runtime's CUDA provider runs; {export_hint}")
    if asked == "cuda" and "cuda" not in suits:
        raise ProviderError(
            f"--provider cuda: {what}, which ONNX Runtime's CUDA provider cannot run (its GroupQueryAttention "
            f"is float16/bfloat16 only); {export_hint}"
        )
    if asked != "auto":
        return asked, ""
    if "cuda" in suits and cuda:
        return "auto", ""
    if "cpu" not in suits:
        raise ProviderError(
            f"--provider auto: {what}, which only ONNX Runtime's CUDA provider runs, and this onnxruntime "
            "has none (install onnxruntime-gpu on a CUDA host)"
        )
    if cuda:
        return "cpu", f"{what}, which CUDA cannot run; serving on the CPU ({export_hint})"
    return "cpu", ""


def create_session(
    path: str | Path,
    provider: str = "cpu",
    threads: int = 0,
    stream: int = 0,
    cuda_graph: bool = False,
    spinning: bool = False,
) -> ort.InferenceSession:
    """A session on `provider` (auto|cuda|cpu); auto keeps CUDA only if the session really runs on it.

    On CUDA the session computes on a stream of ours (`stream`, or a new one): the arena's copies
    are queued on it too, so they are ordered with ONNX Runtime's kernels (arena.Device).
    `cuda_graph`: runs may be captured and replayed as CUDA graphs (fixed_steps.py). `spinning`:
    session_options'."""
    options = session_options(threads, spinning=spinning)
    if provider == "cpu":
        return ort.InferenceSession(str(path), options, providers=[CPU])
    if CUDA not in ort.get_available_providers():
        if provider == "cuda":
            raise ProviderError(
                "--provider cuda: this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
            )
        return create_session(path, "cpu", threads, spinning=spinning)
    preload_cuda_libraries()
    session: ort.InferenceSession | None
    try:
        cuda = {"device_id": "0", "user_compute_stream": str(stream or new_cuda_stream())}
        if cuda_graph:
            cuda["enable_cuda_graph"] = "1"
        session = ort.InferenceSession(str(path), options, providers=[(CUDA, cuda), CPU])
    except Exception as e:  # noqa: BLE001 - ORT raises several types when CUDA fails to start
        session, reason = None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    else:
        reason = "the session fell back to the CPU (CUDA libraries or device missing?)"
    if session is not None and session.get_providers()[0] == CUDA:
        return session
    if provider == "cuda":
        raise ProviderError(f"--provider cuda: {reason}")
    log.warning("--provider auto: CUDA unavailable (%s); using the CPU", reason)
    return create_session(path, "cpu", threads, spinning=spinning)


def new_cuda_stream() -> int:
    """A CUDA stream for a session to compute on (the arena's CUDA runtime creates it)."""
    return cuda_runtime().create_stream()


def compute_stream(session: ort.InferenceSession) -> int:
    """The CUDA stream a session computes on (0 on the CPU)."""
    if session.get_providers()[0] != CUDA:
        return 0
    return int(session.get_provider_options()[CUDA].get("user_compute_stream", 0))


def io_names(session: ort.InferenceSession) -> tuple[list[str], list[str]]:
    """The graph's input and output names, in order (checked against contract.io_name_problems)."""
    return [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """input_ids, attention_mask (1 = real) and position_ids (0 on padding), int64 (B, T), of
    left-padded sequences (tokenizer/padding.py's): the concat layout's batch (the arena's is right-padded)."""
    ids, mask, positions = padding.left_pad(seqs, pad_id)
    return np.array(ids, np.int64), np.array(mask, np.int64), np.array(positions, np.int64)


def empty_past(n_layers: int, n_heads: int, head_dim: int, batch: int, dtype: str) -> list[np.ndarray]:
    """A zero-length past (the prefill's), a key and a value per layer, (B, H, 0, D) each."""
    shape = (batch, n_heads, 0, head_dim)  # (B, H, 0, D)
    return [np.zeros(shape, NP_DTYPES[dtype]) for _ in range(2 * n_layers)]
