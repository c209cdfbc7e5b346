"""The batched logits pass: one run of a small ONNX graph over a decode step's logits where they are.

The graphs (logits_pass.<width>.<dtype>.onnx beside this file, written by export/logits_pass_graph.py)
run on the model's own provider, on the same CUDA stream as its session, fed the step's logits
buffer by IO binding (nothing is copied to the host first). For each row it is asked about, a graph
applies the row's PassRow (seam.py: penalties, bias and bans, temperature, min-p, top-k, top-p,
greedy or a draw) and brings back only the token, its log-probability and the top ids: a few bytes
a row instead of the row. Which graph: a row that draws from its whole distribution (no top-k,
top-p or min-p), the whole one; every other row the narrow one, which looks at fewer ids and costs
less, and, where it cannot pick the row exactly, the wide one (a vocabulary of at most 4,096 ids:
the row one, its head over the whole row); a sampling row whose min-p or top-p keep more ids than
those look at (a flat distribution), the nucleus one, which finds top-p's edge over the whole row
without sorting it (on CUDA and under `on`: on the CPU the host's pick costs less). A row no graph
can pick exactly comes back as not picked; its runner reads that row and the engine picks it on the
host by the same steps (engine/sampling.py, the pass's oracle). Knows nothing of requests or
scheduling.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..engine.seam import FEW_IDS_FROM, PassRow, Pick, compiled_draw, scores_compiled
from .arena import Device
from .ort_session import create_session

HERE = Path(__file__).resolve().parent
# What picking a row costs, measured in place (docs/design/decisions/logits-pass.md: after a model step, whose
# weights have swept the caches; the project's 2-vCPU Xeon, one thread): on the host, a cost a row and one an
# id by the work its PassRow asks; in the pass, a run's fixed cost, then a cost per row and per id. On the CPU
# provider a row is passed only where that saves time; on CUDA every row is (a row picked on the host is a
# row across the bus).
HOST_COST = {  # work: (us a row, ns an id)
    "argmax": (10.0, 0.7),  # a greedy row with bans or a bias: a copy and an argmax
    "logprobs": (35.0, 3.2),  # the sum of the weights over the row, then the likeliest ids' alone
    "top_k": (60.0, 0.7),  # a top-k draw, no log-probability: the likeliest ids' alone (engine/likeliest.py)
    "draw": (31.0, 3.2),  # sampling: a whole-row draw, or the few ids min-p keeps
    "top_p": (71.0, 7.1),  # sampling under top-p alone: its edge found over the whole row
    "beam": (0.0, 15.0),  # a beam's row: the search's log-softmax and its best continuations
    "penalty": (7.0, 0.25),  # the repetition, presence and frequency penalties: one more copy of the row
}
# the draws of rows with no top-k and no top ids where the compiled whole-row draw runs (engine/whole_draw.c;
# numpy's above otherwise): in place against numpy's in the same rounds, 0.86x and 0.73x at 2,048 and 50,257
# ids for a whole-row draw, 0.50x and 0.56x under top-p, applied to the figures above
COMPILED_DRAW_COST = {"draw": (28.0, 2.2), "top_p": (34.0, 4.1)}
# a greedy row's log-probabilities where the compiled scores run (sampling.compiled_greedy; seam.scores_compiled's
# rows): in place against numpy's in the same rounds (GPT-2 124M int8, 2 threads, logprobs 5), 163 us a row
# against 392 at one row and 80 against 182 at 16 (shared out between two threads): 0.43x, applied to the above
COMPILED_SCORES_COST = {"logprobs": (15.0, 1.4)}
# a top-k draw's few ids where the compiled top-k runs (sampling.pick_from_few's rows with no penalty and no bias
# but bans: whole_draw.top_k): in place against numpy's (GPT-2 124M int8, 2 threads, top_k 50, one row), 96 us a
# row against 250: 0.38x, applied to the above
COMPILED_TOP_K_COST = {"top_k": (23.0, 0.27)}
PASS_RUN_US = 500.0
PASS_ROW_US = 43.0
PASS_NS_PER_ID = 1.8
OUTPUTS = ("token", "logprob", "top_ids", "top_logprobs", "exact", "widen")


# a row that filters (or is greedy) goes through the narrow pass, and one it cannot pick through the wide one;
# a row that draws from its whole distribution, through the whole pass
# (a vocabulary of at most WIDE_GROUPS groups of ROW_ALIGN ids goes through the row pass instead: its head over
# the whole row, which the wide pass would look at whole anyway, at less cost); a sampling row with no top-k
# that those could not pick, through the nucleus pass
NARROW, WIDE, WHOLE, ROW, NUCLEUS = WIDTHS = ("narrow", "wide", "whole", "row", "nucleus")
MASK = "mask"  # a grammar's rows go through it first: the ids their grammar does not allow at -inf
WIDE_GROUPS, ROW_ALIGN = 256, 16


def graph_file(dtype: str, width: str = "narrow") -> Path:
    """The pass for logits of `dtype` (float32, float16, bfloat16) that looks at `width` of a row."""
    return HERE / f"logits_pass.{width}.{dtype}.onnx"


def pass_inputs(rows: Sequence[int], plan: Sequence[PassRow]) -> dict[str, np.ndarray]:
    """The graph's inputs besides the logits: each planned row's index in the logits and its PassRow,
    the sparse biases padded with (0, 0.0), which adds nothing; the seen ids padded with a seen id
    (penalized twice to the same value) or 0 where the row penalizes none (its penalty is 1); the
    occurred ids padded with (0, count 0), which subtracts nothing."""
    width = max((len(p.bias) for p in plan), default=0) or 1
    bias_ids = np.zeros((len(plan), width), np.int64)
    bias_values = np.zeros((len(plan), width), np.float32)
    for i, p in enumerate(plan):
        if p.bias:
            ids, values = zip(*p.bias)
            bias_ids[i, : len(ids)], bias_values[i, : len(ids)] = ids, values
    seen = np.zeros((len(plan), max((p.seen.size for p in plan), default=0) or 1), np.int64)
    occurred = np.zeros((len(plan), max((p.occurred.size for p in plan), default=0) or 1), np.int64)
    counts = np.zeros(occurred.shape, np.float32)
    for i, p in enumerate(plan):
        if p.seen.size:
            seen[i, : p.seen.size], seen[i, p.seen.size :] = p.seen, p.seen[0]
        occurred[i, : p.occurred.size], counts[i, : p.counts.size] = p.occurred, p.counts
    column = lambda values, dtype: np.array(values, dtype)
    return {
        "rows": column(rows, np.int64),
        "temperature": column([p.temperature for p in plan], np.float32),
        "top_k": column([p.top_k for p in plan], np.int64),
        "top_p": column([p.top_p for p in plan], np.float32),
        "min_p": column([p.min_p for p in plan], np.float32),
        "uniform": column([p.uniform for p in plan], np.float32),
        "top": column([p.top for p in plan], np.int64),
        "bias_ids": bias_ids,
        "bias_values": bias_values,
        "repetition": column([p.repetition for p in plan], np.float32),
        "presence": column([p.presence for p in plan], np.float32),
        "frequency": column([p.frequency for p in plan], np.float32),
        "seen_ids": seen,
        "occurred_ids": occurred,
        "occurred_counts": counts,
    }


def host_us(row: PassRow, vocab: int) -> float:
    """Microseconds to pick `row` on the host (HOST_COST; COMPILED_DRAW_COST's draws, COMPILED_SCORES_COST's
    greedy log-probabilities and COMPILED_TOP_K_COST's top-k draws where those run): a draw (top-k's from its
    likeliest ids where it asks for no log-probability, top-p alone's edge found over the whole row), logprobs,
    a beam's candidates, or a greedy row with bans or a bias (a copy and an argmax); penalties copy the row once
    more, but in a compiled draw with no grammar's mask (sampling.processed_draw: the ids they change patched in
    as the row is read)."""
    if row.temperature > 0 and 0 < row.top_k < vocab:
        work = "draw" if row.top or vocab < FEW_IDS_FROM else "top_k"
    elif row.temperature > 0:
        work = "top_p" if row.top_p < 1.0 and row.min_p <= 0.0 else "draw"
    else:
        work = "beam" if row.alone else "logprobs" if row.top else "argmax"
    compiled = compiled_draw() and not row.top and not 0 < row.top_k < vocab  # the compiled draw's rows
    patched = compiled and row.temperature > 0 and row.allowed is None
    works = [work, "penalty"] if row.penalized and not patched else [work]
    costs = HOST_COST
    if compiled:
        costs = costs | COMPILED_DRAW_COST
    elif compiled_draw() and scores_compiled(row):  # the compiled scores' rows
        costs = costs | COMPILED_SCORES_COST
    elif compiled_draw() and work == "top_k" and row.bans_only:  # the compiled top-k's rows
        costs = costs | COMPILED_TOP_K_COST
    return sum(costs[w][0] + costs[w][1] * vocab / 1000 for w in works)


def draws_whole(row: PassRow, vocab: int) -> bool:
    """The row draws from its whole distribution: it samples, and no top-k, top-p or min-p keeps less."""
    return row.temperature > 0 and row.top_p >= 1.0 and row.min_p <= 0.0 and not 0 < row.top_k < vocab


def fits_nucleus(row: PassRow, vocab: int) -> bool:
    """The nucleus pass may pick the row: it samples, and no top-k keeps less than the whole row."""
    return row.temperature > 0 and not 0 < row.top_k < vocab


def worth_passing(plan: Sequence[PassRow], vocab: int, device: Device, mode: str = "auto") -> list[bool]:
    """Which rows of `plan` the pass should pick (`mode` auto; on: all; off: none): on CUDA all; on the CPU
    those whose host work costs more than their share of the pass, if together they save more than the
    run's fixed cost, and never a row with a grammar's mask (its mask graph's run costs more than the
    host's masked pick). A row that draws from its whole distribution, or is to be judged `alone` (a
    beam's), is passed where that saves time alone, whatever shares its batch: the pass's float32 sums
    may part from the host's float64 at an id's edge, so such a row must take one side whatever its
    batch."""
    if mode != "auto" or device.kind != "cpu":
        return [mode != "off"] * len(plan)
    share = PASS_ROW_US + PASS_NS_PER_ID * vocab / 1000
    saving = [host_us(row, vocab) - share if row.allowed is None else 0.0 for row in plan]
    alone = [row.alone or draws_whole(row, vocab) for row in plan]
    together = sum(s for s, by_itself in zip(saving, alone) if s > 0 and not by_itself) > PASS_RUN_US
    return [s > PASS_RUN_US if by_itself else together and s > 0 for s, by_itself in zip(saving, alone)]


class LogitsPass:
    """The pass on one device, for logits of one dtype; `mode` says which rows it picks (worth_passing)."""

    def __init__(self, dtype: str, device: Device, threads: int = 0, mode: str = "auto"):
        """A session of each width's graph on `device` (the model's), with `threads` intra-op threads."""
        provider = "cpu" if device.kind == "cpu" else "cuda"
        self.sessions = {
            width: create_session(graph_file(dtype, width), provider, threads, device.stream)
            for width in (*WIDTHS, MASK)
        }
        self.device, self.mode = device, mode
        # the nucleus pass costs more than the host's pick on the CPU for a batch (16 rows of 50,257 ids: 1.1 ms
        # a row against 0.7): there only `on` takes it
        self.nucleus = device.kind != "cpu" or mode == "on"
        # on the CPU under auto, a row the pass could not pick goes to the host for a while (arena_runner's
        # HOLD_BACK): a flat row under top-p would cost the pass's share, then the host's pick, every step
        self.holds_back = device.kind == "cpu" and mode == "auto"

    def worth(self, plan: Sequence[PassRow], vocab: int) -> list[bool]:
        """Which rows of `plan` this pass should pick (worth_passing)."""
        return worth_passing(plan, vocab, self.device, self.mode)

    def run(self, logits: ort.OrtValue | np.ndarray, rows: Sequence[int], plan: Sequence[PassRow]) -> list[Pick | None]:
        """Rows `rows` of `logits` (slots, 1, V), each picked by its PassRow in `plan`: a Pick, or None
        where no pass could pick it exactly (pick it on the host). A row that draws from its whole
        distribution goes through the whole pass; every other through the narrow pass, and those it
        cannot pick exactly through the wide one (a vocabulary of at most WIDE_GROUPS groups, through the
        row pass instead); a sampling row with no top-k that neither picked (min-p or top-p keep more ids
        than they look at: a flat distribution), through the nucleus pass, where that is taken. The rows
        with a grammar's mask go through the mask graph first, and the passes then read its output."""
        masked = [i for i, row in enumerate(plan) if row.allowed is not None]
        if not masked:
            return self._run(logits, rows, plan)
        picks: list[Pick | None] = [None] * len(plan)
        values = self.masked(logits, [rows[i] for i in masked], [plan[i] for i in masked])
        for i, pick in zip(masked, self._run(values, list(range(len(masked))), [plan[i] for i in masked])):
            picks[i] = pick
        free = [i for i in range(len(plan)) if plan[i].allowed is None]
        for i, pick in zip(free, self._run(logits, [rows[i] for i in free], [plan[i] for i in free]) if free else []):
            picks[i] = pick
        return picks

    def binding(self, graph: str, logits: ort.OrtValue | np.ndarray) -> tuple[ort.InferenceSession, ort.IOBinding]:
        """The session of `graph` and a binding of it with `logits` bound where they are."""
        session = self.sessions[graph]
        binding = session.io_binding()
        if isinstance(logits, ort.OrtValue):
            binding.bind_ortvalue_input("logits", logits)
        else:
            binding.bind_cpu_input("logits", logits)
        return session, binding

    def masked(self, logits: ort.OrtValue | np.ndarray, rows: Sequence[int], plan: Sequence[PassRow]) -> ort.OrtValue:
        """Rows `rows` of `logits` with the ids their PassRow's grammar does not allow at -inf, (R, 1, V) on
        this pass's device: the mask graph's output, left where it is for the passes to read."""
        session, binding = self.binding(MASK, logits)
        binding.bind_cpu_input("rows", np.array(rows, np.int64))
        bits = np.stack([row.allowed for row in plan if row.allowed is not None]).astype(np.int32, copy=False)
        binding.bind_cpu_input("allowed_bits", bits)
        binding.bind_output("masked", self.device.kind, self.device.id)
        session.run_with_iobinding(binding)
        return binding.get_outputs()[0]

    def _run(
        self, logits: ort.OrtValue | np.ndarray, rows: Sequence[int], plan: Sequence[PassRow]
    ) -> list[Pick | None]:
        """run() for rows with no grammar's mask (or masked already)."""
        vocab = logits.shape()[-1] if isinstance(logits, ort.OrtValue) else logits.shape[-1]
        picks: list[Pick | None] = [None] * len(plan)
        whole = [draws_whole(row, vocab) for row in plan]
        self._pick(WHOLE, logits, rows, plan, [i for i in range(len(plan)) if whole[i]], picks)
        left = [i for i in range(len(plan)) if not whole[i]]
        for width in (NARROW, WIDE) if -(-vocab // ROW_ALIGN) > WIDE_GROUPS else (ROW,):
            left = self._pick(width, logits, rows, plan, left, picks)
        if self.nucleus:
            flat = [i for i, pick in enumerate(picks) if pick is None and not whole[i] and fits_nucleus(plan[i], vocab)]
            self._pick(NUCLEUS, logits, rows, plan, flat, picks)
        return picks

    def _pick(
        self,
        width: str,
        logits: ort.OrtValue | np.ndarray,
        rows: Sequence[int],
        plan: Sequence[PassRow],
        chosen: list[int],
        picks: list[Pick | None],
    ) -> list[int]:
        """The rows `chosen` (indices into `rows` and `plan`) through `width`, their picks into `picks`;
        those a wider pass might pick."""
        if not chosen:
            return []
        ran, widen = self.run_width(width, logits, [rows[i] for i in chosen], [plan[i] for i in chosen])
        for i, pick in zip(chosen, ran):
            picks[i] = pick
        return [i for i, wider in zip(chosen, widen) if wider]

    def run_width(
        self, width: str, logits: ort.OrtValue | np.ndarray, rows: Sequence[int], plan: Sequence[PassRow]
    ) -> tuple[list[Pick | None], list[bool]]:
        """run() through the graph of `width` (of WIDTHS) alone: None where it cannot pick the row exactly;
        and for each row whether a wider pass might (False where it picked the row)."""
        session, binding = self.binding(width, logits)
        for name, value in pass_inputs(rows, plan).items():
            binding.bind_cpu_input(name, value)
        for name in OUTPUTS:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        token, logprob, top_ids, top_logprobs, exact, widen = (value.numpy() for value in binding.get_outputs())
        picks = [
            Pick(
                int(token[i]),
                float(logprob[i]),
                tuple(zip(top_ids[i, : p.top].tolist(), top_logprobs[i, : p.top].tolist())),
            )
            if exact[i]
            else None
            for i, p in enumerate(plan)
        ]
        return picks, widen.tolist()
