"""Weight quantization of a float32 export (ONNX Runtime, CPU provider) and its gate: held-out loss.

int8: int8 weights (one scale per output column) times activations quantized on the fly, one scale per
row (int8_rows.py): a row's result does not depend on its batch, unlike ONNX Runtime's quantize_dynamic,
whose one scale per tensor spans every row of the batch.
int4: weight-only blocks (MatMulNBits; GatherBlockQuantized for the token embedding): each block of
`block_size` weights along the input axis shares one float scale, symmetric (the output head's blocks
are `head_block_size`); `accuracy_level` is the precision MatMulNBits computes in on the CPU (4: int8
activations, the fastest; 0: unset).

Quantized logits differ from float32 by design, so this gate compares what matters: the held-out
loss in bits per byte (within each kind's ratio of float32's), and reports greedy agreement.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runtime import contract
from ..runtime.ort_decoder import OrtDecoder
from .int8_rows import quantize_rows

MAX_LOSS_RATIO = {"int8": 1.02, "int4": 1.05}  # held-out bits per byte, quantized / float32
INT4_BLOCK_SIZES = (16, 32, 64, 128, 256)  # MatMulNBits' and GatherBlockQuantized's: powers of two, 16 up
ACCURACY_LEVELS = (0, 1, 2, 3, 4)  # MatMulNBits' accuracy_level: unset, float32, float16, bfloat16, int8


@dataclass(frozen=True)
class Int4Options:
    """MatMulNBits' blocks along the input axis (the output head's of its own: coarser blocks made it 0.90x
    a batch-1 step on GPT-2 124M for no measured loss, docs/design/decisions/int4-defaults.md) and what it
    computes in."""

    block_size: int = 32
    accuracy_level: int = 4
    head_block_size: int = 128


INT4_DEFAULTS = Int4Options()


def quantize(kind: str, src: Path, dst: Path, int4: Int4Options = INT4_DEFAULTS) -> None:
    """The graph at `src` quantized to `kind` at `dst`."""
    if kind == "int8":
        quantize_int8(src, dst)
    else:
        quantize_int4(src, dst, int4)


def quantize_int4(src: Path, dst: Path, options: Int4Options) -> None:
    """Every MatMul by a weight to MatMulNBits and the token embedding's Gather to GatherBlockQuantized,
    4-bit symmetric blocks of `options.block_size` along the input axis (the output head's of
    `options.head_block_size`). A tied output head (a MatMul by the transposed embedding) is given the
    transposed weight first, so that it is quantized too: at a large vocabulary it is the biggest matrix
    a step reads."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = load_with_weight_transposes_folded(src)
    head = head_matmul(model.graph) if options.head_block_size != options.block_size else None
    passes = [(options.block_size, {"nodes_to_exclude": [head.name]} if head is not None else {})]
    if head is not None:
        passes.append((options.head_block_size, {"nodes_to_include": [head.name]}))
    for block_size, nodes in passes:
        quantizer = MatMulNBitsQuantizer(
            model,
            bits=4,
            block_size=block_size,
            is_symmetric=True,
            accuracy_level=options.accuracy_level,
            op_types_to_quantize=("MatMul", "Gather"),
            **nodes,
        )
        with quiet_quantizer():
            quantizer.process()
        model = quantizer.model.model
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)


def head_matmul(graph):
    """The MatMul by a weight that makes the graph's logits (through Casts and Reshapes), named (a name of
    its own if it had none: the quantizer picks nodes by name); None if there is none."""
    weights = {tensor.name for tensor in graph.initializer}
    producer = {output: node for node in graph.node for output in node.output}
    node = producer.get(contract.LOGITS)
    while node is not None and node.op_type in ("Cast", "Reshape", "Identity"):
        node = producer.get(node.input[0])
    if node is None or node.op_type != "MatMul" or node.input[1] not in weights:
        return None
    node.name = node.name or "attnserve_head"
    return node


def load_with_weight_transposes_folded(src: Path):
    """The ONNX model at `src`, its weights' Transposes folded (fold_weight_transposes): what both
    quantizers start from, so that a tied head is quantized too."""
    import onnx

    model = onnx.load(str(src))
    fold_weight_transposes(model.graph)
    return model


def fold_weight_transposes(graph) -> int:
    """Each Transpose of a 2-D weight that only MatMuls read becomes a weight of its own, transposed
    (the tied head's embedding.T); the number folded."""
    from onnx import numpy_helper

    weights = {tensor.name: tensor for tensor in graph.initializer}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    folded = []
    for node in graph.node:
        if node.op_type != "Transpose" or node.input[0] not in weights or len(weights[node.input[0]].dims) != 2:
            continue
        if not all(
            reader.op_type == "MatMul" and reader.input[1] == node.output[0] for reader in readers[node.output[0]]
        ):
            continue
        array = numpy_helper.to_array(weights[node.input[0]]).T
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array), node.output[0]))
        folded.append(node)
    for node in folded:
        graph.node.remove(node)
    return len(folded)


def quantize_int8(src: Path, dst: Path) -> None:
    """Every MatMul by a weight to the row-quantized int8 product (int8_rows.quantize_rows); a tied
    head's transposed embedding is given a weight of its own first, so that the head is quantized too."""
    import onnx

    model = load_with_weight_transposes_folded(src)
    quantize_rows(model)
    onnx.save(model, str(dst))


@contextmanager
def quiet_quantizer() -> Iterator[None]:
    """MatMulNBitsQuantizer without its INFO line for every node it quantizes or skips, nor its warning
    that raising the graph's opset to 21 (for int4's data type) may not give a valid model: the gates
    that follow run the graph it wrote, and an invalid one fails them."""
    chatty = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = chatty.level
    chatty.setLevel(logging.WARNING)
    chatty.addFilter(without_opset_warning)
    try:
        yield
    finally:
        chatty.setLevel(level)
        chatty.removeFilter(without_opset_warning)


def without_opset_warning(record: logging.LogRecord) -> bool:
    """Drops "... Force to update it to opset 21, but the generated model may not be a valid model.";
    everything else the quantizer logs passes."""
    return "may not be a valid model" not in record.getMessage()


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


def quantized_gate(
    kind: str,
    float_runtime: OrtDecoder,
    quantized_runtime: OrtDecoder,
    heldout: list[int],
    bos_id: int | None,
    byte_lengths: list[int],
    prompts: list[list[int]],
    steps: int,
    block: int = 128,
    n_windows: int = 32,
) -> dict:
    """Held-out loss of the `kind` graph vs float32 (enforced), greedy agreement (reported); `heldout`
    is token ids."""
    windows, lengths = heldout_windows(heldout, block + 1, n_windows, bos_id), np.asarray(byte_lengths)
    loss_f32 = runtime_bits_per_byte(float_runtime, windows, lengths)
    loss_quantized = runtime_bits_per_byte(quantized_runtime, windows, lengths)
    ref, got = float_runtime.greedy(prompts, steps), quantized_runtime.greedy(prompts, steps)
    agreement = float((ref == got).mean())
    ratio = loss_quantized / loss_f32
    return {
        "heldout_bits_per_byte_float32": loss_f32,
        f"heldout_bits_per_byte_{kind}": loss_quantized,
        "loss_ratio": ratio,
        "max_loss_ratio": MAX_LOSS_RATIO[kind],
        "greedy_steps": steps,
        "greedy_token_agreement": agreement,
        "passed": ratio <= MAX_LOSS_RATIO[kind],
    }
