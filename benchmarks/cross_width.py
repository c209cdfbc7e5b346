"""An encoder-decoder's decode step by the width its cross-attention keys and values are bound with: the
exported decoder.onnx alone (no server), B rows, each row's self-attention cache bound in place as the
arena binds it (PAST positions held), its source's keys and values (right-padded, 3 to 47 positions a
row, masked past them) bound at each width in turn, the widths alternating run by run. Reports each
width's milliseconds a step, median (min-max) over the rounds, and its ratio to the context's width;
then one JSON object last. The served side of the same change is benchmarks/translation.py --tree-a.

    python -m benchmarks.cross_width --model runs/translation/model [--rows 64] [--widths 512,128,64,48] \\
        [--threads 2] [--rounds 12] [--out F.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from attnserve.report_stamp import Stamp
from attnserve.runtime import contract
from attnserve.runtime.ort_session import create_session
from benchmarks.serving import emit, spread

PAST = 24  # self-attention positions each row holds (a translation halfway through)
LONGEST_SOURCE = 48  # sources are 3 to LONGEST_SOURCE - 1 ids: every width here holds them


def binding(
    session: ort.InferenceSession, manifest: contract.Manifest, sources: np.ndarray, width: int, held: list
) -> ort.IOBinding:
    """A step's binding of rows with `sources` source ids each (rows,), their cross keys and values `width`
    positions wide; `held` keeps its arrays alive."""
    rng = np.random.default_rng(width)
    heads, dim, context, layers = manifest.n_kv_heads, manifest.head_dim, manifest.context_length, manifest.n_layers
    rows = sources.size
    bound = session.io_binding()
    bound.bind_cpu_input(contract.INPUT_IDS, np.full((rows, 1), 5, np.int64))
    bound.bind_cpu_input(contract.ATTENTION_MASK, np.ones((rows, PAST + 1), np.int64))
    bound.bind_cpu_input(contract.POSITION_IDS, np.full((rows, 1), PAST, np.int64))
    bound.bind_cpu_input(contract.ENCODER_ATTENTION_MASK, (np.arange(width)[None] < sources[:, None]).astype(np.int64))
    names = zip(contract.past_names(layers, "decoder"), contract.present_names(layers, "decoder"))
    for past, present in names:
        cache = np.zeros((rows, heads, context, dim), np.float32)
        cache[:, :, :PAST] = rng.standard_normal((rows, heads, PAST, dim))
        held.append(cache)
        bound.bind_input(past, "cpu", 0, np.float32, list(cache.shape), cache.ctypes.data)
        bound.bind_output(present, "cpu", 0, np.float32, list(cache.shape), cache.ctypes.data)
    for name in contract.past_names(layers, "encoder"):
        source = rng.standard_normal((rows, heads, width, dim)).astype(np.float32)
        held.append(source)
        bound.bind_input(name, "cpu", 0, np.float32, list(source.shape), source.ctypes.data)
    for output in (contract.LOGITS, contract.NEXT_TOKEN):
        bound.bind_output(output, "cpu")
    return bound


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="an exported encoder-decoder's directory (float32)")
    p.add_argument("--rows", type=int, default=64, help="rows a step (default: 64, 16 requests of 4 beams)")
    p.add_argument("--widths", default="512,128,64,48", help="source positions bound, the first the baseline")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=12, help="runs of each width, alternating (default: 12)")
    p.add_argument("--out", help="write the JSON result here")
    args = p.parse_args(argv)
    stamp = Stamp.start(provider="cpu")
    model = Path(args.model)
    manifest = contract.read_manifest(model, verify=False)
    if not manifest.seq2seq or manifest.dtype != "float32":
        p.error(f"--model {model}: needs a float32 encoder-decoder's export")
    widths = [int(w) for w in args.widths.split(",")]
    if any(not LONGEST_SOURCE <= w <= manifest.context_length for w in widths):
        p.error(f"--widths: each from {LONGEST_SOURCE} to the context's {manifest.context_length}")
    session = create_session(model / contract.DECODER_FILE, "cpu", args.threads)
    held: list[np.ndarray] = []
    sources = np.random.default_rng(0).integers(3, LONGEST_SOURCE, args.rows)  # every width the same rows
    bindings = {w: binding(session, manifest, sources, w, held) for w in widths}
    times: dict[int, list[float]] = {w: [] for w in widths}
    for round_ in range(args.rounds + 2):  # the first two: warm-up
        for width in widths if round_ % 2 == 0 else widths[::-1]:
            start = time.perf_counter()
            session.run_with_iobinding(bindings[width])
            if round_ >= 2:
                times[width].append((time.perf_counter() - start) * 1e3)
    base = times[widths[0]]
    results = []
    for width in widths:
        ms, ratio = spread(times[width]), spread([t / b for t, b in zip(times[width], base)])
        results.append({"width": width, "ms": ms, "over_first": ratio})
        print(
            f"width {width:4}: {ms['median']:6.1f} ms a step ({ms['min']:.1f}-{ms['max']:.1f}), "
            f"{ratio['median']:.2f}x width {widths[0]}'s"
        )
    report = {
        "model": str(model),
        "rows": args.rows,
        "past": PAST,
        "threads": args.threads,
        "rounds": args.rounds,
        "widths": results,
        "stamp": stamp.finish(),
    }
    return emit(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
