"""Training of the decoder LM: data windows, schedule, learning, checkpoints, resume, DDP."""

import itertools
import math
import textwrap

import pytest
import torch
from fixtures_train import BYTE_IDS, two_rank_run

from attnserve.model.checkpoint import build_model, load_checkpoint
from attnserve.model.config import preset
from attnserve.model.data import ByteBatches, DataError, heldout_batches, read_corpus, split_heldout
from attnserve.model.generate import generate
from attnserve.model.schedule import budget_progress, learning_rate
from attnserve.model.train import DEFAULT_BPE_VOCAB, TrainConfig, TrainError, lm_inputs, tokenize_corpus, train
from attnserve.tokenizer.utf8 import BOS_ID, encode

pytestmark = pytest.mark.trains  # trains or imports a model with torch: out of `make test-fast`

QUIET = dict(progress=False, time_budget=None, eval_windows=16, batch_size=8, threads=1)


def tiny_run(out, **overrides):
    """Train the tiny preset for a few steps into `out`; returns train()'s result."""
    return train(preset("tiny"), TrainConfig(out_dir=str(out), **{**QUIET, **overrides}), log=lambda _: None)


def initial_weights() -> dict:
    """The tiny model's weights under seed 0, before training."""
    torch.manual_seed(0)
    return build_model(preset("tiny")).state_dict()


def test_windows_start_with_bos_and_targets_are_the_next_bytes():
    data = bytes(range(200)) * 3
    x, y = ByteBatches(data, block=16, batch_size=4, seed=0).batch(step=7)
    assert x.shape == y.shape == (4, 16)
    assert (x[:, 0] == BOS_ID).all()
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert all((row[1:] - row[:-1] == 1).all() or 0 in row.tolist() for row in y)  # contiguous bytes


def test_batches_are_reproducible_per_step_and_differ_per_rank():
    data = bytes(range(256)) * 20
    a, b = ByteBatches(data, 32, 8, seed=1, rank=0), ByteBatches(data, 32, 8, seed=1, rank=1)
    assert torch.equal(a.batch(3)[0], ByteBatches(data, 32, 8, seed=1, rank=0).batch(3)[0])
    assert not torch.equal(a.batch(3)[0], a.batch(4)[0])
    assert not torch.equal(a.batch(3)[0], b.batch(3)[0])


def test_heldout_is_the_tail_and_ranks_share_its_windows():
    data = bytes(1000) + b"x" * 200
    train_part, heldout = split_heldout(data, block=64, fraction=0.1)
    assert train_part + heldout == data and len(heldout) == 120
    everything = heldout_batches(heldout, 32, 2, 100)
    halves = heldout_batches(heldout, 32, 2, 100, rank=0, world_size=2) + heldout_batches(
        heldout, 32, 2, 100, rank=1, world_size=2
    )
    assert sum(len(y) for _, y in everything) == sum(len(y) for _, y in halves) == 3


def test_default_corpus_is_cpythons_pydoc_topics():
    from pydoc_data.topics import topics

    data = read_corpus(None)
    assert len(data) > 100_000 and data.startswith(topics[min(topics)].encode())


def test_a_folder_corpus_joins_its_txt_files_in_order(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"second")
    (tmp_path / "a.txt").write_bytes(b"first")
    (tmp_path / "notes.md").write_bytes(b"ignored")
    assert read_corpus(tmp_path) == b"first\nsecond"


def corpus_case(tmp_path, case: str):
    if case == "empty file":
        (tmp_path / "empty.txt").write_bytes(b"")
        return tmp_path / "empty.txt"
    if case == "folder without .txt":
        (tmp_path / "d").mkdir()
        return tmp_path / "d"
    return tmp_path / "missing.txt"


@pytest.mark.parametrize(
    "case, expected",
    [("missing", "no such file or folder"), ("empty file", "is empty"), ("folder without .txt", "no .txt files")],
)
def test_corpus_errors_are_one_line(tmp_path, case, expected):
    with pytest.raises(DataError, match=expected) as info:
        read_corpus(corpus_case(tmp_path, case))
    assert "\n" not in str(info.value)


def test_corpus_shorter_than_two_blocks_is_refused():
    with pytest.raises(DataError, match="too short: 200 bytes, need at least 256"):
        split_heldout(b"a" * 200, block=128)


def test_schedule_warms_up_linearly_then_decays_to_the_floor():
    lrs = [learning_rate(s, budget_progress(s, 0.0, 100, None, 10), 1.0, 10, 0.1) for s in range(101)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))
    assert lrs[100] == pytest.approx(0.1)
    assert budget_progress(5, 30.0, None, 60.0) == pytest.approx(0.5)  # a time budget drives the decay too


