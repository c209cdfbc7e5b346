"""Encoder-decoder training through the one Trainer: a short run learns, exact match is measured on
held-out pairs, --resume continues the steps and the schedule, DDP keeps ranks identical, CUDA."""

import textwrap

import pytest
import torch
from fixtures_train import two_rank_run

from attnserve.model.checkpoint import build_model, load_checkpoint
from attnserve.model.config import preset
from attnserve.model.train_seq2seq import Seq2SeqTrainConfig, batch_tensors, exact_match, train_seq2seq
from attnserve.model.trainer import TrainError
from attnserve.tokenizer.utf8 import BOS_ID, EOS_ID, PAD_ID

pytestmark = pytest.mark.trains  # trains or imports a model with torch: out of `make test-fast`

QUIET = dict(progress=False, threads=1, batch_size=8, eval_pairs=10, precision="fp32")
WORDS = ["cat", "dog", "sun", "map", "red", "big", "top", "cup", "hat", "pen", "box", "fox"]


def tiny_run(out, train_pairs=None, heldout=None, log=None, **overrides):
    """Train the tiny-seq2seq preset for a few steps into `out`; returns train_seq2seq()'s result."""
    cfg = Seq2SeqTrainConfig(out_dir=str(out), **{**QUIET, **overrides})
    return train_seq2seq(preset("tiny-seq2seq"), cfg, train_pairs, heldout, log=log or (lambda _: None))


def initial_weights() -> dict:
    """The tiny-seq2seq model's weights under seed 0, before training."""
    torch.manual_seed(0)
    return build_model(preset("tiny-seq2seq")).state_dict()


def test_batch_tensors_shift_targets_and_pad():
    src, src_mask, tgt_in, labels = batch_tensors([("12", "twelve"), ("7", "seven!!")])
    assert src[1].tolist()[-2:] == [BOS_ID, ord("7")] and src_mask[1].tolist()[0] == 0
    assert tgt_in[0].tolist() == [BOS_ID, *b"twelve", PAD_ID]
    assert labels[0].tolist() == [*b"twelve", EOS_ID, PAD_ID]
    assert labels[1].tolist() == [*b"seven!!", EOS_ID]


def test_short_run_learns_a_copy_task(tmp_path):
    pairs = [(a + b, b + a) for a in WORDS for b in WORDS]  # swap two words
    heldout = pairs[::5]  # 29 unseen pairs; every word is seen in both places in training
    train = [p for i, p in enumerate(pairs) if i % 5]
    model = build_model(preset("tiny-seq2seq"))
    model.load_state_dict(initial_weights())  # what training starts from
    before = exact_match(model, heldout)
    result = tiny_run(tmp_path, train, heldout, max_steps=100, batch_size=32, lr=5e-3, warmup_steps=30)
    assert result["steps"] == 100 and result["heldout_pairs"] == len(heldout)
    assert result["heldout_exact_match"] > before + 0.2
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["heldout_exact_match"] == result["heldout_exact_match"]
    assert load_checkpoint(tmp_path / "checkpoint.pt").config.arch == "encoder-decoder"


def stop_at_first_evaluation(_line: str) -> None:
    """A log that interrupts the run, as Ctrl-C would, right after the first checkpoint."""
    raise KeyboardInterrupt


def test_resume_continues_the_steps_and_the_schedule(tmp_path):
    schedule = dict(max_steps=12, warmup_steps=2, eval_interval=7)  # cosine over 12 steps
    straight = tiny_run(tmp_path / "a", **schedule)
    with pytest.raises(KeyboardInterrupt):
        tiny_run(tmp_path / "b", log=stop_at_first_evaluation, **schedule)
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["step"] == 7
    resumed = tiny_run(tmp_path / "b", resume=True, **schedule)
    assert (resumed["start_step"], resumed["steps"]) == (7, 12)
    state = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert state["step"] == 12 and all(int(s["step"]) == 12 for s in state["optimizer"]["state"].values())
    for name, tensor in straight["model"].state_dict().items():
        torch.testing.assert_close(resumed["model"].state_dict()[name], tensor, rtol=1e-5, atol=1e-6)


def test_resume_refuses_a_missing_or_different_checkpoint(tmp_path):
    with pytest.raises(TrainError, match="checkpoint not found"):
        tiny_run(tmp_path, max_steps=1, resume=True)
    tiny_run(tmp_path, max_steps=1)
    cfg = Seq2SeqTrainConfig(out_dir=str(tmp_path), max_steps=2, resume=True, **QUIET)
    with pytest.raises(TrainError, match="another model config than the one asked for: --d-ff was 64, not 32"):
        train_seq2seq(preset("tiny-seq2seq", d_ff=32), cfg)


def test_cli_resumes_an_encoder_decoder_and_names_a_different_flag(tmp_path, capsys):
    from attnserve.cli import main

    (tmp_path / "pairs.tsv").write_text("".join(f"{a}{b}\t{b}{a}\n" for a in WORDS for b in WORDS))
    run = ["train", "--preset", "tiny-seq2seq", "--corpus", str(tmp_path / "pairs.tsv"), "--out", str(tmp_path)]
    assert main([*run, "--max-steps", "2", "--batch-size", "4", "--threads", "1"]) == 0
    assert main([*run, "--max-steps", "4", "--batch-size", "4", "--threads", "1", "--resume"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("held-out exact match: ")
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 4
    assert main([*run, "--d-model", "64", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnserve train: error: --resume: ") and "--d-model was 32, not 64" in err, err


DDP_WORKER = textwrap.dedent("""
    import sys, torch
    from attnserve.model import distributed
    from attnserve.model.config import preset
    from attnserve.model.train_seq2seq import Seq2SeqTrainConfig, train_seq2seq
    out = sys.argv[1]
    cfg = Seq2SeqTrainConfig(out_dir=out, max_steps=None, time_budget=1.0, batch_size=8, eval_interval=5,
                             eval_pairs=10, precision="fp32", progress=False)
    result = train_seq2seq(preset("tiny-seq2seq"), cfg, log=lambda _: None)
    rank = distributed.ranks_from_env().rank
    torch.save({"steps": result["steps"], "model": result["model"].state_dict()}, f"{out}/rank{rank}.pt")
""")


def test_ddp_two_processes_keep_identical_weights(tmp_path):
    rank0 = two_rank_run(tmp_path, DDP_WORKER)
    untrained = initial_weights()
    assert any(not torch.equal(t, untrained[n]) for n, t in rank0["model"].items())
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["world_size"] == 2 and 0.0 <= state["heldout_exact_match"] <= 1.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_trains_on_the_gpu_and_the_checkpoint_loads_on_the_cpu(tmp_path):
    result = tiny_run(tmp_path, max_steps=5, device="cuda")
    assert result["steps"] == 5 and all(p.is_cuda for p in result["model"].parameters())
    loaded = load_checkpoint(tmp_path / "checkpoint.pt")
    for name, tensor in result["model"].state_dict().items():
        assert torch.equal(tensor.cpu(), loaded.state_dict()[name]), name


@pytest.mark.parametrize(
    "field, value, named",
    [("eval_pairs", 0, "eval_pairs"), ("batch_size", 0, "--batch-size"), ("precision", "fp8", "--precision")],
)
def test_bad_options_are_refused_before_training(field, value, named):
    with pytest.raises(TrainError, match=f"^{named} "):
        Seq2SeqTrainConfig(**{field: value})
