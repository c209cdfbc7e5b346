"""`attnserve import` and `attnserve export` handed a hostile or broken checkpoint: a checkpoint's own code
never runs and stdin is never read; config.json is compared with the weights' safetensors headers
(layer count, then every known tensor's shape) before any module is built, so a config claiming a
million layers is refused at once and without allocating; NaN or infinite weights are refused, and a
proof whose difference is not finite fails; every malformed file (safetensors header, config.json,
the shards' index, a checkpoint.pt's config) is refused in one line naming the file and the field,
exit 2, no traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnserve.cli import main as cli_main

pytestmark = pytest.mark.trains  # imports a model with torch: out of `make test-fast`

MEMORY_CAP = 3 << 30  # address space of a refused import or export: torch loaded, no model built
CUSTOM_CODE = """
from pathlib import Path

Path({marker!r}).write_text("the checkpoint's code ran")

from transformers import PretrainedConfig, PreTrainedModel


class EvilConfig(PretrainedConfig):
    model_type = "evil"


class EvilModel(PreTrainedModel):
    config_class = EvilConfig
"""


def copied(hf_dir: Path, tmp_path: Path, **config) -> Path:
    """A copy of a checkpoint directory with fields of its config.json set (None: removed)."""
    hf = Path(shutil.copytree(hf_dir, tmp_path / "hf"))
    if config:
        found = json.loads((hf / "config.json").read_text())
        found.update(config)
        (hf / "config.json").write_text(json.dumps({k: v for k, v in found.items() if v is not None}))
    return hf


def refused(argv: list[str], capsys, command: str = "import") -> str:
    """The one line a refusal says (exit 2)."""
    capsys.readouterr()  # what building a session fixture said
    assert cli_main([command, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"attnserve {command}: error: "), err
    return err


def import_refused(hf: Path, tmp_path: Path, capsys) -> str:
    said = refused([str(hf), "--out", str(tmp_path / "run"), "--steps", "4"], capsys)
    assert not (tmp_path / "run").exists()
    return said


def run_cli(argv: list[str], tmp_path: Path, answer: bytes = b"y\n" * 8, timeout: float = 240):
    """`attnserve ARGV` in a process of its own with a capped address space, a stdin that answers
    `answer` to any question, and Hugging Face's caches in tmp_path. The child caps itself before it
    imports anything: a preexec_fn runs in a fork of this process, whose gRPC threads (the suite's
    servers) once wrote an error line of gRPC's into the child's stderr there."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cap = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_CAP}, {MEMORY_CAP}))"
    code = f"{cap}; import sys; from attnserve.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        input=answer,
        capture_output=True,
        env=env,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[1],
    )


def one_line(done: subprocess.CompletedProcess, command: str = "import") -> str:
    err = done.stderr.decode().strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, (done.returncode, err[-2000:])
    assert err.startswith(f"attnserve {command}: error: "), err
    return err


# Custom code


def test_a_checkpoints_own_code_never_runs_and_stdin_is_never_read(llama_dir, tmp_path):
    """An auto_map and a model type transformers does not know: transformers would ask "Do you wish to
    run the custom code? [y/N]"; the import refuses before asking it, and a 'y' waiting on stdin runs
    nothing."""
    marker = tmp_path / "ran"
    hf = copied(llama_dir, tmp_path, model_type="evil", auto_map={"AutoConfig": "evil.EvilConfig"})
    config = json.loads((hf / "config.json").read_text())
    config["auto_map"]["AutoModelForCausalLM"] = "evil.EvilModel"
    (hf / "config.json").write_text(json.dumps(config))
    (hf / "evil.py").write_text(CUSTOM_CODE.format(marker=str(marker)))
    said = one_line(run_cli(["import", str(hf), "--out", str(tmp_path / "run"), "--steps", "4"], tmp_path))
    assert "config.json: model_type 'evil' is not one attnserve imports" in said
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_an_auto_map_is_refused_even_beside_a_model_type_transformers_knows(llama_dir, tmp_path, capsys):
    hf = copied(llama_dir, tmp_path, auto_map={"AutoModelForCausalLM": "evil.EvilModel"})
    assert "config.json: auto_map names custom code, which attnserve never runs" in import_refused(hf, tmp_path, capsys)


# Config against weights, before anything is built


