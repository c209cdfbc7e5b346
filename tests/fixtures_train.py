"""Session fixture: a `tiny` model trained once on the default corpus, for every test that needs
a real checkpoint (export, server). Trains in about ten seconds on one core."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from built_once import built_once

from attnserve.tokenizer.utf8 import ByteTokenizer

TINY_STEPS = 400
# Float results of one seeded training differ between CPUs, so CI's tiny model is not this machine's:
# no test may assume what it says. ATTNSERVE_TEST_SEED trains the fixtures from another seed, to run
# the suite over another model as a check of that: `ATTNSERVE_TEST_SEED=1 make test`.
TRAIN_SEED = int(os.environ.get("ATTNSERVE_TEST_SEED", "0"))
# The byte tokenizer's special ids, which the reference loops (model/generate.py) take from the caller
BYTE_IDS = {"eos_id": ByteTokenizer.eos_id, "pad_id": ByteTokenizer.pad_id}
SEQ2SEQ_IDS = {"bos_id": ByteTokenizer.bos_id, **BYTE_IDS}  # encoder-decoders use the byte tokenizer


def trained_tiny(tmp_path_factory, name: str, **tokenizer) -> Path:
    """runs/NAME/checkpoint.pt: the tiny decoder trained TINY_STEPS steps on the default corpus, once
    per test run, with the tokenizer options given."""
    from attnserve.model.config import preset  # torch, imported only by tests that train
    from attnserve.model.train import TrainConfig, train

    def build(out):
        cfg = TrainConfig(
            max_steps=TINY_STEPS,
            time_budget=None,
            out_dir=str(out),
            progress=False,
            batch_size=16,
            lr=1e-2,
            warmup_steps=10,
            eval_interval=TINY_STEPS,
            threads=1,
            seed=TRAIN_SEED,
            **tokenizer,
        )
        train(preset("tiny"), cfg, log=lambda _: None)

    return built_once(tmp_path_factory, f"runs/{name}", build) / "checkpoint.pt"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Path to checkpoint.pt of a tiny decoder with the byte tokenizer, trained 400 steps (held-out
    ~2.8 bits per byte): greedy output is words and spaces, not one repeated byte."""
    return trained_tiny(tmp_path_factory, "tiny", tokenizer="bytes")


@pytest.fixture(scope="session")
def tiny_bpe_checkpoint(tmp_path_factory):
    """The tiny decoder with a 512-id byte-level BPE trained on the default corpus's training split."""
    return trained_tiny(tmp_path_factory, "tiny-bpe", tokenizer="bpe", vocab_size=512)


def two_rank_run(tmp_path, worker_source: str) -> dict:
    """Run `worker_source` (which saves {"steps", "model"} to OUT/rank{r}.pt) under torchrun with two
    gloo ranks; check both ranks stopped together with identical weights; return rank 0's."""
    import torch

    (tmp_path / "worker.py").write_text(worker_source)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*torchrun, str(tmp_path / "worker.py"), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert rank0["steps"] == rank1["steps"] > 0  # a time budget stops both ranks together
    for name, tensor in rank0["model"].items():
        assert torch.equal(tensor, rank1["model"][name]), name
    return rank0