def test_heldout_bits_per_byte_is_mean_nats_over_ln2(tmp_path):
    bpb = tiny_run(tmp_path, max_steps=0, tokenizer="bytes")["heldout_bpb"]  # the untrained model, seed 0
    model = build_model(preset("tiny"))
    model.load_state_dict(initial_weights())
    _, heldout = split_heldout(read_corpus(None), 128)
    nats, count = 0.0, 0
    for x, y in heldout_batches(heldout, 128, 8, QUIET["eval_windows"]):
        logits = model(*lm_inputs(x, model.config))[0]
        nats += torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum"
        ).item()
        count += y.numel()
    assert bpb == pytest.approx(nats / count / math.log(2), rel=1e-5)
    assert 6.0 < bpb < 10.0  # near log2(259): guessing


def test_bpe_heldout_loss_is_per_byte_of_the_text_its_tokens_stand_for(tmp_path):
    cfg = TrainConfig(out_dir=str(tmp_path), tokenizer="bpe", vocab_size=512, **{**QUIET, "max_steps": 0})
    result = train(preset("tiny"), cfg, log=lambda _: None)  # the untrained model, seed 0
    corpus = tokenize_corpus(read_corpus(None), cfg, 128, None)
    lengths = corpus.tokenizer.byte_lengths()  # bytes per id: they add up to the held-out text
    heldout_text = split_heldout(read_corpus(None), 128, whole_characters=True)[1]
    assert sum(lengths[t] for t in corpus.heldout) == len(heldout_text)
    model, nats, count, tokens = result["model"], 0.0, 0, 0
    for x, y in heldout_batches(corpus.heldout, 128, 8, QUIET["eval_windows"], bos=None):
        logits = model(*lm_inputs(x, model.config))[0]
        nats += torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum"
        ).item()
        count += sum(lengths[t] for t in y.reshape(-1).tolist())
        tokens += y.numel()
    assert result["heldout_bpb"] == pytest.approx(nats / count / math.log(2), rel=1e-5)
    assert count > 2 * tokens  # a BPE token stands for several bytes


def test_tiny_checkpoint_learned_text(tiny_checkpoint):
    state = torch.load(tiny_checkpoint, weights_only=True)
    assert state["heldout_bpb"] < 3.2, state["heldout_bpb"]  # untrained: about 8
    out = bytes(generate(load_checkpoint(tiny_checkpoint), [encode("The ")], 64, **BYTE_IDS)[0])
    assert len(set(out)) >= 4 and b" " in out and out.count(b" ") < 40, out  # words, not one repeated byte


def test_checkpoint_round_trip_is_weights_only(tmp_path):
    result = tiny_run(tmp_path, max_steps=5)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["step"] == 5 and state["config"] == preset("tiny", vocab_size=DEFAULT_BPE_VOCAB).to_dict()
    assert state["train_config"]["max_steps"] == 5 and "state" in state["optimizer"]
    assert state["heldout_bpb"] == pytest.approx(result["heldout_bpb"]) == pytest.approx(state["best_heldout_bpb"])
    loaded = load_checkpoint(tmp_path / "checkpoint.pt")
    assert loaded.config == preset("tiny", vocab_size=DEFAULT_BPE_VOCAB)  # the default tokenizer's
    for name, tensor in result["model"].state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_resume_continues_exactly_where_it_stopped(tmp_path):
    constant = dict(min_lr_ratio=1.0, warmup_steps=2)  # the lr then does not depend on max_steps
    straight = tiny_run(tmp_path / "a", max_steps=12, **constant)
    tiny_run(tmp_path / "b", max_steps=7, **constant)
    resumed = tiny_run(tmp_path / "b", max_steps=12, resume=True, **constant)
    assert (resumed["start_step"], resumed["steps"]) == (7, 12)
    state = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert state["step"] == 12 and all(int(s["step"]) == 12 for s in state["optimizer"]["state"].values())
    for name, tensor in straight["model"].state_dict().items():
        torch.testing.assert_close(resumed["model"].state_dict()[name], tensor, rtol=1e-5, atol=1e-6)


def test_resume_refuses_a_missing_or_different_checkpoint(tmp_path):
    with pytest.raises(TrainError, match="checkpoint not found"):
        tiny_run(tmp_path, max_steps=1, resume=True)
    tiny_run(tmp_path, max_steps=1)
    with pytest.raises(TrainError, match="another model config"):
        train(preset("tiny", d_ff=32), TrainConfig(out_dir=str(tmp_path), resume=True, **QUIET))


DDP_WORKER = textwrap.dedent("""
    import sys, torch
    from attnserve.model import distributed
    from attnserve.model.config import preset
    from attnserve.model.train import TrainConfig, train
    out = sys.argv[1]
    cfg = TrainConfig(out_dir=out, max_steps=None, time_budget=1.0, batch_size=8, eval_interval=5,
                      eval_windows=16, progress=False)
    result = train(preset("tiny"), cfg, log=lambda _: None)
    rank = distributed.ranks_from_env().rank
    torch.save({"steps": result["steps"], "model": result["model"].state_dict()}, f"{out}/rank{rank}.pt")
""")


