"""The parity gate for encoder-decoder models: both graphs against the PyTorch model.

Same rules as parity.py (names, then shapes, then values, then greedy decoding), on source
batches with padding; the cross-attention keys and values come from the encoder graph.
"""

from __future__ import annotations

import numpy as np
import torch

from ..model.generate import decode_seq2seq
from ..runtime import contract
from ..runtime.ort_decoder import OrtSeq2Seq, continuous_greedy
from ..runtime.ort_session import left_pad
from .gate_lengths import fitted, fitted_past, renamed
from .graphs import flatten
from .parity import check_names, compare, gate_report, greedy_with_margins, next_token_problems

# (case name, real source length of each row, target past length P, new target tokens T)
SEQ2SEQ_CASES = [
    ("B1 S1 T1 P0", [1], 0, 1),
    ("B1 S13 T5 P0", [13], 0, 5),
    ("B3 S13 T1 P0 source-padded", [13, 5, 1], 0, 1),
    ("B3 S13 T1 P17 source-padded", [13, 5, 1], 17, 1),
    ("B3 S13 T13 P17 source-padded", [13, 6, 2], 17, 13),
]
GREEDY_SOURCE_LENGTHS = [1, 13, 5]


def _np(tensors) -> list[np.ndarray]:
    return [t.float().numpy() for t in tensors]


@torch.no_grad()
def torch_case(model, src, src_mask, tgt, p: int):
    """Torch cross kv, the self-attention past of the first P target tokens, and the outputs of the rest."""
    src_mask_t = torch.from_numpy(src_mask)
    cross = model.cross_kv(model.encode(torch.from_numpy(src), src_mask_t))
    b, total = tgt.shape
    positions = torch.arange(total).repeat(b, 1)
    past = None
    if p:
        _, past = model.decode(torch.from_numpy(tgt[:, :p]), None, positions[:, :p], src_mask_t, cross)
    mask = torch.ones(b, total, dtype=torch.long)
    logits, present = model.decode(torch.from_numpy(tgt[:, p:]), mask, positions[:, p:], src_mask_t, cross, past)
    past_np = _np(flatten(past)) if past else None
    return _np(flatten(cross)), past_np, _np([logits, *flatten(present)])


def torch_greedy(model, sources: list[list[int]], steps: int, pad_id: int, bos_id: int):
    """The PyTorch model's greedy translations (B, steps) from BOS, EOS ignored, and its margins."""
    return greedy_with_margins(lambda pick: decode_seq2seq(model, sources, steps, pick, pad_id, bos_id))


