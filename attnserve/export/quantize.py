"""int8 dynamic quantization (ONNX Runtime, CPU provider) and its gate: held-out loss.

Quantized logits differ from float32 by design, so this gate compares what matters: the
held-out loss in bits per byte (within 2% of float32), and reports greedy agreement.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from ..runtime.ort_decoder import OrtDecoder

MAX_LOSS_RATIO = 1.02


def quantize_int8(src: Path, dst: Path) -> None:
    """Weights of MatMul/Gemm to int8, activations quantized on the fly."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    root.addFilter(without_preprocessing_advice)
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
    finally:
        root.removeFilter(without_preprocessing_advice)


def without_preprocessing_advice(record: logging.LogRecord) -> bool:
    """Drops ONNX Runtime's "Please consider to run pre-processing before quantization" (logged on the
    root logger on every call): its pre-processing is shape inference and graph optimization for
    static quantization; dynamic int8 of these MatMuls does not need it, and the gate measures the
    result. Everything else the quantizer logs passes."""
    return "pre-processing before quantization" not in record.getMessage()


def heldout_windows(ids: list[int], block: int, n_windows: int, bos_id: int | None) -> np.ndarray:
    """(N, block) evenly spaced windows of held-out token ids; each starts with BOS when prompts do."""
    width = block - 1 if bos_id is not None else block
    span = len(ids) - (width - 1)
    if span <= 0:
        raise ValueError(f"held-out text has {len(ids)} tokens, fewer than one window of {width}")
    starts = np.linspace(0, span - 1, num=min(n_windows, span)).astype(int)
    head = [] if bos_id is None else [bos_id]
    return np.array([[*head, *ids[s : s + width]] for s in starts], dtype=np.int64)


def nats(logits: np.ndarray, targets: np.ndarray) -> float:
    """Summed cross entropy of `targets` under `logits` (N, T, V), in nats."""
    logits = logits.astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return float((logz - picked).sum())


def runtime_bits_per_byte(runtime: OrtDecoder, windows: np.ndarray, byte_lengths: np.ndarray, batch: int = 8) -> float:
    """Held-out bits per byte of an exported graph (prefill only: the whole window at once); each
    target counts the UTF-8 bytes its token stands for."""
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        chunk = windows[i : i + batch]
        total += nats(runtime.logits(chunk[:, :-1]), chunk[:, 1:])
        count += int(byte_lengths[chunk[:, 1:]].sum())
    return total / count / math.log(2)


def int8_gate(
    float_runtime: OrtDecoder,
    int8_runtime: OrtDecoder,
    heldout: list[int],
    bos_id: int | None,
    byte_lengths: list[int],
    prompts: list[list[int]],
    steps: int,
    block: int = 128,
    n_windows: int = 32,
) -> dict:
    """Held-out loss of int8 vs float32 (enforced), greedy agreement (reported); `heldout` is token ids."""
    windows, lengths = heldout_windows(heldout, block + 1, n_windows, bos_id), np.asarray(byte_lengths)
    loss_f32 = runtime_bits_per_byte(float_runtime, windows, lengths)
    loss_int8 = runtime_bits_per_byte(int8_runtime, windows, lengths)
    ref, got = float_runtime.greedy(prompts, steps), int8_runtime.greedy(prompts, steps)
    agreement = float((ref == got).mean())
    ratio = loss_int8 / loss_f32
    return {
        "heldout_bits_per_byte_float32": loss_f32,
        "heldout_bits_per_byte_int8": loss_int8,
        "loss_ratio": ratio,
        "max_loss_ratio": MAX_LOSS_RATIO,
        "greedy_steps": steps,
        "greedy_token_agreement": agreement,
        "passed": ratio <= MAX_LOSS_RATIO,
    }
