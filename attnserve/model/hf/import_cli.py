"""`attnserve import`: a Hugging Face checkpoint directory into an attnserve checkpoint, proven first.

Reading the files is files.py's, mapping them decoders.py's (marian.py's for Marian), the proof against
transformers proof.py's (proof_seq2seq.py's for Marian); this file runs them in order (the config
compared with the weights' headers before any module is built), writes runs/NAME/ (checkpoint.pt, the
tokenizer's files, import.json with the proof's numbers) only once the proof has passed, and turns every
refusal into one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...flags import check_directory
from ...tokenizer.sentencepiece import VOCAB_FILE
from ..checkpoint import build_model, save_checkpoint
from ..config import ModelConfig
from .decoders import (
    FAMILIES,
    MODEL_TYPES,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    Family,
    architecture,
    own_code,
    read_tokenizer,
)
from .files import CONFIG_FILE, HFImportError, check_layout, read_headers, read_json, read_weights
from .marian import MARIAN, marian_config, marian_layout, marian_state, marian_tokenizer
from .proof import ImportProofError, prove
from .proof_seq2seq import prove as prove_seq2seq

DEFAULT_STEPS = 64
MIN_CONTEXT = 8  # as attnserve train's --context-length
# The proof's prompts: a ragged batch of texts of different lengths and scripts.
PROOF_TEXTS = (
    "The",
    "def parse_args(argv):",
    "Once upon a time, in a land far away,",
    "import numpy as np\nx = np.arange(10)",
    "Die Katze sitzt auf der Matte.",
    "1, 2, 3, 5, 8, 13,",
    "Paris is the capital of",
    "日本語のテキスト",
)
# Each architecture: how to read its config and weights, and its tokenizer (a BpeTokenizer or a SentencePieceTokenizer)
READERS: dict[str, tuple[Family, Callable[[Path, dict], Any]]] = {
    **{arch: (family, read_tokenizer) for arch, family in FAMILIES.items()},
    MARIAN: (Family(marian_config, marian_layout, marian_state), marian_tokenizer),
}
KINDS = {**MODEL_TYPES, MARIAN: "marian"}  # each architecture's model_type
VOCABULARY_FILES = {"sentencepiece": VOCAB_FILE}  # the file that lists a tokenizer's ids (else tokenizer.json)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`attnserve import`'s flags."""
    p.add_argument(
        "hf_dir",
        metavar="HF_DIR",
        help="a Hugging Face checkpoint directory (config.json, weights, tokenizer.json; a Marian translation "
        "model's source.spm, target.spm and vocab.json)",
    )
    p.add_argument("--out", required=True, help="run directory to write checkpoint.pt into, e.g. runs/NAME")
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        metavar="N",
        help="serve at most N positions, fewer than the model was trained for, so that the KV arena's slots are "
        "smaller (default: the config's max_position_embeddings or n_positions)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"greedy steps compared with transformers for each of the proof's prompts (default: {DEFAULT_STEPS})",
    )


def read_config(config: dict, config_path: Path, family: Family, kind: str) -> ModelConfig:
    try:
        return replace(family.config(config, config_path), family=kind)
    except ValueError as e:  # a rule of ModelConfig's the family's reading does not check first
        raise HFImportError(f"{config_path}: {e}") from None


