"""The import's proof for an encoder-decoder (Marian): attnserve's model against transformers' on the same
checkpoint, before anything is written, as proof.py proves a decoder.

Two checks: the logits of a ragged source batch (right-padded, as transformers' tokenizers pad) with a
teacher-forced target after the decoder's start id, within a tolerance of the logits' scale at every
target position; and greedy decoding of each source alone, token for token over many steps, against
transformers' forward with its own cache (EOS does not stop either side, so every step is compared).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..generate import decode_seq2seq
from ..seq2seq import EncoderDecoder
from .proof import LOGITS_TOLERANCE, reference_model, verdict

TARGET_LENGTH = 12  # the teacher-forced target's positions in the logits check


def right_pad(sources: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sources)
    ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in sources])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sources])
    return ids, mask


@torch.no_grad()
def compare_logits(model: EncoderDecoder, reference, sources: list[list[int]], start_id: int, pad_id: int) -> dict:
    """max |ours - theirs| over a right-padded source batch's teacher-forced targets, and the scale."""
    src, src_mask = right_pad(sources, pad_id)
    generator = torch.Generator().manual_seed(0)
    length = min(TARGET_LENGTH, model.config.max_len)  # a short context (import --context-length 8) holds fewer
    target = torch.randint(0, model.config.vocab_size, (len(sources), length), generator=generator)
    target[:, 0] = start_id
    ours = model(src, src_mask, target)
    theirs = reference(input_ids=src, attention_mask=src_mask, decoder_input_ids=target).logits.float()
    diff = (ours - theirs).abs().max().item()
    scale = theirs.abs().max().item()
    return {"max_abs_diff": diff, "scale": scale, "tolerance": LOGITS_TOLERANCE * max(1.0, scale)}


@torch.no_grad()
def reference_greedy(reference, source: list[int], steps: int, start_id: int) -> list[int]:
    """transformers' greedy tokens: the encoder once, its decoder with its own cache, argmax, no EOS stop."""
    encoded = reference.get_encoder()(input_ids=torch.tensor([source]))
    out = reference(encoder_outputs=encoded, decoder_input_ids=torch.tensor([[start_id]]), use_cache=True)
    tokens: list[int] = []
    for _ in range(steps):
        token = int(out.logits[0, -1].argmax())
        tokens.append(token)
        out = reference(
            encoder_outputs=encoded,
            decoder_input_ids=torch.tensor([[token]]),
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    return tokens


def compare_greedy(model: EncoderDecoder, reference, sources: list[list[int]], steps: int, ids: dict) -> dict:
    """Greedy decoding of each source alone on both sides; the first step where they part, if any."""
    rows = []
    steps = min(steps, model.config.max_len)
    for source in sources:
        argmax = lambda logits: logits.argmax(-1)
        ours = decode_seq2seq(model, [source], steps, argmax, ids["pad"], ids["start"])[0].tolist()
        theirs = reference_greedy(reference, source, len(ours), ids["start"])
        parted = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        rows.append({"source_tokens": len(source), "steps": len(theirs), "first_difference": parted})
    return {"sources": rows, "identical": all(r["first_difference"] is None for r in rows)}


def prove(model: EncoderDecoder, hf_dir: Path, sources: list[list[int]], steps: int, ids: dict) -> dict:
    """The import's report (ids: the decoder's start id and the pad id); ImportProofError when a check fails."""
    reference = reference_model(hf_dir, "AutoModelForSeq2SeqLM")
    report = {"logits": compare_logits(model, reference, sources, ids["start"], ids["pad"])}
    report["greedy"] = compare_greedy(model, reference, sources, steps, ids)
    return verdict(report, "sources")
