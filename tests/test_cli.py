"""The `attnserve` command itself: its version, written once (attnserve/__init__.py) and the same
in the installed package's metadata and `--version` (tests/test_oip.py checks that GetModelInfo's
server_version is the metadata's); and every default written once, in the config each subcommand's
flags are built from."""

import subprocess
import sys
from dataclasses import fields
from importlib import metadata
from pathlib import Path

import pytest

import attnserve
from attnserve.cli import subcommand_parser
from attnserve.clients.bench import BenchConfig
from attnserve.clients.client import DEFAULT_TIMEOUT
from attnserve.clients.types import GenerationParams
from attnserve.flags import flag_name
from attnserve.model.train import DEFAULT_BPE_VOCAB, TrainConfig
from attnserve.model.train_seq2seq import Seq2SeqTrainConfig
from attnserve.model.trainer import TrainerConfig


def test_version_is_written_once():
    done = subprocess.run([sys.executable, "-m", "attnserve.cli", "--version"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"attnserve {attnserve.__version__}"
    assert metadata.version("attnserve") == attnserve.__version__  # pyproject.toml reads it (dynamic)


@pytest.mark.parametrize(("command", "config"), [("generate", GenerationParams), ("bench", BenchConfig)])
def test_client_flags_are_built_from_their_config_fields(command, config):
    """Each field with help is a flag whose default is the field's, shown in its help: nowhere else."""
    actions = {a.dest: a for a in subcommand_parser(command)._actions}
    flagged = [f for f in fields(config) if "help" in f.metadata]
    assert flagged
    for f in flagged:
        action = actions[f.name]
        assert action.option_strings == [flag_name(f.name)], f.name
        assert action.default == f.default, f.name
        assert action.help.startswith(f.metadata["help"]) and "(default: " in action.help, f.name
    assert actions["timeout"].default == (DEFAULT_TIMEOUT if command == "generate" else BenchConfig.timeout)


def test_train_help_shows_each_architectures_defaults():
    """train's flags left out keep the preset's architecture's default; the help shows both configs'."""
    actions = {a.dest: a for a in subcommand_parser("train")._actions}
    for name in ("lr", "batch_size", "max_steps"):
        assert actions[name].default is None, name
    assert f"{TrainConfig.lr:g}; encoder-decoders {Seq2SeqTrainConfig.lr:g}" in actions["lr"].help
    assert f"{TrainConfig.batch_size}; encoder-decoders {Seq2SeqTrainConfig.batch_size}" in actions["batch_size"].help
    assert f"none; encoder-decoders {Seq2SeqTrainConfig.max_steps}" in actions["max_steps"].help
    assert actions["precision"].default == TrainerConfig.precision
    assert f"(default: {DEFAULT_BPE_VOCAB})" in actions["vocab_size"].help


def test_only_the_subcommand_asked_for_is_imported():
    """`attnserve serve --help` builds serve's flags without importing torch, grpc or the clients;
    `attnserve --help` imports no subcommand at all."""
    probe = (
        "import sys; from attnserve import cli; cli.build_parser({!r}); "
        "print(sorted(m for m in ('torch', 'grpc', 'onnxruntime', 'attnserve.clients', 'attnserve.model') "
        "if m in sys.modules))"
    )
    for command, expected in ((None, "[]"), ("serve", "[]"), ("generate", "['attnserve.clients', 'grpc']")):
        done = subprocess.run([sys.executable, "-c", probe.format(command)], capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.strip() == expected, (command, done.stdout, done.stderr)


NOT_PEM = "not a certificate\n"


@pytest.mark.parametrize(
    ("args", "stdin", "line"),
    [
        (["generate", "hi", "--seed", "-1"], None, "--seed: -1 is outside [0, 18446744073709551615]"),
        (["generate", "hi", "--seed", str(2**64)], None, f"--seed: {2**64} is outside [0, 18446744073709551615]"),
        # the ranges that need no model, in the server's words (attnserve/request_ranges.py): never sent
        (
            ["generate", "hi", "--max-new-tokens", "-5"],
            None,
            "--max-new-tokens: -5 is outside [0, 2147483647] (the server's cap narrows it)",
        ),
        (["generate", "hi", "--top-p", "2"], None, "--top-p: 2 is outside (0, 1]"),
        (["generate", "hi", "--temperature", "-1"], None, "--temperature: -1 is outside [0, 100]"),
        (["generate", "hi", "--logit-bias", "7=101"], None, "--logit-bias[7]: 101 is outside [-100, 100]"),
        (
            ["generate", "--prompt-token-ids", "5,-1"],
            None,
            "--prompt-token-ids[1]: -1 is outside [0, 2147483647] (the model's vocab_size narrows it)",
        ),
        (["bench", "--stream-interval-ms", "60001"], None, "--stream-interval-ms: 60001 is outside [0, 60000]"),
        (
            ["generate", "hi", "--tls-ca", "/no/such/ca.pem"],
            None,
            "--tls-ca /no/such/ca.pem: No such file or directory",
        ),
        (
            ["generate", "hi", "--tls-ca", "{tmp}/ca.pem"],
            None,
            "--tls-ca {tmp}/ca.pem: not a PEM file (no -----BEGIN line)",
        ),
        (
            ["generate", "-"],
            b"\xff\xfehello",
            "the prompt on stdin is not UTF-8 text (byte 0: b'\\xff'); pass token ids with --prompt-token-ids instead",
        ),
        (
            ["bench", "--out", "/no/such/dir/x.json"],
            None,
            "--out /no/such/dir/x.json: directory /no/such/dir does not exist",
        ),
        (["bench", "--plot", "{tmp}"], None, "--plot {tmp}: is a directory"),
        (
            ["bench", "--tls-cert", "{tmp}/ca.pem", "--tls-key", "{tmp}/ca.pem"],
            None,
            "--tls-cert {tmp}/ca.pem: not a PEM file (no -----BEGIN line)",
        ),
    ],
)
def test_a_client_flags_bad_value_is_one_line_before_any_call(tmp_path, args, stdin, line):
    """Nothing listens at the target: each refusal must come before the first call, in one line."""
    (tmp_path / "ca.pem").write_text(NOT_PEM)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    command = [sys.executable, "-m", "attnserve.cli", *args, "--target", "127.0.0.1:9"]
    done = subprocess.run(command, input=stdin, capture_output=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [f"attnserve {args[0]}: error: {line.replace('{tmp}', str(tmp_path))}"]
    assert not (tmp_path / "x.json").exists() and not Path("/no/such/dir").exists()
