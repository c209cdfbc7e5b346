"""The memory-bandwidth limit of a decode step: how many bytes of weights a token reads, and how fast
this machine reads memory, measured in the same run as the figure it bounds.

At batch 1 a decode step reads every weight once: a model cannot decode faster than read bandwidth
over those bytes. Tables that are only looked up (the token embedding's Gather, a position table)
are read a row at a time and do not count; everything else a node reads from the graph's weights
does (a tied head reads its transposed copy in full). Torch-free.

    python -m benchmarks.bandwidth [--threads 2] [--mib 1024] [MODEL_DIR ...]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np

LOOKUPS = ("Gather", "GatherBlockQuantized")  # ops that read one row of a table per token


def read_bandwidth(threads: int = 2, mib: int = 1024, repeats: int = 5) -> float:
    """Bytes a second this machine reads: `threads` threads each summing its part of a `mib`-MiB
    array (numpy releases the GIL), the best of `repeats` passes after one to warm the pages."""
    data = np.ones(mib * (1 << 20) // 8, dtype=np.float64)
    parts = np.array_split(data, threads)
    best = 0.0
    for attempt in range(repeats + 1):
        workers = [threading.Thread(target=np.sum, args=(part,)) for part in parts]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if attempt:
            best = max(best, data.nbytes / (time.perf_counter() - start))
    return best


def weight_bytes_per_token(model_dir: Path, model_file: str = "model.onnx") -> int:
    """Bytes of the graph's weights a decode step reads in full: every initializer a node other than
    a lookup reads (its raw bytes as stored)."""
    import onnx

    graph = onnx.load(str(Path(model_dir) / model_file)).graph
    sizes = {tensor.name: tensor_bytes(tensor) for tensor in graph.initializer}
    read = {name for node in graph.node if node.op_type not in LOOKUPS for name in node.input if name in sizes}
    return sum(sizes[name] for name in read)


def tensor_bytes(tensor) -> int:
    """A weight's bytes as ONNX Runtime holds them (4-bit blocks are stored packed in uint8)."""
    from onnx import helper

    if tensor.raw_data:
        return len(tensor.raw_data)
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help="model directories: their bytes a token and batch-1 limit")
    p.add_argument("--threads", type=int, default=2, help="reading threads (default: 2)")
    p.add_argument("--mib", type=int, default=1024, help="MiB read a pass (default: 1024)")
    args = p.parse_args(argv)
    bandwidth = read_bandwidth(args.threads, args.mib)
    models = {m: weight_bytes_per_token(Path(m)) for m in args.models}
    limits = {m: bandwidth / size for m, size in models.items()}
    print(json.dumps({"read_bytes_per_s": bandwidth, "weight_bytes_per_token": models, "tokens_per_s_limit": limits}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
