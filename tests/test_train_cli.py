"""`attnserve train` as a user runs it, in real subprocesses: the held-out figure last, DDP, and
errors found only when the run starts. Its bad flag values, one line and exit 2 each, are rows of
tests/test_refusals.py's table (a missing or empty corpus, a bad preset, vocabulary or pairs file)."""

import os
import re
import subprocess
import sys

import pytest
import torch

from attnserve.model.config import preset
from attnserve.model.train import DEFAULT_BPE_VOCAB

pytestmark = pytest.mark.trains  # trains or imports a model with torch: out of `make test-fast`

TRAIN = [sys.executable, "-m", "attnserve.cli", "train"]


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
    assert proc.stderr.startswith(f"attnserve train: error: cannot write --out {locked / 'run'}: Permission denied")


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
