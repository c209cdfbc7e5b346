"""The quantized MatMul kernels alone at batch 1: ONNX Runtime's MatMulNBits (4 and 8 bits, by block size
and accuracy level) and the int8 export's MatMulIntegerToFloat, against this machine's read bandwidth.

Each case is a graph of copies of one node, each with weights of its own, all fed the same row: a run
reads every copy's weights, as a decode step reads each layer's, so that together they are larger than
the caches (`--cold-mib`) and come from memory; a node's time is the run's over the copies. With
`--cold-mib 0`, one node, its weights in the caches after the first run. Random weights: a kernel's
time does not depend on their values.

    python -m benchmarks.kernel_nbits --shapes 768x3072,3072x768,768x50257 --threads 1,2 \\
        --out docs/reports/kernel-nbits.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from attnserve.report_stamp import Stamp, write_report
from benchmarks.bandwidth import read_bandwidth

# (kind, bits, block size, accuracy level): MatMulNBits as the int4 export writes it and its options; the
# int8 export's kernel (activations by rows, MatMulIntegerToFloat) has no blocks
CASES = (
    ("nbits", 4, 32, 4),
    ("nbits", 4, 64, 4),
    ("nbits", 4, 128, 4),
    ("nbits", 4, 32, 1),
    ("nbits", 8, 32, 4),
    ("nbits", 8, 128, 4),
    ("int8 rows", 8, 0, 0),
)


def graph(kind: str, k: int, n: int, bits: int, block: int, accuracy: int, copies: int) -> tuple[bytes, int]:
    """A graph of `copies` nodes of one kernel over one input row (1, K): its bytes, and one node's weight
    bytes."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, outputs = [], [], []
    for c in range(copies):
        if kind == "nbits":
            blob = rng.integers(0, 256, (n, k // block, block * bits // 8), dtype=np.uint8)
            scales = rng.uniform(0.001, 0.01, n * (k // block)).astype(np.float32)
            tensors = [numpy_helper.from_array(blob, f"b{c}"), numpy_helper.from_array(scales, f"s{c}")]
            attrs: dict = dict(K=k, N=n, bits=bits, block_size=block, accuracy_level=accuracy)
            names = ["a", f"b{c}", f"s{c}"]
            nodes.append(helper.make_node("MatMulNBits", names, [f"y{c}"], domain="com.microsoft", **attrs))
        else:  # the int8 export's: uint8 rows around 128 times int8 weights, a scale per column
            b = rng.integers(-127, 128, (k, n), dtype=np.int8)
            tensors = [
                numpy_helper.from_array(b, f"b{c}"),
                numpy_helper.from_array(rng.uniform(0.001, 0.01, n).astype(np.float32), f"s{c}"),
            ]
            names = ["a", f"b{c}", "a_scale", f"s{c}", "a_zero"]
            nodes.append(helper.make_node("MatMulIntegerToFloat", names, [f"y{c}"], domain="com.microsoft"))
        weights += tensors
        outputs.append(helper.make_tensor_value_info(f"y{c}", TensorProto.FLOAT, [1, n]))
    if kind != "nbits":
        weights += [
            numpy_helper.from_array(np.array([0.02], np.float32), "a_scale"),
            numpy_helper.from_array(np.array([128], np.uint8), "a_zero"),
        ]
    a_type = TensorProto.FLOAT if kind == "nbits" else TensorProto.UINT8
    row = [helper.make_tensor_value_info("a", a_type, [1, k])]
    model = helper.make_model(
        helper.make_graph(nodes, "kernel", row, outputs, weights),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 8
    return model.SerializeToString(), sum(len(t.raw_data) for t in weights[:2])  # the first node's


def node_us(blob: bytes, kind: str, k: int, copies: int, threads: int, runs: int) -> float:
    """Microseconds a node: the median run over the copies, after a warm-up, idle threads spinning (as
    the server's large models run)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.log_severity_level = 3
    session = ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    row = rng.uniform(-1, 1, (1, k)).astype(np.float32) if kind == "nbits" else rng.integers(0, 256, (1, k), np.uint8)
    feed = {"a": row}
    for _ in range(3):
        session.run(None, feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / copies * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="768x3072,3072x768,768x50257", help="K x N of each MatMul")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--cold-mib", type=int, default=256, help="weights a run reads at least (0: one node, cached)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--out", default=None, help="JSON (and its Markdown beside it)")
    args = p.parse_args(argv)
    stamp = Stamp.start("CPUExecutionProvider")
    threads = [int(t) for t in args.threads.split(",")]
    bandwidth = {t: read_bandwidth(t) for t in threads}
    rows = []
    for shape in args.shapes.split(","):
        k, n = (int(x) for x in shape.split("x"))
        for kind, bits, block, accuracy in CASES:
            probe, one = graph(kind, k, n, bits, block, accuracy, 1)
            copies = max(1, -(-args.cold_mib * (1 << 20) // one)) if args.cold_mib else 1
            blob = graph(kind, k, n, bits, block, accuracy, copies)[0] if copies > 1 else probe
            for t in threads:
                us = node_us(blob, kind, k, copies, t, args.runs)
                rate = one / us * 1e6
                row = dict(k=k, n=n, kind=kind, bits=bits, block=block, accuracy=accuracy, threads=t)
                row |= dict(copies=copies, weight_bytes=one, us=us, bytes_per_s=rate, of_bandwidth=rate / bandwidth[t])
                rows.append(row)
                print(
                    f"{k} x {n} {kind} {bits} bits block {block} accuracy {accuracy}, {t} threads: {us:.0f} us, "
                    f"{one / 1e6:.2f} MB, {rate / 1e9:.1f} GB/s ({rate / bandwidth[t]:.0%})",
                    flush=True,
                )
    result = {"settings": vars(args), "read_bytes_per_s": bandwidth, "rows": rows, "stamp": stamp.finish()}
    if args.out:
        write_report(args.out, result, None, "Quantized MatMul kernels at batch 1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
