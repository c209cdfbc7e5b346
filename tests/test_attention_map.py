"""`attnserve attention-map` writes a valid PNG of cross-attention, and refuses decoder-only models."""

import pytest
import torch
from cli_driver import run_in_one_process
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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every command line of this module's tests, run by one process (tests/cli_driver.py): the
    PNGs asked for, then the refusals; {name: (args, result)}."""
    tmp = tmp_path_factory.mktemp("attention-map")
    s2s, tiny = checkpoint(tmp, "tiny-seq2seq"), checkpoint(tmp, "tiny")
    (tmp / "file").write_text("")
    lines = {
        "png": [s2s, "4021", "--out", tmp / "map.png"],
        "png per head": [s2s, "4021", "--out", tmp / "heads.png", "--per-head", "--layer", "1"],
        "decoder-only": [tiny, "4021", "--out", tmp / "x.png"],
        "layer 9": [s2s, "1", "--out", tmp / "x.png", "--per-head", "--layer", "9"],
        # Issue 27's cases: a source longer than the model reads (was an IndexError), an --out that is
        # not a PNG name (matplotlib's format error) or lies under a file (NotADirectoryError), and
        # --layer without --per-head (was ignored).
        "long source": [s2s, "9" * 300, "--out", tmp / "x.png"],
        "not a png": [s2s, "4021", "--out", tmp / "map.txt"],
        "under a file": [s2s, "4021", "--out", tmp / "file" / "x.png"],
        "layer alone": [s2s, "4021", "--out", tmp / "x.png", "--layer", "1"],
    }
    results = run_in_one_process([["attention-map", *args] for args in lines.values()], tmp)
    return tmp, {name: (args, result) for (name, args), result in zip(lines.items(), results)}


def test_cross_attention_rows_are_distributions_over_the_source(tmp_path):
    from attnserve.model.checkpoint import load_checkpoint

    model = load_checkpoint(checkpoint(tmp_path, "tiny-seq2seq"))
    output, weights = cross_attention(model, "4021", max_new_tokens=10)
    layers, heads = model.config.n_layers, model.config.n_heads
    assert weights.shape == (layers, heads, len(output) + 1, 5)  # source is BOS + 4 bytes
    torch.testing.assert_close(weights.sum(-1), torch.ones(layers, heads, len(output) + 1))


def test_cli_writes_a_png(runs):
    _, results = runs
    for name in ("png", "png per head"):
        args, result = results[name]
        assert result["rc"] == 0, result["stderr"]
        with Image.open(args[args.index("--out") + 1]) as image:
            assert image.format == "PNG" and image.size[0] > 100 and image.size[1] > 100


def test_cli_refuses_decoder_only_and_bad_layer(runs):
    _, results = runs
    _, got = results["decoder-only"]
    assert got["rc"] == 2 and "encoder-decoder" in got["stderr"] and "Traceback" not in got["stderr"]
    _, got = results["layer 9"]
    assert got["rc"] == 2 and "--layer must be 0 to 1 (the model's layers), got 9" in got["stderr"]


def test_cli_bad_values_are_one_line_and_exit_2(runs):
    tmp, results = runs
    cases = {
        "long source": "the source is 301 tokens (BOS and its UTF-8 bytes); this model",
        "not a png": f"--out {tmp}/map.txt: the map is a PNG",
        "under a file": f"--out {tmp}/file/x.png: {tmp}/file is a file",
        "layer alone": "--layer needs --per-head",
    }
    for name, message in cases.items():
        args, got = results[name]
        assert got["rc"] == 2, (args, got["stderr"])
        (line,) = got["stderr"].strip().splitlines()
        assert line.startswith(f"attnserve attention-map: error: {message}"), line
    assert not (tmp / "x.png").exists()
