"""`attnserve train` as a user runs it: one-line errors with exit 2, and the held-out figure last.

Every case is a real subprocess; the error cases start together (each mostly imports torch),
so the module costs a few seconds rather than one import after another.
"""

import os
import re
import subprocess
import sys

import pytest
import torch

from attnserve.model.config import preset
from attnserve.model.train import DEFAULT_BPE_VOCAB

TRAIN = [sys.executable, "-m", "attnserve.cli", "train"]
CASES = [
    "missing corpus",
    "empty corpus",
    "folder without .txt",
    "corpus shorter than a block",
    "unknown preset",
    "out under a regular file",
    "resume without a checkpoint",
    "encoder-decoder resume without a checkpoint",
    "pairs file with a bad line",
    "pairs longer than the context",
    "BPE vocabulary below the bytes",
    "vocabulary size for the byte tokenizer",
    "BPE for an encoder-decoder",
    "negative learning rate",
    "negative max steps",
    "zero time budget",
    "zero batch size",
]


OUT = "<a folder of the case's own>"


def error_cases(root):
    """name -> (extra arguments, expected text in the error line); builds the files they need."""
    (root / "empty.txt").write_bytes(b"")
    (root / "short.txt").write_bytes(b"tiny corpus\n" * 10)
    (root / "no-text").mkdir()
    (root / "no-text" / "notes.md").write_text("not a .txt file")
    (root / "a-file").write_text("a regular file")
    (root / "bad.tsv").write_text("12\ttwelve\nno tab on this line\n")
    (root / "long.tsv").write_text("12\ttwelve\n" + "9" * 80 + "\tnines\n")
    out = ["--out", OUT]  # error_runs gives each case a folder of its own: they run at once
    return {
        "missing corpus": (["--corpus", str(root / "nope.txt"), *out], "corpus not found"),
        "empty corpus": (["--corpus", str(root / "empty.txt"), *out], "is empty"),
        "folder without .txt": (["--corpus", str(root / "no-text"), *out], "has no .txt files"),
        "corpus shorter than a block": (
            ["--corpus", str(root / "short.txt"), "--preset", "tiny", *out],
            "corpus too short",
        ),
        "unknown preset": (["--preset", "enormous", *out], "unknown preset 'enormous'"),
        "out under a regular file": (["--preset", "tiny", "--out", str(root / "a-file" / "run")], "cannot write --out"),
        "encoder-decoder resume without a checkpoint": (
            ["--preset", "numbers", "--resume", *out],
            "--resume: checkpoint not found",
        ),
        "pairs file with a bad line": (
            ["--preset", "tiny-seq2seq", "--corpus", str(root / "bad.tsv"), *out],
            "bad.tsv:2: expected 'source<TAB>target'",
        ),
        "pairs longer than the context": (
            ["--preset", "tiny-seq2seq", "--corpus", str(root / "long.tsv"), *out],
            "pair 2 needs 81 tokens, the context (max_len) is 64",
        ),
        "resume without a checkpoint": (["--preset", "tiny", "--resume", *out], "checkpoint not found"),
        "BPE vocabulary below the bytes": (
            ["--preset", "tiny", "--tokenizer", "bpe", "--vocab-size", "100", *out],
            "--vocab-size 100 is outside [259, ",
        ),
        "vocabulary size for the byte tokenizer": (
            ["--tokenizer", "bytes", "--vocab-size", "512", *out],
            "--vocab-size is the BPE tokenizer's",
        ),
        "BPE for an encoder-decoder": (
            ["--preset", "numbers", "--tokenizer", "bpe", *out],
            "--tokenizer bpe is for decoder-only models",
        ),
        "negative learning rate": (["--lr", "-1", *out], "--lr must be positive, got -1.0"),
        "negative max steps": (["--max-steps", "-2", *out], "--max-steps must not be negative, got -2"),
        "zero time budget": (["--time-budget", "0", *out], "--time-budget must be positive, got 0.0"),
        "zero batch size": (["--batch-size", "0", *out], "--batch-size must be at least 1, got 0"),
    }


@pytest.fixture(scope="module")
def error_runs(tmp_path_factory):
    """Every error case, run concurrently: name -> ((exit code, stdout, stderr), expected text)."""
    root = tmp_path_factory.mktemp("cli-errors")
    cases = error_cases(root)
    assert sorted(cases) == sorted(CASES)
    own_out = lambda i, args: [str(root / f"case{i}" / "run") if a == OUT else a for a in args]
    procs = {
        name: subprocess.Popen([*TRAIN, *own_out(i, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, (name, (args, _)) in enumerate(cases.items())
    }
    outputs = {name: p.communicate(timeout=120) for name, p in procs.items()}
    return {name: ((procs[name].returncode, *outputs[name]), cases[name][1]) for name in cases}


@pytest.mark.parametrize("case", CASES)
def test_errors_are_one_line_and_exit_2(error_runs, case):
    (code, _stdout, stderr), expected = error_runs[case]
    assert code == 2, (code, stderr)
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnserve train: error: ") and expected in lines[0], stderr


def test_read_only_out_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.access(locked, os.W_OK):
        pytest.skip("running as root: permissions do not stop writes")
    proc = subprocess.run(
        [*TRAIN, "--preset", "tiny", "--out", str(locked / "run")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("attnserve train: error: cannot write --out")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [*TRAIN, "--preset", "tiny", "--device", "cuda", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip() == "attnserve train: error: --device cuda: CUDA is not available "
        "(no GPU, or a CPU-only torch build)"
    )


def test_a_short_run_ends_with_the_heldout_figure(tmp_path):
    proc = subprocess.run(
        [*TRAIN, "--preset", "tiny", "--max-steps", "12", "--batch-size", "8", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"held-out: \d+\.\d{3} bits per byte", last), proc.stdout
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert state["step"] == 12 and state["config"] == preset("tiny", vocab_size=DEFAULT_BPE_VOCAB).to_dict()
    assert float(last.split()[1]) == pytest.approx(state["heldout_bpb"], abs=5e-4)


def test_torchrun_trains_with_two_ranks_and_only_rank_0_reports(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "attnserve.cli",
            "train",
            "--preset",
            "tiny",
            "--max-steps",
            "6",
            "--batch-size",
            "8",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum(line.startswith("held-out: ") for line in proc.stdout.splitlines()) == 1, proc.stdout
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert state["world_size"] == 2 and state["step"] == 6


def test_encoder_decoder_preset_trains_on_a_pairs_file_and_reports_exact_match(tmp_path):
    words = ["cat", "dog", "sun", "map", "red", "big", "top", "cup", "hat", "pen"]
    (tmp_path / "pairs.tsv").write_text("".join(f"{a}{b}\t{b}{a}\n" for a in words for b in words))
    proc = subprocess.run(
        [
            *TRAIN,
            "--preset",
            "tiny-seq2seq",
            "--corpus",
            str(tmp_path / "pairs.tsv"),
            "--max-steps",
            "20",
            "--batch-size",
            "8",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"held-out exact match: (\d+\.\d)% of (\d+) pairs", last)
    assert match, proc.stdout
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert state["step"] == 20 and state["config"]["arch"] == "encoder-decoder"
    assert float(match[1]) == pytest.approx(100 * state["heldout_exact_match"], abs=0.05)
    assert 0 < int(match[2]) < 100  # a fixed hashed share of the 100 pairs is held out
