"""The parity gate: ONNX Runtime against the PyTorch model it was exported from.

Compares names, then shapes, then values on shapes other than the export's (batch 1 and 3,
left-padded prompts, prompt lengths 1 and 13, past 0 and 17), then greedy decoding over
many steps. Every failure is collected; ParityError carries the report and the worst numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..model.generate import Pick, decode
from ..runtime import contract
from ..runtime.ort_decoder import OrtDecoder, OrtGraphs, continuous_greedy
from ..runtime.ort_session import empty_past, io_names, left_pad
from .gate_lengths import fitted, fitted_past, renamed
from .graphs import flatten, pairs
from .invariance import invariance_failure, invariance_line
from .parity_beams import beam_lines

# (case name, real length of each row, past length P, new tokens T)
DECODER_CASES = [
    ("B1 T1 P0", [1], 0, 1),
    ("B1 T13 P0", [13], 0, 13),
    ("B3 T13 P0 left-padded", [13, 5, 1], 0, 13),
    ("B1 T1 P17", [18], 17, 1),
    ("B3 T1 P17 left-padded", [18, 10, 4], 17, 1),
    ("B3 T13 P17 left-padded", [30, 20, 14], 17, 13),
]
GREEDY_PROMPT_LENGTHS = [1, 13, 5]


class ParityError(Exception):
    """The exported graph does not reproduce the PyTorch model; the message carries the numbers."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


@dataclass
class Check:
    """One output of one case: shape agreement and the largest absolute difference."""

    case: str
    output: str
    shape: list
    max_abs_diff: float
    tolerance: float
    shape_ok: bool = True

    @property
    def ok(self) -> bool:
        return self.shape_ok and self.max_abs_diff <= self.tolerance


def tolerance_for(dtype: str, reference: np.ndarray) -> float:
    """float32: 1e-4 absolute. float16: 1% of the output's scale (11-bit mantissa, errors
    accumulate over the layers' dot products; measured ~0.2% on trained models). bfloat16: 8% (an
    8-bit mantissa rounds 8x coarser than float16's; greedy agreement is the gate that matters)."""
    if dtype == "float32":
        return 1e-4
    return (8e-2 if dtype == "bfloat16" else 1e-2) * max(1.0, float(np.abs(reference).max()))


@torch.no_grad()
def torch_outputs(model, ids, mask, positions, past) -> list[np.ndarray]:
    logits, present = model(
        torch.from_numpy(ids),
        torch.from_numpy(mask),
        torch.from_numpy(positions),
        pairs([torch.from_numpy(p) for p in past]),
    )
    return [t.float().numpy() for t in (logits, *flatten(present))]


def case_inputs(model, lengths: list[int], p: int, rng: np.random.Generator, pad_id: int):
    """The columns after the first P of a left-padded batch, and the float32 past of those P."""
    seqs = [list(rng.integers(0, 256, n)) for n in lengths]
    ids, mask, positions = left_pad(seqs, pad_id)
    cfg = model.config
    past = empty_past(cfg.n_layers, cfg.kv_heads, cfg.d_k, len(seqs), "float32")
    if p:
        past = torch_outputs(model, ids[:, :p], mask[:, :p], positions[:, :p], past)[1:]
    return ids[:, p:], mask, positions[:, p:], past


def compare(case: str, names: list[str], expected: list[np.ndarray], got: list[np.ndarray], dtype: str) -> list[Check]:
    checks = []
    for name, want, have in zip(names, expected, got):
        shape_ok = want.shape == have.shape
        diff = float(np.abs(want - have.astype(np.float32)).max()) if shape_ok and want.size else 0.0
        checks.append(Check(case, name, list(have.shape), diff, tolerance_for(dtype, want), shape_ok))
    return checks


def check_names(runtime: OrtGraphs) -> list[str]:
    """Differences between the graphs' I/O names and the contract's, as messages."""
    graphs = {role: io_names(session) for role, session in runtime.sessions.items()}
    return contract.io_name_problems(runtime.manifest.architecture, runtime.n_layers, graphs)