def test_a_million_layers_over_weights_of_two_are_refused_at_once_without_allocating(llama_dir, tmp_path):
    hf = copied(llama_dir, tmp_path, num_hidden_layers=1_000_000)
    said = one_line(run_cli(["import", str(hf), "--out", str(tmp_path / "run")], tmp_path, timeout=120))
    assert "config.json: num_hidden_layers 1000000: the weights hold 2 layers" in said


LAYOUTS = [  # (id, family, config fields, what the one line says)
    ("gpt2 layers", "gpt2", {"n_layer": 3}, "config.json: n_layer 3: the weights hold 2 layers"),
    ("gpt2 width", "gpt2", {"n_embd": 128}, "transformer.wte.weight has shape [400, 64], config.json's n_embd 128"),
    ("gpt2 positions", "gpt2", {"n_positions": 256}, "transformer.wpe.weight has shape [128, 64], config.json's n_pos"),
    ("llama kv heads", "llama", {"num_key_value_heads": 4}, "k_proj.weight has shape [32, 64], config.json's num_key"),
    ("llama ffn", "llama", {"intermediate_size": 256}, "gate_proj.weight has shape [128, 64], config.json's intermed"),
    (
        "marian fewer layers",
        "marian",
        {"decoder_layers": 1},
        "config.json: decoder_layers 1: the weights hold 2 layers",
    ),
    ("marian encoder", "marian", {"encoder_layers": 3}, "config.json: encoder_layers 3: the weights hold 2 layers"),
    ("marian ffn", "marian", {"encoder_ffn_dim": 64, "decoder_ffn_dim": 64}, "fc1.weight has shape [128, 64], config"),
]


@pytest.mark.parametrize("family, fields, message", [r[1:] for r in LAYOUTS], ids=[r[0] for r in LAYOUTS])
def test_a_config_that_the_weights_contradict_is_refused_naming_the_field(
    request, tmp_path, capsys, family, fields, message
):
    hf = copied(request.getfixturevalue(f"{family}_dir"), tmp_path, **fields)
    assert message in import_refused(hf, tmp_path, capsys)


# Non-finite weights and proofs


