"""`attnserve attention-map`: the cross-attention weights of an encoder-decoder as a heatmap of
output characters against source characters, the alignment picture of the lectures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ..flags import check_output
from ..tokenizer.utf8 import BOS_ID, EOS_ID, PAD_ID, encode
from .checkpoint import CheckpointError, load_checkpoint
from .config import ENCODER_DECODER
from .generate import generate_seq2seq


@torch.no_grad()
def cross_attention(model, source: str, max_new_tokens: int = 128):
    """(output ids, weights (layers, heads, T, S)) of a greedy translation of `source`."""
    src_ids = encode(source)
    steps = min(max_new_tokens, model.config.max_len - 1)
    output = generate_seq2seq(model, [src_ids], steps, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID)[0]
    src = torch.tensor([src_ids])
    src_mask = torch.ones_like(src)
    cross = model.cross_kv(model.encode(src, src_mask))
    tgt = torch.tensor([[BOS_ID, *output]])
    model.decode(tgt, None, None, src_mask, cross, keep_weights=True)
    weights = torch.stack([layer.cross_attn.last_weights[0] for layer in model.layers])  # (L, H, T, S)
    return output, weights


def labels(ids: list[int]) -> list[str]:
    """One label per byte: the character for printable ASCII, <BOS>, or the hex of a byte."""
    special = {BOS_ID: "<BOS>", EOS_ID: "<EOS>", 32: "␣"}
    return [special.get(i) or (chr(i) if 32 < i < 127 else f"x{i:02x}") for i in ids]


def plot(weights: torch.Tensor, rows: list[str], cols: list[str], title: str, out: Path) -> None:
    """One panel per layer (or per head when `weights` is (H, T, S) of one layer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = weights.shape[0]
    fig, axes = plt.subplots(1, panels, figsize=(2 + 0.28 * len(cols) * panels, 1.5 + 0.22 * len(rows)), squeeze=False)
    for p, ax in enumerate(axes[0]):
        ax.imshow(weights[p].numpy(), cmap="viridis", aspect="auto", vmin=0, vmax=1)
        ax.set_xticks(range(len(cols)), cols, fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        ax.set_title(f"{title} {p}", fontsize=9)
        ax.set_xlabel("source")
    axes[0][0].set_ylabel("output character")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def add_arguments(p) -> None:
    """`attnserve attention-map`'s flags."""
    p.add_argument("checkpoint", help="an encoder-decoder checkpoint, e.g. runs/numbers/checkpoint.pt")
    p.add_argument("source", help="source text to translate, e.g. 4021")
    p.add_argument("--out", required=True, help="PNG file to write (its name ends in .png)")
    p.add_argument("--per-head", action="store_true", help="one panel per head of --layer instead of per layer")
    p.add_argument("--layer", type=int, default=None, help="layer shown with --per-head (default: 0)")


def fail(message: str) -> int:
    print(f"attnserve attention-map: error: {message}", file=sys.stderr)
    return 2


def main(args) -> int:
    """CLI entry: averaged over heads per layer, or every head of --layer with --per-head."""
    if args.layer is not None and not args.per_head:
        return fail("--layer needs --per-head (without it every layer is shown, averaged over its heads)")
    if not args.source:
        return fail("the source is empty: give the text to translate, e.g. 4021")
    if Path(args.out).suffix.lower() != ".png":
        return fail(f"--out {args.out}: the map is a PNG; give a name ending in .png")
    try:
        check_output("--out", args.out)
    except ValueError as e:
        return fail(str(e))
    try:
        model = load_checkpoint(args.checkpoint)
    except CheckpointError as e:
        return fail(str(e))
    if model.config.arch != ENCODER_DECODER:
        return fail(f"{args.checkpoint}: needs an encoder-decoder checkpoint (it shows cross-attention)")
    layer = args.layer or 0
    if not 0 <= layer < model.config.n_layers:
        return fail(f"--layer must be 0 to {model.config.n_layers - 1} (the model's layers), got {layer}")
    source_ids = encode(args.source)
    if len(source_ids) > model.config.max_len:
        return fail(
            f"the source is {len(source_ids)} tokens (BOS and its UTF-8 bytes); this model reads at most "
            f"{model.config.max_len}"
        )
    output, weights = cross_attention(model, args.source)
    rows = labels([*output, EOS_ID])  # row i is the step that produced output i
    cols = labels(source_ids)
    if args.per_head:
        plot(weights[layer], rows, cols, f"layer {layer}, head", Path(args.out))
    else:
        plot(weights.mean(1), rows, cols, "layer (mean of heads)", Path(args.out))
    print(f"{args.source!r} -> {bytes(i for i in output if i < 256).decode('utf-8', 'replace')!r}; wrote {args.out}")
    return 0