class MarginPick:
    """Greedy picks that remember each step's top-2 logit margin (B,): the gate excuses a
    divergence from the reference only at a near-tie."""

    def __init__(self) -> None:
        self.margins: list[torch.Tensor] = []

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        top2 = logits.float().topk(2, dim=-1).values
        self.margins.append(top2[:, 0] - top2[:, 1])
        return logits.argmax(-1)


def next_token_problems(
    decoder, prompts: list[list[int]], arrivals: list[int], steps: int, got: np.ndarray
) -> list[str]:
    """The arena gate's greedy loop again on a fresh `decoder`, its steps bringing back only the graph's
    NEXT_TOKEN, as the server's all-greedy steps do: a problem unless its tokens are `got`, the loop's
    from the logits (none for a graph without NEXT_TOKEN)."""
    if not decoder.greedy_outputs or np.array_equal(continuous_greedy(decoder, prompts, arrivals, steps, True), got):
        return []
    return [f"{contract.NEXT_TOKEN} differs from the argmax of the logits in the greedy loop"]


def greedy_with_margins(run: Callable[[Pick], torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """(B, steps) greedy tokens of a reference decode loop `run(pick)`, and their margins."""
    pick = MarginPick()
    tokens = run(pick)
    return tokens.numpy(), torch.stack(pick.margins, 1).numpy()


def torch_greedy(model, prompts: list[list[int]], steps: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The PyTorch model's greedy tokens (B, steps), EOS ignored, and its margin at each step."""
    return greedy_with_margins(lambda pick: decode(model, prompts, steps, pick, pad_id))


def greedy_agreement(reference: np.ndarray, margins: np.ndarray, got: np.ndarray, tie: float) -> dict:
    """Steps agreeing before the first divergence per row; a divergence is excused only at a
    near-tie of the reference (margin < `tie`; 0 for float32, so any divergence fails)."""
    rows = []
    for r in range(reference.shape[0]):
        diverged = np.flatnonzero(reference[r] != got[r])
        first = int(diverged[0]) if diverged.size else None
        excused = first is not None and float(margins[r, first]) < tie
        rows.append(
            {
                "agreeing_steps": first if first is not None else int(reference.shape[1]),
                "first_divergence": first,
                "excused_near_tie": excused,
                "margin_at_divergence": None if first is None else float(margins[r, first]),
            }
        )
    ok = all(r["first_divergence"] is None or r["excused_near_tie"] for r in rows)
    return {"steps": int(reference.shape[1]), "rows": rows, "ok": ok, "tie": tie}


def gate_report(
    dtype: str,
    problems: list[str],
    checks: list[Check],
    reference: np.ndarray,
    margins: np.ndarray,
    got: np.ndarray,
    **extra: str,
) -> dict:
    """A gate's verdict and figures: names, value checks, and greedy agreement (below float32 a
    divergence is excused at a near-tie, within twice the loosest check's tolerance)."""
    tie = 0.0 if dtype == "float32" else 2 * max(c.tolerance for c in checks)
    greedy = greedy_agreement(reference, margins, got, tie)
    passed = not problems and all(c.ok for c in checks) and greedy["ok"]
    return {
        "dtype": dtype,
        **extra,
        "passed": passed,
        "problems": problems,
        "checks": [asdict(c) | {"ok": c.ok} for c in checks],
        "greedy": greedy,
    }


def run_decoder_gate(model, runtime: OrtDecoder, steps: int = 64, seed: int = 0) -> dict:
    """The whole report: name problems, every value check, greedy agreement, and `passed`."""
    rng = np.random.default_rng(seed)
    dtype, n_layers = runtime.manifest.dtype, runtime.n_layers
    names = contract.decoder_outputs(n_layers)
    problems, checks = check_names(runtime), []
    context = model.config.max_len
    for case, lengths, p, _ in DECODER_CASES:
        p, new = fitted_past(p, max(lengths), context)
        lengths = fitted(lengths, context)
        ids, mask, positions, past = case_inputs(model, lengths, p, rng, runtime.pad_id)
        expected = torch_outputs(model, ids, mask, positions, past)
        got = runtime.run(ids, mask, positions, [x.astype(runtime.dtype) for x in past])
        checks += compare(renamed(case, T=new, P=p), names, expected, [got[0], *got[1]], dtype)
    prompts = [list(rng.integers(0, 256, n)) for n in fitted(GREEDY_PROMPT_LENGTHS, context // 2)]
    steps = min(steps, context - max(len(prompt) for prompt in prompts))
    reference, margins = torch_greedy(model, prompts, steps, runtime.pad_id)
    return gate_report(dtype, problems, checks, reference, margins, runtime.greedy(prompts, steps))


def format_report(report: dict) -> str:
    """A table of the worst difference per case, then the greedy result."""
    lines = [f"{'case':<36}{'outputs':>8}{'max abs diff':>15}{'tolerance':>12}  result"]
    by_case: dict[str, list[dict]] = {}
    for c in report["checks"]:
        by_case.setdefault(c["case"], []).append(c)
    for case, checks in by_case.items():
        worst = max(checks, key=lambda c: c["max_abs_diff"] / c["tolerance"])
        ok = all(c["ok"] for c in checks)
        lines.append(
            f"{case:<36}{len(checks):>8}{worst['max_abs_diff']:>15.3e}{worst['tolerance']:>12.1e}  "
            f"{'ok' if ok else 'FAIL (' + worst['output'] + ')'}"
        )
    g = report["greedy"]
    agree = ", ".join(str(r["agreeing_steps"]) for r in g["rows"])
    lines.append(
        f"greedy decoding, {g['steps']} steps: agreeing steps per row [{agree}]  {'ok' if g['ok'] else 'FAIL'}"
    )
    lines += [
        f"  row {i} diverged at step {r['first_divergence']}: excused, a near tie of the float32 reference "
        f"(its top-2 logits {r['margin_at_divergence']:.2g} apart, under {g['tie']:.2g})"
        for i, r in enumerate(g["rows"])
        if r["excused_near_tie"]
    ]
    lines += beam_lines(report)
    if "invariance" in report:
        lines.append(invariance_line(report["invariance"]))
    lines += [f"problem: {p}" for p in report["problems"]]
    return "\n".join(lines)


def failure_message(report: dict) -> str:
    """One paragraph with every failure and its numbers."""
    bad = [c for c in report["checks"] if not c["ok"]]
    parts = list(report["problems"])
    parts += [
        f"{c['case']} {c['output']}: max abs diff {c['max_abs_diff']:.3e} > {c['tolerance']:.1e}"
        + ("" if c["shape_ok"] else f" (shape {c['shape']} wrong)")
        for c in bad[:8]
    ]
    if len(bad) > 8:
        parts.append(f"... and {len(bad) - 8} more outputs")
    for r, row in enumerate(report["greedy"]["rows"]):
        if row["first_divergence"] is not None and not row["excused_near_tie"]:
            parts.append(f"greedy row {r} diverged at step {row['first_divergence']} of {report['greedy']['steps']}")
    beams = report.get("beams")
    if beams is not None and not beams["ok"]:
        parts += [
            f"beam search k={c['num_beams']} length_penalty={c['length_penalty']:g}: hypotheses differ for "
            f"{c['prompts'] - c['identical']} of {c['prompts']} prompts"
            for c in beams["cases"]
            if c["identical"] < c["prompts"]
        ]
    invariance = report.get("invariance")
    if invariance is not None and not invariance["passed"]:
        parts.append(invariance_failure(invariance))
    return "parity gate failed: " + "; ".join(parts)
