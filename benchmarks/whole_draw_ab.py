"""The host's compiled draw (attnserve/engine/whole_draw.c) of two checkouts against each other, in one
process: each side's C file compiled here as setuptools builds it (the interpreter's CC and CFLAGS, -O3,
-shared), both libraries loaded with ctypes and their batch draw (whole_draws_logits) called with each
one's own arguments (one thread; a tree whose C file takes a bucket buffer, before d6897ae, is passed one),
the sides alternating call by call. Per kind, R rows of V float32 logits: `top_p_flat`
(temperature 0.8, top-p 0.95 over values with no likely ids, as a model with random weights gives),
`top_p_banned` (the same with one id banned, at -inf, as ignore_eos or min_tokens leave EOS), `top_p` (top-p
over a few likely ids and a long tail) and `whole` (temperature 0.7, every id). Before
each call a sweep of 128 MB evicts the rows from the caches (--warm: no sweep), as a decode step does.
With --helper b (or a), that side's library weighs each long row's second part on its helper thread (a
tree with a helper, from its introduction): woken LEAD before the call, as burst.BurstDraws wakes it ahead
of the engine's own work before a step's first draw, and rested after it; the wake's and the rest's calls
are timed with the draw's. Otherwise every row is read by the calling thread alone.
Reports each side's microseconds a row, median (min-max) over the rounds, b/a, and whether the two
sides picked the same ids every time; then one JSON object last.

    git worktree add /tmp/before COMMIT
    python -m benchmarks.whole_draw_ab --tree-a /tmp/before [--tree-b .] [--vocab 50257] [--rows 16] \\
        [--rounds 40] [--kinds top_p_flat,top_p,whole] [--warm] [--helper b] [--out F.json]

The helper against none, one tree on both sides, a row a call:

    python -m benchmarks.whole_draw_ab --tree-a . --rows 1 --helper b
"""

from __future__ import annotations

import argparse
import ctypes
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from attnserve.report_stamp import Stamp
from benchmarks.serving import ab_kind, emit

HERE = Path(__file__).resolve().parent.parent
SOURCE = Path("attnserve/engine/whole_draw.c")
# each kind's temperature and top-p
KINDS = {"top_p_flat": (0.8, 0.95), "top_p_banned": (0.8, 0.95), "top_p": (0.8, 0.95), "whole": (0.7, 1.0)}
SWEEP = 16 << 20  # float64s: 128 MB
LEAD = 0.0002  # s: from the helper's wake to the draw (the engine's Python before a step's first draw: ~0.1 ms)


def build(tree: Path, out: Path) -> tuple[ctypes.CDLL, bool, bool]:
    """`tree`'s whole_draw.c compiled as setuptools compiles the extension, loaded (draws_of calls it), whether
    its draws take a bucket buffer (an int32 per id, before the members'), and whether they take `share` (the
    helper thread's, last)."""
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    flags = shlex.split(sysconfig.get_config_var("CFLAGS") or "") + shlex.split(
        sysconfig.get_config_var("CCSHARED") or ""
    )
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        [*compiler, *flags, "-O3", "-shared", f"-I{include}", str(tree / SOURCE), "-o", str(out)], check=True
    )
    library = ctypes.CDLL(str(out))
    library.whole_draws_logits.restype = None
    text = (tree / SOURCE).read_text()
    return library, "int32_t *buckets" in text, "int32_t *members, int64_t *ids, int share" in text