def run_seq2seq_gate(model, runtime: OrtSeq2Seq, steps: int = 64, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    dtype, n = runtime.manifest.dtype, runtime.n_layers
    problems, checks = check_names(runtime), []
    context = model.config.max_len  # a source's positions, and a target's
    for case, lengths, p, t in SEQ2SEQ_CASES:
        lengths = fitted(lengths, context)
        p, t = fitted_past(p, p + t, context)
        case = renamed(case, S=max(lengths), T=t, P=p)
        src, src_mask, _ = left_pad([list(rng.integers(0, 256, k)) for k in lengths], runtime.pad_id)
        tgt = rng.integers(0, 256, (len(lengths), p + t)).astype(np.int64)
        cross, past, expected = torch_case(model, src, src_mask, tgt, p)
        checks += compare(case, contract.seq2seq_encoder_outputs(n), cross, runtime.encode(src, src_mask), dtype)
        cast = lambda xs: [x.astype(runtime.dtype) for x in xs]
        past_in = cast(past) if past else runtime.empty_past(len(lengths))
        logits, present = runtime.run(
            tgt[:, p:],
            np.ones((len(lengths), p + t), np.int64),
            np.arange(p, p + t)[None].repeat(len(lengths), 0),
            src_mask,
            past_in,
            cast(cross),
        )
        checks += compare(case, contract.seq2seq_decoder_outputs(n), expected, [logits, *present], dtype)
    sources = [list(rng.integers(48, 58, k)) for k in fitted(GREEDY_SOURCE_LENGTHS, context)]
    steps = min(steps, context)
    reference, margins = torch_greedy(model, sources, steps, runtime.pad_id, runtime.bos_id)
    return gate_report(dtype, problems, checks, reference, margins, runtime.greedy(sources, steps))


# The arena gate, driven like the server: (slot, source length) admitted together, then one more.
ARENA_SOURCES = [13, 5, 1]
ARENA_ADMITTED = 7
ARENA_ARRIVALS = [(0, 1), (0, 13), (0, 5), (3, 9), (7, 2)]  # (step it arrives at, source length)


@torch.no_grad()
def torch_slot(model, source: list[int], target: list[int]) -> list[np.ndarray]:
    """One request alone: last-token logits, its self-attention cache and its cross keys/values."""
    src = torch.tensor([source])
    src_mask = torch.ones_like(src)
    cross = model.cross_kv(model.encode(src, src_mask))
    logits, present = model.decode(torch.tensor([target]), None, None, src_mask, cross)
    return _np([logits[0, -1], *[t[0] for t in flatten(present)], *[t[0] for t in flatten(cross)]])


def arena_value_checks(model, runtime: OrtSeq2Seq, rng: np.random.Generator, dtype: str) -> list:
    """Admission of a right-padded source batch, decode steps, admission beside running slots, refill."""
    n = runtime.n_layers
    names = ["logits", *contract.present_names(n, "decoder"), *contract.past_names(n, "encoder")]
    context = model.config.max_len  # a source's positions: the encoder's table has as many as the decoder's
    decoder = runtime.arena(len(ARENA_SOURCES) + 1)
    sources = {slot: list(rng.integers(48, 58, k)) for slot, k in enumerate(fitted(ARENA_SOURCES, context))}
    targets = {slot: [runtime.bos_id] for slot in sources}
    got = dict(enumerate(decoder.prefill(0, list(sources.values()))))
    checks: list = []

    def check(case: str, slots) -> None:
        for slot in slots:
            have = [got[slot], *decoder.arena.read(slot), *decoder.cross.read(slot)]
            checks.extend(
                compare(f"{case} slot {slot}", names, torch_slot(model, sources[slot], targets[slot]), have, dtype)
            )

    def decode_all(case: str) -> None:
        tokens = [int(rng.integers(0, 256)) for _ in sources]
        for slot, token in enumerate(tokens):
            targets[slot].append(token)
        got.update(enumerate(decoder.decode(np.array(tokens))))
        check(case, sources)

    check("admit B3 sources right-padded", sources)
    for _ in range(3):
        decode_all("decode B3 ragged sources")
    admitted = fitted([ARENA_ADMITTED], context)[0]
    sources[3], targets[3] = list(rng.integers(48, 58, admitted)), [runtime.bos_id]
    got[3] = decoder.prefill(3, [sources[3]])[0]
    check("admit into slot 3", [3])
    decode_all("decode B4 after admission")
    decoder.move(3, 1)
    sources[1], targets[1] = sources.pop(3), targets.pop(3)
    decode_all("decode B3 after refill")
    return checks


def run_seq2seq_arena_gate(model, runtime: OrtSeq2Seq, steps: int = 64, seed: int = 0) -> dict:
    """run_seq2seq_gate's report for an encoder-decoder arena directory."""
    rng = np.random.default_rng(seed)
    dtype = runtime.manifest.dtype
    problems = check_names(runtime)
    checks = arena_value_checks(model, runtime, rng, dtype)
    lengths = fitted([k for _, k in ARENA_ARRIVALS], model.config.max_len)
    sources = [list(rng.integers(48, 58, k)) for k in lengths]
    steps = min(steps, model.config.max_len)
    reference, margins = zip(*(torch_greedy(model, [s], steps, runtime.pad_id, runtime.bos_id) for s in sources))
    arrivals = [a for a, _ in ARENA_ARRIVALS]
    got = continuous_greedy(runtime.arena(len(sources)), sources, arrivals, steps)
    problems += next_token_problems(runtime.arena(len(sources)), sources, arrivals, steps, got)
    return gate_report(
        dtype, problems, checks, np.concatenate(reference), np.concatenate(margins), got, kv_cache=contract.KV_ARENA
    )
