"""The import's proof: attnserve's model of an imported checkpoint against the `transformers` model
it came from, before anything is written (import is proof, as the export's gate is for ONNX).

Two checks, each reporting its numbers: the logits of a ragged batch (left-padded, as the reference
decode loop pads) within a tolerance of the logits' scale at every real position, and greedy
decoding of each prompt alone, token for token over many steps, against transformers' own forward
with its own KV cache (EOS does not stop either side, so every step is compared).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from ..generate import decode, left_pad
from ..lm import DecoderLM
from .files import HFImportError, one_line

LOGITS_TOLERANCE = 1e-4  # of max(1, max |logit|): float32 against float32, the same arithmetic in another order


class ImportProofError(Exception):
    """attnserve's model and transformers' disagree; the message carries the numbers."""


def reference_model(hf_dir: Path, auto_class: str = "AutoModelForCausalLM"):
    """transformers' own model of the directory, float32, eval mode: read from the directory alone, and
    never from code the directory carries (no question is asked on stdin either)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory: nothing to fetch, and nothing fetched
    import transformers
    from transformers.utils import logging

    logging.disable_progress_bar()
    try:
        model = getattr(transformers, auto_class).from_pretrained(hf_dir, dtype=torch.float32, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 (transformers refusing a file attnserve's reading passed)
        raise HFImportError(
            f"{hf_dir}: transformers cannot load the reference ({type(e).__name__}: {one_line(e)})"
        ) from None
    return model.eval()


@torch.no_grad()
def compare_logits(model: DecoderLM, reference, prompts: list[list[int]], pad_id: int) -> dict:
    """max |ours - theirs| over the real positions of a left-padded batch, and the logits' scale."""
    ids, mask, positions = left_pad(prompts, pad_id)
    ours = model(ids, mask, positions)[0]
    theirs = reference(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    real = mask.bool()  # (B, T)
    diff = (ours - theirs).abs()[real].max().item()
    scale = theirs.abs()[real].max().item()
    return {"max_abs_diff": diff, "scale": scale, "tolerance": LOGITS_TOLERANCE * max(1.0, scale)}


@torch.no_grad()
def reference_greedy(reference, prompt: list[int], steps: int) -> list[int]:
    """transformers' greedy tokens: its forward and its own cache, argmax at every step, no EOS stop."""
    out = reference(input_ids=torch.tensor([prompt]), use_cache=True)
    tokens: list[int] = []
    for _ in range(steps):
        token = int(out.logits[0, -1].argmax())
        tokens.append(token)
        if len(prompt) + len(tokens) >= reference.config.max_position_embeddings:
            break
        out = reference(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens


def compare_greedy(model: DecoderLM, reference, prompts: list[list[int]], steps: int, pad_id: int) -> dict:
    """Greedy decoding of each prompt alone on both sides; the first step where they part, if any."""
    rows = []
    for prompt in prompts:
        steps_here = min(steps, model.config.max_len - len(prompt))
        ours = decode(model, [prompt], steps_here, lambda logits: logits.argmax(-1), pad_id)[0].tolist()
        theirs = reference_greedy(reference, prompt, steps_here)
        parted = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        rows.append({"prompt_tokens": len(prompt), "steps": len(theirs), "first_difference": parted})
    return {"prompts": rows, "identical": all(r["first_difference"] is None for r in rows)}


def prove(model: DecoderLM, hf_dir: Path, prompts: list[list[int]], steps: int, pad_id: int) -> dict:
    """The import's report; ImportProofError with it when a check fails."""
    reference = reference_model(hf_dir)
    report = {"logits": compare_logits(model, reference, prompts, pad_id)}
    report["greedy"] = compare_greedy(model, reference, prompts, steps, pad_id)
    return verdict(report, "prompts")


def verdict(report: dict, rows: str) -> dict:
    """The report, or ImportProofError naming the check that failed (`rows`: what the greedy check
    decoded, "prompts" or "sources")."""
    logits = report["logits"]
    if not (math.isfinite(logits["max_abs_diff"]) and math.isfinite(logits["scale"])):
        raise ImportProofError(
            f"the logits are not finite (max |ours - theirs| {logits['max_abs_diff']}, max |theirs| "
            f"{logits['scale']}): nothing to compare"
        )
    if logits["max_abs_diff"] > logits["tolerance"]:
        raise ImportProofError(
            f"logits differ from transformers' by {logits['max_abs_diff']:.3g} (tolerance {logits['tolerance']:.3g})"
        )
    if not report["greedy"]["identical"]:
        parted = [r for r in report["greedy"][rows] if r["first_difference"] is not None]
        raise ImportProofError(f"greedy tokens differ from transformers' for {len(parted)} {rows}: {parted}")
    return report