def imported(hf_dir: Path, context_length: int | None = None):
    """The model (eval mode) and tokenizer of a checkpoint directory, and its architecture; nothing is
    built before config.json and the weights' headers agree."""
    config_path = hf_dir / CONFIG_FILE
    config = read_json(config_path)
    arch = architecture(config, config_path, tuple(READERS))
    own_code(config, config_path, KINDS, arch)
    family, family_tokenizer = READERS[arch]
    model_config = read_config(config, config_path, family, KINDS[arch])
    if context_length is not None and not MIN_CONTEXT <= context_length <= model_config.max_len:
        raise HFImportError(
            f"--context-length must be {MIN_CONTEXT} to {model_config.max_len} (the model's positions), "
            f"got {context_length}"
        )
    tokenizer = family_tokenizer(hf_dir, config)
    if tokenizer.vocab_size != model_config.vocab_size:
        listing = VOCABULARY_FILES.get(tokenizer.kind, TOKENIZER_FILE)
        raise HFImportError(
            f"{hf_dir}: {listing} has {tokenizer.vocab_size} ids, config.json's vocab_size {model_config.vocab_size}"
        )
    headers = read_headers(hf_dir)
    check_layout(headers, family.layout(model_config), config_path)
    model_config = replace(model_config, max_len=context_length or model_config.max_len)
    model = build_model(model_config)
    missing = model.load_state_dict(family.state(read_weights(headers), model_config), strict=False).missing_keys
    if missing:
        raise HFImportError(f"{hf_dir}: the weights lack {len(missing)} tensors, e.g. {missing[0]}")
    return model.eval(), tokenizer, arch


def write_run(out: Path, model, tokenizer, report: dict) -> None:
    """checkpoint.pt (with the tokenizer), the tokenizer's files and import.json; the checkpoint last."""
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer.kind == "sentencepiece":
        tokenizer.write(out)
    else:
        (out / TOKENIZER_FILE).write_text(tokenizer.json, encoding="utf-8")
        (out / TOKENIZER_CONFIG_FILE).write_text(json.dumps(tokenizer.imported_config, indent=2) + "\n")
    (out / "import.json").write_text(json.dumps(report, indent=2) + "\n")
    save_checkpoint(out / "checkpoint.pt", model, tokenizer=tokenizer.state(), imported=report)


def run(hf_dir: Path, out: Path, steps: int, context_length: int | None = None) -> dict:
    """Import, prove, write; the proof's report."""
    model, tokenizer, arch = imported(hf_dir, context_length)
    prompts = [tokenizer.encode_prompt(text) for text in PROOF_TEXTS]
    prompts = [p[: model.config.max_len // 2] for p in prompts if p]
    report = {"source": str(hf_dir), "architecture": arch, "parameters": model.num_parameters()}
    if arch == MARIAN:
        ids = {"start": tokenizer.bos_id, "pad": tokenizer.pad_id}
        report.update(prove_seq2seq(model, hf_dir, prompts, steps, ids))
    else:
        report.update(prove(model, hf_dir, prompts, steps, tokenizer.pad_id))
    write_run(out, model, tokenizer, report)
    return report


def check_flags(args) -> None:
    if not Path(args.hf_dir).is_dir():
        raise HFImportError(f"{args.hf_dir}: no such directory")
    if args.steps < 1:
        raise HFImportError(f"--steps must be at least 1, got {args.steps}")
    try:
        check_directory("--out", args.out)
    except ValueError as e:
        raise HFImportError(str(e)) from None
    if Path(args.out).exists() and not os.access(args.out, os.W_OK):
        raise HFImportError(f"--out {args.out}: not writable")


def main(args) -> int:
    """CLI entry: one line and exit 2 for a refusal, exit 1 with the numbers when the proof fails."""
    try:
        check_flags(args)
        report = run(Path(args.hf_dir), Path(args.out), args.steps, args.context_length)
    except HFImportError as e:
        print(f"attnserve import: error: {e}", file=sys.stderr)
        return 2
    except ImportProofError as e:
        print(f"attnserve import: the proof failed, nothing written: {e}", file=sys.stderr)
        return 1
    rows = "sources" if "sources" in report["greedy"] else "prompts"  # an encoder-decoder's proof decodes sources
    logits, greedy = report["logits"], report["greedy"][rows]
    steps = sum(r["steps"] for r in greedy)
    print(
        f"imported {args.hf_dir} ({report['architecture']}, {report['parameters']:,} parameters): logits within "
        f"{logits['max_abs_diff']:.2g} of transformers' (tolerance {logits['tolerance']:.2g}), greedy tokens "
        f"identical over {steps} steps of {len(greedy)} {rows}; wrote {args.out}/checkpoint.pt"
    )
    return 0
