"""The batch-invariance gate: a request's greedy tokens do not depend on what shares its batch, nor on
how its prompt was split into chunks (a chunked prefill, or a prefix-cache hit that computes only the
prompt's rest). Driven through the arena driver the server uses, on the graph the export writes.

Each prompt is decoded greedily alone (prefilled whole, then one slot), and again:
- prefilled together: every prompt in one right-padded prefill, then decoded in one batch;
- arriving: requests joining at different steps and leaving when done, the last slot moved into a
  freed one (the server's continuous batch);
- chunked: alone, its prompt prefilled CHUNK ids at a time, split as the server splits a long prompt
  or a cached prefix's rest (never a run of one token: arena_decoder.SHORTEST_PROMPT_RUN).
Every case must give the tokens it gave alone. The report names each case's rows that differ and the
first step they do. On the CPU provider the MatMuls, float and row-quantized int8 (int8_rows.py), give
a row the same bits whatever shares its run; GroupQueryAttention's sums can differ in the last bits
with the length of the run a position is computed in (the server never runs a prompt position
alone: arena_decoder.SHORTEST_PROMPT_RUN), which tokens survive but for a near tie. The gate is
enforced on the CPU provider; on CUDA its result is reported, not enforced (cuBLAS may choose another
kernel, with another summation order, for another batch size).
"""

from __future__ import annotations

import numpy as np

from ..runtime.arena_decoder import next_run
from ..runtime.ort_decoder import OrtDecoder, continuous_greedy
from ..runtime.ort_session import CPU

PROMPT_LENGTHS = (13, 1, 21, 5, 9)
ARRIVALS = (0, 0, 2, 3, 6)  # the step each request joins the continuous batch at
CHUNK = 4
STEPS = 24  # greedy steps per prompt, at most
CASES = ("prefilled together", "arriving", "chunked")


def greedy_alone(decoder, prompt: list[int], steps: int, chunk: int = 0) -> list[int]:
    """Greedy tokens of `prompt` in slot 0 of an empty `decoder`, prefilled whole or in runs of up to
    `chunk` ids (next_run)."""
    decoder.arena.lengths[:] = 0
    if chunk:
        done = 0
        while done < len(prompt):
            count = next_run(len(prompt) - done, chunk)
            logits = decoder.extend(0, prompt[done : done + count])
            done += count
    else:
        logits = decoder.prefill(0, [prompt])[0]
    tokens = [int(logits.argmax())]
    for _ in range(steps - 1):
        tokens.append(int(decoder.decode(np.array([tokens[-1]]))[0].argmax()))
    return tokens


def greedy_together(decoder, prompts: list[list[int]], steps: int) -> np.ndarray:
    """(N, steps) greedy tokens of every prompt prefilled in one batch and decoded in one batch."""
    decoder.arena.lengths[:] = 0
    tokens = decoder.prefill(0, prompts).argmax(axis=1)
    out = [tokens]
    for _ in range(steps - 1):
        tokens = decoder.decode(tokens).argmax(axis=1)
        out.append(tokens)
    return np.stack(out, axis=1)


def differing_rows(alone: np.ndarray, got: np.ndarray) -> list[dict]:
    """Each row whose tokens differ from its tokens alone, with the first step they do."""
    return [
        {"row": r, "first_step": int(np.flatnonzero(alone[r] != got[r])[0])}
        for r in range(len(alone))
        if not np.array_equal(alone[r], got[r])
    ]


def invariance_report(runtime: OrtDecoder, steps: int = STEPS, seed: int = 0) -> dict:
    """The gate's figures and verdict for an arena decoder graph."""
    context = runtime.manifest.config["max_len"]
    lengths = [min(n, context // 2) for n in PROMPT_LENGTHS]  # a short context's model: shorter prompts
    steps = max(1, min(steps, context - max(lengths)))
    rng = np.random.default_rng(seed)
    vocab = min(256, runtime.manifest.config["vocab_size"])
    prompts = [[int(t) for t in rng.integers(0, vocab, n)] for n in lengths]
    longest = max(lengths) + steps
    decoder = runtime.arena(len(prompts), len(prompts) * longest)
    alone = np.array([greedy_alone(decoder, p, steps) for p in prompts])
    cases = {
        "prefilled together": greedy_together(decoder, prompts, steps),
        "arriving": continuous_greedy(runtime.arena(len(prompts), longest), prompts, list(ARRIVALS), steps),
        "chunked": np.array([greedy_alone(decoder, p, steps, CHUNK) for p in prompts]),
    }
    differing = {case: differing_rows(alone, got) for case, got in cases.items()}
    enforced = runtime.provider == CPU
    ok = not any(differing.values())
    return {
        "steps": steps,
        "prompts": len(prompts),
        "chunk": CHUNK,
        "differing": differing,
        "ok": ok,
        "enforced": enforced,
        "passed": ok or not enforced,
    }


def invariance_line(report: dict) -> str:
    """One line for the gate's printed report."""
    if report["ok"]:
        verdict = "ok"
    else:
        verdict = "FAIL" if report["enforced"] else "differs (reported, not enforced off the CPU provider)"
    parts = [
        f"{case}: {len(rows)} of {report['prompts']} rows differ" if rows else f"{case}: same"
        for case, rows in report["differing"].items()
    ]
    return (
        f"batch invariance, {report['prompts']} prompts x {report['steps']} greedy steps against each alone "
        f"(chunks of {report['chunk']}): {'; '.join(parts)}  {verdict}"
    )


def invariance_failure(report: dict) -> str:
    """The failure's reason: each case's differing rows and where they part."""
    parts = [
        f"{case}: row {d['row']} differs from its tokens alone at step {d['first_step']}"
        for case, rows in report["differing"].items()
        for d in rows[:2]
    ]
    return "batch invariance failed: " + "; ".join(parts)