def test_ddp_two_processes_keep_identical_weights(tmp_path):
    rank0 = two_rank_run(tmp_path, DDP_WORKER)
    untrained = initial_weights()
    assert any(not torch.equal(t, untrained[n]) for n, t in rank0["model"].items())
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["world_size"] == 2


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("batch_size", 0, "--batch-size"),
        ("max_steps", -1, "--max-steps"),
        ("time_budget", 0.0, "--time-budget"),
        ("precision", "fp8", "--precision"),
        ("lr", -1.0, "--lr"),
        ("eval_windows", 0, "eval_windows"),  # not a flag: the field's own name
    ],
)
def test_bad_train_options_are_refused_before_training_naming_the_flag(field, value, named):
    with pytest.raises(TrainError, match=f"^{named} "):
        TrainConfig(**{field: value})


def train_cli(capsys, *args: str) -> tuple[int, str]:
    """`attnserve train ARGS` in-process: (exit code, stderr)."""
    from attnserve.cli import main

    code = main(["train", *args])
    return code, capsys.readouterr().err


def test_model_size_flags_override_the_preset(tmp_path, capsys):
    code, err = train_cli(
        capsys,
        "--preset",
        "tiny",
        "--context-length",
        "256",
        "--d-model",
        "32",
        "--n-heads",
        "2",
        "--n-layers",
        "1",
        "--d-ff",
        "64",
        "--max-steps",
        "2",
        "--batch-size",
        "8",
        "--threads",
        "1",
        "--out",
        str(tmp_path),
    )
    assert code == 0, err
    config = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["config"]
    assert (
        config
        == preset(
            "tiny", max_len=256, d_model=32, n_heads=2, n_layers=1, d_ff=64, vocab_size=DEFAULT_BPE_VOCAB
        ).to_dict()
    )


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--d-model", "48", "--n-heads", "5"], "--d-model 48 is not divisible by --n-heads 5"),
        (
            ["--d-model", "48", "--n-heads", "4"],
            "head dim --d-model 48 / --n-heads 4 = 12 must be a multiple of 8 "
            "(ONNX Runtime's GroupQueryAttention requires it)",
        ),
        (["--n-heads", "3"], "--d-model 64 is not divisible by --n-heads 3"),  # the preset's d_model
        (["--d-model", "0"], "--d-model must be a positive integer, got 0"),
        (["--n-layers", "-1"], "--n-layers must be a positive integer, got -1"),
        (["--d-ff", "0"], "--d-ff must be a positive integer, got 0"),
        (["--context-length", "4"], "--context-length must be at least 8, got 4"),
    ],
)
def test_bad_model_size_flags_are_one_line_errors(tmp_path, capsys, flags, expected):
    code, err = train_cli(capsys, "--preset", "tiny", *flags, "--out", str(tmp_path / "run"))
    assert code == 2 and err == f"attnserve train: error: {expected}\n", err
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_resume_names_the_model_flag_that_differs(tmp_path, capsys):
    tiny_run(tmp_path, max_steps=1)
    code, err = train_cli(
        capsys, "--preset", "tiny", "--d-model", "32", "--resume", "--threads", "1", "--out", str(tmp_path)
    )
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("attnserve train: error: --resume: ") and "--d-model was 64, not 32" in err, err


def test_rotary_positions_train_export_and_pass_the_gates(tmp_path, capsys):
    """--positional rotary (Llama's positions, on the lectures' model): the checkpoint's config says so, the
    export turns q and k inside each GroupQueryAttention (the tiny model's head size, 16, lets it) and its
    parity gate passes; a resume that asks for other positions is refused naming the flag."""
    import json

    import onnx

    from attnserve.cli import main
    from attnserve.runtime import contract

    run, model = tmp_path / "run", tmp_path / "model"
    tiny = ("--preset", "tiny", "--batch-size", "8", "--threads", "1", "--out", str(run))
    code, err = train_cli(capsys, *tiny, "--positional", "rotary", "--max-steps", "2")
    assert code == 0, err
    config = torch.load(run / "checkpoint.pt", weights_only=True)["config"]
    assert config == preset("tiny", positional="rotary", vocab_size=DEFAULT_BPE_VOCAB).to_dict()
    assert main(["export", str(run / "checkpoint.pt"), "--out", str(model)]) == 0
    assert json.loads((model / contract.MANIFEST_FILE).read_text())["parity"]["passed"]
    nodes = onnx.load(str(model / contract.MODEL_FILE)).graph.node
    turns = [{a.name: a.i for a in n.attribute}.get("do_rotary") for n in nodes if n.op_type == "GroupQueryAttention"]
    assert turns == [1] * config["n_layers"]
    code, err = train_cli(capsys, *tiny, "--resume", "--max-steps", "3")  # the preset's sinusoidal positions
    assert code == 2 and "--positional was rotary, not sinusoidal" in err, err
