"""Session fixtures for the encoder-decoder path: a `tiny-seq2seq` model trained briefly on the
number task, its exported model directory, and a real server over it, each built once."""

import pytest
from built_once import built_once
from fixtures_export import exported
from fixtures_server import start_server
from fixtures_train import TRAIN_SEED

SEQ2SEQ_STEPS = 200


@pytest.fixture(scope="session")
def tiny_seq2seq_checkpoint(tmp_path_factory):
    """checkpoint.pt of a tiny encoder-decoder trained 200 steps on numbers into words: its greedy
    output is number words of varying length, not one repeated byte."""
    from attnserve.model.config import preset  # torch, imported only by tests that train
    from attnserve.model.train_seq2seq import Seq2SeqTrainConfig, train_seq2seq

    def build(out):
        cfg = Seq2SeqTrainConfig(
            out_dir=str(out),
            max_steps=SEQ2SEQ_STEPS,
            batch_size=16,  # 32 learns no better here and costs half as much again
            lr=3e-3,
            warmup_steps=30,
            eval_interval=SEQ2SEQ_STEPS,
            eval_pairs=20,
            precision="fp32",  # bf16 autocast is slower for a model this small on a CPU
            progress=False,
            seed=TRAIN_SEED,
        )
        train_seq2seq(preset("tiny-seq2seq"), cfg, log=lambda _: None)

    return built_once(tmp_path_factory, "runs/tiny-seq2seq", build) / "checkpoint.pt"


@pytest.fixture(scope="session")
def seq2seq_model(tiny_seq2seq_checkpoint):
    """The PyTorch encoder-decoder the model directory is exported from."""
    from attnserve.model.checkpoint import load_checkpoint

    return load_checkpoint(tiny_seq2seq_checkpoint)


@pytest.fixture(scope="session")
def tiny_seq2seq_model_dir(tiny_seq2seq_checkpoint, tmp_path_factory):
    """encoder.onnx + decoder.onnx of the tiny encoder-decoder; its parity gate has passed."""
    return exported(tmp_path_factory, "tiny-seq2seq", tiny_seq2seq_checkpoint)


@pytest.fixture(scope="session")
def seq2seq_server(tiny_seq2seq_model_dir):
    """A real server on 127.0.0.1 over the encoder-decoder model directory (max batch 8)."""
    running = start_server(tiny_seq2seq_model_dir)
    yield running
    running.stop()
