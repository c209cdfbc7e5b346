"""The parity gate's beam search: the served graph's beams against the PyTorch model's, hypothesis for
hypothesis, token for token.

The arena side runs as the server runs beam groups: a ragged set of prompts (an encoder-decoder's
sources) prefilled together, each copied into the other slots of its group, then every step one
decode of all the groups' slots, each group's rows to its search (engine/beam_search.py, the
server's own), and each beam that continues another's given a copy of its cache by the arena
driver's copy_cache (the server's). The PyTorch side runs each prompt alone, its cache reordered by
index. For each case (beams, length penalty) both give each prompt's hypotheses; a float32 export
must give the same tokens, a lower precision's are reported (its logits differ by its rounding, and
a beam's choice among near-equal sums follows).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from ..engine.beam_search import BeamSearch, reassign
from ..engine.domain import BeamParams
from .gate_lengths import fitted

BEAM_CASES = ((2, 1.0), (4, 0.6))  # (num_beams, length_penalty)
BEAM_LENGTHS = (13, 5, 1)  # the prompts' (sources') lengths, prefilled together
BEAM_STEPS = 24


def stepper(run, past, length: int, k: int):
    """Each step of k beams: (parents, next ids (k, 1)) -> their rows (k, V), the cache reordered by
    parent first; `run(ids, mask, positions, past)` is the model's decoder step."""
    state = {"past": past, "length": length}

    def step(parents: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        past = [(key[parents], value[parents]) for key, value in state["past"]]
        mask = torch.ones(k, state["length"] + 1, dtype=torch.long)
        positions = torch.full((k, 1), state["length"])
        logits, state["past"] = run(ids, mask, positions, past)
        state["length"] += 1
        return logits[:, -1]

    return step


def decoder_steps(model, prompt: list[int], k: int):
    """A decoder-only model's first rows for `prompt` and its stepper."""
    logits, past = model(torch.tensor([prompt]))
    past = [(key.repeat(k, 1, 1, 1), value.repeat(k, 1, 1, 1)) for key, value in past]
    return logits[0, -1].repeat(k, 1), stepper(model, past, len(prompt), k)


def seq2seq_steps(model, source: list[int], k: int, start_id: int):
    """An encoder-decoder's first rows for `source` (its decoder from the start id) and its stepper."""
    src = torch.tensor([source] * k)
    src_mask = torch.ones_like(src)
    cross = model.cross_kv(model.encode(src, src_mask))
    first = torch.full((k, 1), start_id)
    logits, past = model.decode(first, None, torch.zeros_like(first), src_mask, cross)
    run = lambda ids, mask, positions, past: model.decode(ids, mask, positions, src_mask, cross, past)
    return logits[:, -1], stepper(run, past, 1, k)


@torch.no_grad()
def torch_beams(model, prompt: list[int], params: BeamParams, ends: frozenset[int], start_id: int | None, budget: int):
    """The PyTorch model's hypotheses (tokens) for one prompt alone (`start_id`: an encoder-decoder's)."""
    k = params.num_beams
    if start_id is None:
        rows, step = decoder_steps(model, prompt, k)
    else:
        rows, step = seq2seq_steps(model, prompt, k, start_id)
    search = BeamSearch(params, ends, budget)
    while True:
        moves = search.step_rows(rows.float().numpy())
        if search.done:
            return [h.tokens for h in search.hypotheses()]
        parents = torch.tensor([parent for parent, _ in moves])
        rows = step(parents, torch.tensor([[token] for _, token in moves]))


def arena_beams(decoder, prompts: list[list[int]], params: BeamParams, ends: frozenset[int], budget: int) -> list:
    """Each prompt's hypotheses through one arena driver, every group's slots decoded together."""
    k, groups = params.num_beams, len(prompts)
    rows = decoder.prefill(0, prompts)  # slots 0 .. groups - 1
    slots = [[g, *range(groups + g * (k - 1), groups + (g + 1) * (k - 1))] for g in range(groups)]
    for group in slots:
        for fork in group[1:]:
            decoder.copy(group[0], fork)
    latest = {slot: rows[g] for g, group in enumerate(slots) for slot in group}
    searches = [BeamSearch(params, ends, budget) for _ in prompts]
    found: list[list[tuple]] = [[] for _ in prompts]
    tokens = np.zeros(groups * k, np.int64)
    while not all(search.done for search in searches):
        for g, search in enumerate(searches):
            if search.done:
                continue
            moves = search.step_rows(np.stack([latest[slot] for slot in slots[g]]))
            if search.done:
                found[g] = [h.tokens for h in search.hypotheses()]
                continue
            slots[g], copies = reassign(slots[g], moves)
            for src, dst in copies:
                decoder.copy_cache(src, dst)
            for slot, (_, token) in zip(slots[g], moves):
                tokens[slot] = token
        if not all(search.done for search in searches):
            latest = dict(enumerate(decoder.decode(tokens)))
    return found


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for the PyTorch side's many small steps: beside a busy core its two threads
    wait on each other at every op (the tiny test model's gate: 4.6 s on two threads beside a CPU
    burner, 0.26 s on one; 0.23 s on two when the machine is quiet)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def beam_report(model, runtime, dtype: str, eos_id: int, start_id: int | None, seed: int = 0) -> dict:
    """Each case's hypotheses on both sides; `ok` unless a float32 export's differ."""
    rng = np.random.default_rng(seed)
    context = model.config.max_len  # a source has it to itself; a prompt shares it with the beams' steps
    lengths = fitted(list(BEAM_LENGTHS), context if start_id is not None else context // 2)
    prompts = [[int(i) for i in rng.integers(0, 256, n)] for n in lengths]
    ends = frozenset({eos_id})
    decoder_prompt = 1 if start_id is not None else max(lengths)
    budget = min(BEAM_STEPS, context - decoder_prompt)
    cases = []
    for k, penalty in BEAM_CASES:
        params = BeamParams(k, penalty, "false", k)
        with one_thread():
            reference = [torch_beams(model, prompt, params, ends, start_id, budget) for prompt in prompts]
        capacity = len(prompts) * k
        longest = len(prompts) * max(lengths)  # the right-padded prefill's tokens
        decoder = runtime.arena(capacity) if start_id is not None else runtime.arena(capacity, longest)
        got = arena_beams(decoder, prompts, params, ends, budget)
        same = [mine == theirs for mine, theirs in zip(got, reference)]
        cases.append({"num_beams": k, "length_penalty": penalty, "prompts": len(prompts), "identical": sum(same)})
    identical = all(case["identical"] == case["prompts"] for case in cases)
    return {"steps": budget, "cases": cases, "identical": identical, "ok": identical or dtype != "float32"}


def beam_lines(report: dict) -> list[str]:
    """The gate table's beam lines."""
    beams = report.get("beams")
    if beams is None:
        return []
    cases = ", ".join(
        f"k={c['num_beams']} length_penalty={c['length_penalty']:g}: {c['identical']} of {c['prompts']}"
        for c in beams["cases"]
    )
    verdict = "ok" if beams["identical"] else ("reported (below float32)" if beams["ok"] else "FAIL")
    return [f"beam search, {beams['steps']} steps, prompts with identical hypotheses: {cases}  {verdict}"]