def spoil_tensor(hf: Path, name: str, spoil) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(hf / "model.safetensors"))
    spoil(weights[name])
    save_file(weights, str(hf / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_weights_are_refused_naming_the_file_and_the_tensor(llama_dir, tmp_path, capsys, value):
    hf = copied(llama_dir, tmp_path)
    spoil_tensor(hf, "model.layers.1.mlp.down_proj.weight", lambda t: t.view(-1).__setitem__(7, value))
    said = import_refused(hf, tmp_path, capsys)
    assert "model.safetensors: model.layers.1.mlp.down_proj.weight: 1 of 8192 values are NaN or infinite" in said


def test_a_proof_whose_logits_are_not_finite_fails(gpt2_dir, tmp_path, capsys):
    """Finite weights whose logits overflow float32 on both sides: the difference is NaN, which is no
    proof ("logits within nan")."""
    hf = copied(gpt2_dir, tmp_path)
    spoil_tensor(hf, "transformer.ln_f.weight", lambda t: t.fill_(3e38))
    capsys.readouterr()
    assert cli_main(["import", str(hf), "--out", str(tmp_path / "run"), "--steps", "4"]) == 1
    err = capsys.readouterr().err.strip()
    assert "the proof failed, nothing written: the logits are not finite" in err
    assert not (tmp_path / "run").exists()


# Malformed files, each in one line


def header_file(header: bytes, length: int | None = None) -> bytes:
    return (len(header) if length is None else length).to_bytes(8, "little") + header


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


SAFETENSORS = [  # (id, what the file becomes, what the one line says)
    ("truncated", truncate, "safetensors header: model."),  # the first tensor the cut reaches, then as below
    (
        "cut in a tensor",
        lambda p: p.write_bytes(
            header_file(b'{"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}') + b"\0" * 8
        ),
        "model.safetensors: safetensors header: x data_offsets [0, 16]: not within the file's 8 bytes of data",
    ),
    ("short", lambda p: p.write_bytes(b"\x01\x02"), "model.safetensors: shorter than a safetensors header"),
    (
        "length past the end",
        lambda p: p.write_bytes(header_file(b"{}", length=1 << 40)),
        "model.safetensors: safetensors header length 1099511627776 runs past the end of the file (10 bytes)",
    ),
    ("bad json", lambda p: p.write_bytes(header_file(b'{"a": ')), "model.safetensors: safetensors header: not JSON"),
    ("not an object", lambda p: p.write_bytes(header_file(b"[1, 2]")), "safetensors header: not a JSON object"),
    (
        "bad dtype",
        lambda p: p.write_bytes(header_file(b'{"x": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}') + b"\0"),
        "model.safetensors: safetensors header: x dtype 'Q9': not a safetensors dtype",
    ),
    (
        "size and shape disagree",
        lambda p: p.write_bytes(
            header_file(b'{"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 4]}}') + b"\0" * 4
        ),
        "model.safetensors: safetensors header: x data_offsets [0, 4]: 4 bytes, shape [3] of F32 needs 12",
    ),
    (
        "deep",
        lambda p: p.write_bytes(header_file(b"[" * 100_000 + b"]" * 100_000)),
        "model.safetensors: safetensors header: not JSON (nested too deep)",
    ),
]


@pytest.mark.parametrize("spoil, message", [r[1:] for r in SAFETENSORS], ids=[r[0] for r in SAFETENSORS])
def test_a_malformed_safetensors_file_is_refused_in_one_line(llama_dir, tmp_path, capsys, spoil, message):
    hf = copied(llama_dir, tmp_path)
    spoil(hf / "model.safetensors")
    said = import_refused(hf, tmp_path, capsys)
    assert f"{hf / 'model.safetensors'}: " in said and message in said


def deep_config(hf: Path) -> None:
    (hf / "config.json").write_text('{"architectures": ' + "[" * 100_000 + "]" * 100_000 + "}")


CONFIGS = [  # (id, config.json's fields set (None: removed), what the one line says)
    ("missing", {"n_embd": None}, "config.json: n_embd: missing"),
    ("a string", {"n_head": "four"}, "config.json: n_head 'four': not an integer from 1 to"),
    ("a fraction", {"n_layer": 2.5}, "config.json: n_layer 2.5: not an integer from 1 to"),
    ("a boolean", {"vocab_size": True}, "config.json: vocab_size True: not an integer from 1 to"),
    ("not finite", {"layer_norm_epsilon": float("nan")}, "config.json: layer_norm_epsilon nan: not a finite number"),
    ("a list", {"activation_function": ["gelu"]}, "config.json: activation_function ['gelu']: not a string"),
    ("architectures", {"architectures": 5}, "config.json: architectures 5: attnserve imports GPT2LMHeadModel"),
    ("no model_type", {"model_type": None}, "config.json: model_type None is not one attnserve imports"),
]


@pytest.mark.parametrize("fields, message", [r[1:] for r in CONFIGS], ids=[r[0] for r in CONFIGS])
def test_a_missing_or_mistyped_config_field_is_refused_naming_it(gpt2_dir, tmp_path, capsys, fields, message):
    assert message in import_refused(copied(gpt2_dir, tmp_path, **fields), tmp_path, capsys)


LLAMA_CONFIGS = [
    ("rope_scaling", {"rope_scaling": "linear"}, "config.json: rope_scaling 'linear': not a JSON object"),
    (
        "rope factor",
        {"rope_parameters": None, "rope_scaling": {"rope_type": "linear", "factor": "4"}},
        "config.json: rope_scaling: factor '4': not a finite number",
    ),
    ("sliding_window", {"sliding_window": "64"}, "config.json: sliding_window '64': not an integer"),
    ("kv heads", {"num_key_value_heads": 3}, "config.json: num_key_value_heads 3: must divide num_attention_heads 4"),
]


@pytest.mark.parametrize("fields, message", [r[1:] for r in LLAMA_CONFIGS], ids=[r[0] for r in LLAMA_CONFIGS])
def test_a_mistyped_llama_field_is_refused_naming_it(llama_dir, tmp_path, capsys, fields, message):
    assert message in import_refused(copied(llama_dir, tmp_path, **fields), tmp_path, capsys)


def test_a_config_nested_too_deep_is_refused_in_one_line(gpt2_dir, tmp_path, capsys):
    hf = copied(gpt2_dir, tmp_path)
    deep_config(hf)
    assert "config.json: not readable JSON (nested too deep)" in import_refused(hf, tmp_path, capsys)


def sharded(hf: Path, name: str) -> None:
    """model.safetensors named by an index as `name` (the file itself moved out of the directory)."""
    index = {"metadata": {}, "weight_map": {"model.norm.weight": name}}
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))