def buffers_for(vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The draws' buffers for rows of `vocab` ids, made once and shared by the sides (as whole_draw.BUFFERS
    keeps a thread's): the weights (float64), a bucket per id and the crossing's ids (int32 each)."""
    return np.empty(vocab), np.empty(vocab, np.int32), np.empty(vocab, np.int32)


def draws_of(
    side: tuple[ctypes.CDLL, bool, bool],
    scratch: tuple[np.ndarray, np.ndarray, np.ndarray],
    logits: list[np.ndarray],
    *per_row: np.ndarray,
    helped: bool = False,
) -> np.ndarray:
    """whole_draws_logits of a side's library over float32 rows (V,) each, by their temperature, min-p, top-p
    and uniform number (n,) each, in `scratch` (buffers_for): its ids (n,), -1 where it leaves a row to
    numpy. `helped`: the library's helper thread (woken by the caller) lent each row's second part, rested
    after."""
    library, takes_buckets, takes_share = side
    n, (weights, buckets, members) = len(logits), scratch
    pointers = np.array([row.ctypes.data for row in logits], np.uintp)
    ids = np.empty(n, np.int64)
    buffers = [weights, buckets, members] if takes_buckets else [weights, members]
    arguments = [np.ascontiguousarray(a, np.float64) for a in per_row]
    library.whole_draws_logits(
        ctypes.c_void_p(pointers.ctypes.data),
        ctypes.c_int64(n),
        ctypes.c_int64(logits[0].size),
        *(ctypes.c_void_p(a.ctypes.data) for a in [*arguments, *buffers, ids]),
        *([ctypes.c_int(helped)] if takes_share else []),
    )
    if helped:
        library.whole_draw_rest()
    return np.where(ids < 0, -1, ids)


def rows_of(kind: str, rows: int, vocab: int, rng: np.random.Generator) -> list[np.ndarray]:
    logits = rng.normal(0, 1, (rows, vocab)).astype(np.float32)
    if kind == "top_p":
        for row in logits:
            row[rng.integers(0, vocab, 20)] += rng.uniform(6, 12)
    if kind == "top_p_banned":
        logits[:, 0] = -np.inf
    return list(logits)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree-a", required=True, help="side a's checkout (e.g. a git worktree of the commit before)")
    p.add_argument("--tree-b", default=str(HERE), help="side b's checkout (default: this one)")
    p.add_argument("--vocab", type=int, default=50257, help="ids a row (default: GPT-2's 50,257)")
    p.add_argument("--rows", type=int, default=16, help="rows a call (default: 16)")
    p.add_argument("--rounds", type=int, default=40, help="calls of each side per kind, alternating (default: 40)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--warm", action="store_true", help="no cache sweep before a call")
    p.add_argument("--helper", choices=("a", "b"), help="the side whose rows' second parts go to its helper thread")
    p.add_argument("--out", help="write the JSON result here")
    args = p.parse_args(argv)
    stamp = Stamp.start(provider="cpu")
    sides = {}
    with tempfile.TemporaryDirectory() as work:
        for side, tree in (("a", args.tree_a), ("b", args.tree_b)):
            sides[side] = build(Path(tree), Path(work) / f"{side}.so")
    if args.helper and not sides[args.helper][2]:
        p.error(f"--helper {args.helper}: that tree's draw has no helper thread")
    if args.helper:
        sides[args.helper][0].whole_draw_share(1)
    rng = np.random.default_rng(0)
    sweep, scratch = np.ones(SWEEP), buffers_for(args.vocab)
    results = []
    for kind in args.kinds.split(","):
        temperature, top_p = KINDS[kind]
        logits = rows_of(kind, args.rows, args.vocab, rng)
        per_row: dict[str, list[float]] = {"a": [], "b": []}
        same = True
        for round_ in range(args.rounds + 2):  # the first two: warm-up
            uniform = rng.random(args.rows)
            picked = {}
            for side in ("a", "b") if round_ % 2 == 0 else ("b", "a"):
                if not args.warm:
                    sweep += 1.0
                woken = 0.0
                if side == args.helper:
                    start = time.perf_counter()
                    sides[side][0].whole_draw_wake()
                    woken = time.perf_counter() - start
                    time.sleep(LEAD)
                start = time.perf_counter() - woken
                picked[side] = draws_of(
                    sides[side],
                    scratch,
                    logits,
                    np.full(args.rows, temperature),
                    np.zeros(args.rows),
                    np.full(args.rows, top_p),
                    uniform,
                    helped=side == args.helper,
                )
                if round_ >= 2:
                    per_row[side].append((time.perf_counter() - start) * 1e6 / args.rows)
            same &= bool((picked["a"] == picked["b"]).all())
        results.append(ab_kind(kind, per_row, same))
    report = {
        "trees": {"a": args.tree_a, "b": args.tree_b},
        "vocab": args.vocab,
        "rows": args.rows,
        "rounds": args.rounds,
        "warm": args.warm,
        "helper": args.helper,
        "kinds": results,
        "stamp": stamp.finish(),
    }
    return emit(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
