"""The parity gate of an arena graph, driven the way the server drives it.

Through runtime/arena_decoder.py's ArenaDecoder (the server's own driver): a ragged right-padded prefill,
decode steps over slots of different lengths, a prompt admitted into a free slot while the
others hold state, a slot refilled by moving the last one into it, a long prompt prefilled in
chunks, then greedy decoding in a continuous batch where requests arrive at different steps,
each compared with PyTorch decoding that request alone. Same report shape and tolerances as
parity.py (names, every value check, greedy agreement).
"""

from __future__ import annotations

import numpy as np
import torch

from ..runtime import contract
from ..runtime.ort_decoder import OrtDecoder, continuous_greedy
from .gate_lengths import fitted
from .parity import check_names, compare, gate_report, next_token_problems, torch_greedy

PREFILL_LENGTHS = [13, 5, 1]  # slots 0-2, prefilled together, right-padded
ADMITTED_LENGTH = 7  # into slot 3 while slots 0-2 hold state
CHUNK = 16  # chunked prefill of a long prompt, batch 1
GREEDY_ARRIVALS = [(0, 1), (0, 13), (0, 5), (3, 9), (7, 2)]  # (step it arrives at, prompt length)
DECODES_AFTER_PREFILL = 3  # value_checks' decode steps of slots 0-2 (2 of the admitted slot's)


@torch.no_grad()
def reference(model, seq: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """PyTorch's last-token logits (V,) of one unpadded sequence, and its cache (H, T, D) per name."""
    logits, present = model(torch.tensor([seq]))
    return logits[0, -1].float().numpy(), [t[0].float().numpy() for kv in present for t in kv]


def check_slots(
    model, decoder, case: str, seqs: dict[int, list[int]], logits: dict[int, np.ndarray], dtype: str, names: list[str]
) -> list:
    """Each slot's logits and cache against PyTorch on that slot's whole sequence alone."""
    checks = []
    for slot, seq in seqs.items():
        want_logits, want_cache = reference(model, seq)
        checks += compare(
            f"{case} slot {slot}", names, [want_logits, *want_cache], [logits[slot], *decoder.arena.read(slot)], dtype
        )
    return checks


def value_checks(model, runtime: OrtDecoder, rng: np.random.Generator, dtype: str) -> list:
    """Prefill, decode, admission, refill and chunked prefill, each checked slot by slot."""
    names = contract.decoder_outputs(runtime.n_layers)
    context = model.config.max_len
    long_len = min(context - 2, 3 * CHUNK + 5)
    lengths = fitted(PREFILL_LENGTHS, context - DECODES_AFTER_PREFILL)
    admitted = fitted([ADMITTED_LENGTH], context - (DECODES_AFTER_PREFILL - 1))[0]
    decoder = runtime.arena(5, max(len(lengths) * max(lengths), CHUNK))
    seqs = {s: list(rng.integers(0, 256, n)) for s, n in enumerate(lengths)}
    got = dict(enumerate(decoder.prefill(0, list(seqs.values()))))
    checks = check_slots(model, decoder, "prefill B3 right-padded", seqs, got, dtype, names)

    def decode_all(case: str) -> None:
        tokens = [int(rng.integers(0, 256)) for _ in seqs]
        for slot, token in enumerate(tokens):
            seqs[slot].append(token)
        got.update(enumerate(decoder.decode(np.array(tokens))))
        checks.extend(check_slots(model, decoder, case, seqs, got, dtype, names))

    decode_all("decode B3 ragged past")
    seqs[3] = list(rng.integers(0, 256, admitted))
    got[3] = decoder.prefill(3, [seqs[3]])[0]
    checks += check_slots(model, decoder, "admit into slot 3", {3: seqs[3]}, got, dtype, names)
    decode_all("decode B4 after admission")
    decoder.move(3, 1)  # slot 1 retires; the last slot refills it
    seqs[1] = seqs.pop(3)
    decode_all("decode B3 after refill")
    chunked = list(rng.integers(0, 256, long_len))
    for start in range(0, long_len, CHUNK):
        got[4] = decoder.extend(4, chunked[start : start + CHUNK])
    checks += check_slots(model, decoder, f"chunked prefill {long_len} by {CHUNK}", {4: chunked}, got, dtype, names)
    return checks


def run_arena_gate(model, runtime: OrtDecoder, steps: int = 64, seed: int = 0) -> dict:
    """parity.run_decoder_gate's report for an arena graph."""
    rng = np.random.default_rng(seed)
    dtype = runtime.manifest.dtype
    problems = check_names(runtime)
    checks = value_checks(model, runtime, rng, dtype)
    context = model.config.max_len
    prompts = [list(rng.integers(0, 256, n)) for n in fitted([n for _, n in GREEDY_ARRIVALS], context // 2)]
    steps = min(steps, context - max(len(p) for p in prompts) - 1)
    reference_tokens, margins = zip(*(torch_greedy(model, [p], steps, runtime.pad_id) for p in prompts))
    decoder = runtime.arena(len(prompts), max(len(p) for p in prompts))
    arrivals = [a for a, _ in GREEDY_ARRIVALS]
    got = continuous_greedy(decoder, prompts, arrivals, steps)
    problems += next_token_problems(
        runtime.arena(len(prompts), max(len(p) for p in prompts)), prompts, arrivals, steps, got
    )
    reference = np.concatenate(reference_tokens)
    return gate_report(dtype, problems, checks, reference, np.concatenate(margins), got, kv_cache=contract.KV_ARENA)
