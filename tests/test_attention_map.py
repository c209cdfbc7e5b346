"""`attnserve attention-map` writes a valid PNG of cross-attention, and refuses decoder-only models."""

import subprocess
import sys

import pytest
import torch
from PIL import Image

from attnserve.model.attention_map import cross_attention
from attnserve.model.checkpoint import build_model, save_checkpoint
from attnserve.model.config import preset

pytestmark = pytest.mark.trains  # trains or imports a model with torch: out of `make test-fast`


def checkpoint(tmp_path, name):
    torch.manual_seed(0)
    path = tmp_path / f"{name}.pt"
    save_checkpoint(path, build_model(preset(name)))
    return path


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "attnserve.cli", "attention-map", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cross_attention_rows_are_distributions_over_the_source(tmp_path):
    from attnserve.model.checkpoint import load_checkpoint

    model = load_checkpoint(checkpoint(tmp_path, "tiny-seq2seq"))
    output, weights = cross_attention(model, "4021", max_new_tokens=10)
    layers, heads = model.config.n_layers, model.config.n_heads
    assert weights.shape == (layers, heads, len(output) + 1, 5)  # source is BOS + 4 bytes
    torch.testing.assert_close(weights.sum(-1), torch.ones(layers, heads, len(output) + 1))


def test_cli_writes_a_png(tmp_path):
    ckpt = checkpoint(tmp_path, "tiny-seq2seq")
    for extra in [(), ("--per-head", "--layer", "1")]:
        out = tmp_path / f"map{len(extra)}.png"
        proc = run(ckpt, "4021", "--out", out, *extra)
        assert proc.returncode == 0, proc.stderr
        with Image.open(out) as image:
            assert image.format == "PNG" and image.size[0] > 100 and image.size[1] > 100


def test_cli_refuses_decoder_only_and_bad_layer(tmp_path):
    proc = run(checkpoint(tmp_path, "tiny"), "4021", "--out", tmp_path / "x.png")
    assert proc.returncode == 2 and "encoder-decoder" in proc.stderr and "Traceback" not in proc.stderr
    proc = run(checkpoint(tmp_path, "tiny-seq2seq"), "1", "--out", tmp_path / "x.png", "--per-head", "--layer", "9")
    assert proc.returncode == 2 and "--layer must be 0 to 1 (the model's layers), got 9" in proc.stderr


def test_cli_bad_values_are_one_line_and_exit_2(tmp_path):
    """Issue 27's cases: a source longer than the model reads (was an IndexError), an --out that is
    not a PNG name (matplotlib's format error) or lies under a file (NotADirectoryError), and --layer
    without --per-head (was ignored)."""
    ckpt = checkpoint(tmp_path, "tiny-seq2seq")
    (tmp_path / "file").write_text("")
    cases = [
        (["9" * 300, "--out", tmp_path / "x.png"], "the source is 301 tokens (BOS and its UTF-8 bytes); this model"),
        (["4021", "--out", tmp_path / "map.txt"], f"--out {tmp_path}/map.txt: the map is a PNG"),
        (["4021", "--out", tmp_path / "file" / "x.png"], f"--out {tmp_path}/file/x.png: {tmp_path}/file is a file"),
        (["4021", "--out", tmp_path / "x.png", "--layer", "1"], "--layer needs --per-head"),
    ]
    for args, message in cases:
        proc = run(ckpt, *args)
        assert proc.returncode == 2, (args, proc.stderr)
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"attnserve attention-map: error: {message}"), line
    assert not (tmp_path / "x.png").exists()