def outside(hf: Path) -> Path:
    """The checkpoint's own weights, moved beside the directory: a valid file, outside it."""
    there = hf.parent / "elsewhere.safetensors"
    os.replace(hf / "model.safetensors", there)
    return there


def linked(hf: Path) -> str:
    (hf / "model-00001-of-00001.safetensors").symlink_to(outside(hf))
    return "model-00001-of-00001.safetensors"


INDEX = "model.safetensors.index.json: weight_map"
INDEXES = [  # (id, the name the index gives, what the one line says)
    ("absolute", lambda hf: str(outside(hf)), f"{INDEX} names '/"),
    ("dot-dot", lambda hf: f"../{outside(hf).name}", f"{INDEX} names '../elsewhere.safetensors', outside "),
    ("symlink out", linked, f"{INDEX} names 'model-00001-of-00001.safetensors', which resolves outside "),
    ("not a name", lambda hf: 7, f"{INDEX} model.norm.weight 7: not a file name"),
]


@pytest.mark.parametrize("name, message", [r[1:] for r in INDEXES], ids=[r[0] for r in INDEXES])
def test_a_shard_index_naming_a_file_outside_the_directory_is_refused_unopened(
    llama_dir, tmp_path, capsys, name, message
):
    """The file named is the checkpoint's own weights, moved out: read, it would import."""
    hf = copied(llama_dir, tmp_path)
    sharded(hf, name(hf))
    assert message in import_refused(hf, tmp_path, capsys)


def test_a_shard_index_that_is_not_an_index_is_refused(llama_dir, tmp_path, capsys):
    hf = copied(llama_dir, tmp_path)
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model.safetensors"]}))
    said = import_refused(hf, tmp_path, capsys)
    assert "model.safetensors.index.json: weight_map ['model.safetensors']: not a JSON object" in said


# The export: a checkpoint.pt's config against its weights


def tiny_checkpoint(tmp_path: Path, **config) -> Path:
    """checkpoint.pt of attnserve's tiny preset, random weights, its config's fields overridden."""
    from attnserve.model.checkpoint import build_model
    from attnserve.model.config import preset

    model = build_model(preset("tiny"))
    path = tmp_path / "checkpoint.pt"
    torch.save({"config": {**model.config.to_dict(), **config}, "model": model.state_dict()}, path)
    return path


def test_the_export_refuses_a_million_layers_over_weights_of_two_at_once_without_allocating(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path, n_layers=1_000_000)
    done = run_cli(["export", str(checkpoint), "--out", str(tmp_path / "model")], tmp_path, timeout=120)
    assert "config n_layers 1000000: the weights hold 2 layers" in one_line(done, "export")


EXPORTS = [
    ("width", {"d_model": 128}, "embed.weight has shape [259, 64], config d_model 128 or max_len 128 gives [259, 128]"),
    ("field", {"n_layer": 2}, "config: ModelConfig.__init__() got an unexpected keyword argument 'n_layer'"),
    ("type", {"d_ff": "256"}, "config d_ff '256': not an integer"),
    ("positions", {"max_len": 10**9}, "max_len (1000000000) must be 1 to 2,097,152: its positional table"),
]


@pytest.mark.parametrize("config, message", [r[1:] for r in EXPORTS], ids=[r[0] for r in EXPORTS])
def test_the_export_refuses_a_config_its_weights_contradict_in_one_line(tmp_path, capsys, config, message):
    checkpoint = tiny_checkpoint(tmp_path, **config)
    assert message in refused([str(checkpoint), "--out", str(tmp_path / "model")], capsys, "export")


def test_a_marian_vocabulary_nested_too_deep_is_refused_in_one_line(marian_dir, tmp_path, capsys):
    hf = copied(marian_dir, tmp_path)
    (hf / "vocab.json").write_text("[" * 100_000 + "]" * 100_000)
    assert "vocab.json: JSON nested too deep" in import_refused(hf, tmp_path, capsys)
