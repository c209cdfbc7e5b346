"""Hostile model directories (issue 58): each is consistent (its sha256 list recomputed) but lies, and
`attnserve serve` refuses it in one line, exit code 2, before the arena is sized or a request is taken:
a manifest path leaving the directory, a checksum list that is empty or leaves a file out, dims or a
context the graph does not have, an arena larger than memory, an oversized tokenizer.json, and a
graph ONNX Runtime cannot load (whose class and message the front end says, whichever the core)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from attnserve.core.client import EngineClient
from attnserve.core.loading import TOKENIZER_MAX_BYTES, StartupError
from attnserve.engine.engine import EngineObserver
from attnserve.runtime import contract
from attnserve.runtime.model_sessions import ModelSessions
from attnserve.server.config import ServerConfig

Edit = Callable[[dict[str, Any], Path], None]


def hostile(tiny_model_dir: Path, tmp_path: Path, edit: Edit | None = None) -> Path:
    """A copy of the tiny model directory, its manifest edited by `edit(raw, directory)`, then every
    listed file's sha256 recomputed: only the check under test can tell it is wrong."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    path = model / contract.MANIFEST_FILE
    raw = json.loads(path.read_text())
    if edit is not None:
        edit(raw, model)
    raw["files"] = {
        name: contract.sha256_file(model / name) if (model / name).is_file() else digest
        for name, digest in raw["files"].items()
    }
    path.write_text(json.dumps(raw))
    return model


def serve_refused(model: Path, *flags: str) -> str:
    """`attnserve serve --model MODEL` expected to refuse: its one line of output (exit code 2)."""
    args = ["--model", str(model), "--port", "0", "--provider", "cpu", "--threads", "1", *flags]
    proc = subprocess.run(
        [sys.executable, "-m", "attnserve.cli", "serve", *args], capture_output=True, text=True, timeout=120
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnserve serve: error: "), output
    return lines[0]


def sessions_refused(model: Path) -> str:
    """What ModelSessions (the core's first step) refuses `model` with."""
    with pytest.raises(contract.ModelDirError) as refused:
        ModelSessions(model, "cpu", threads=1)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_an_untouched_copy_is_served(tiny_model_dir, tmp_path):
    """The helper alone breaks nothing: every refusal below is its edit's."""
    model = hostile(tiny_model_dir, tmp_path)
    assert ModelSessions(model, "cpu", threads=1).context_length == 128


# ---- 1. every path stays inside the directory -------------------------------------------------


def outside_graph(raw: dict[str, Any], model: Path) -> None:
    raw["graphs"]["decoder"]["file"] = "/etc/passwd"
    raw["files"]["/etc/passwd"] = ""


def test_a_graph_named_by_absolute_path_is_refused_by_the_server(tiny_model_dir, tmp_path):
    line = serve_refused(hostile(tiny_model_dir, tmp_path, outside_graph))
    assert "graphs.decoder.file" in line and "'/etc/passwd'" in line and "absolute" in line


def climbing_checksum(raw: dict[str, Any], model: Path) -> None:
    (model.parent / "outside.json").write_text("{}")
    raw["files"]["../outside.json"] = ""


def absolute_tokenizer(raw: dict[str, Any], model: Path) -> None:
    raw["tokenizer"]["file"] = "/etc/hostname"
    raw["files"]["/etc/hostname"] = ""


def symlinked_graph(raw: dict[str, Any], model: Path) -> None:
    shutil.copy(model / contract.MODEL_FILE, model.parent / "elsewhere.onnx")
    (model / "link.onnx").symlink_to(model.parent / "elsewhere.onnx")
    raw["graphs"]["decoder"]["file"] = "link.onnx"
    raw["files"]["link.onnx"] = ""


@pytest.mark.parametrize(
    "edit, field, name, why",
    [
        (climbing_checksum, "files", "../outside.json", ".."),
        (absolute_tokenizer, "tokenizer.file", "/etc/hostname", "absolute"),
        (symlinked_graph, "graphs.decoder.file", "link.onnx", "outside"),
    ],
    ids=["dotdot", "absolute", "symlink"],
)
def test_a_manifest_path_that_leaves_the_directory_is_refused(tiny_model_dir, tmp_path, edit, field, name, why):
    model = hostile(tiny_model_dir, tmp_path, edit)
    for verify in (True, False):  # the front end reads the manifest unverified, then the tokenizer
        with pytest.raises(contract.ModelDirError) as refused:
            contract.read_manifest(model, verify=verify)
        message = str(refused.value)
        assert f"{field} names {name!r}" in message and why in message and "\n" not in message


# ---- 2. the checksum list covers every file and is never empty ----------------------------------


def test_an_empty_checksum_list_is_refused_by_the_server(tiny_model_dir, tmp_path):
    model = hostile(tiny_model_dir, tmp_path, lambda raw, _: raw.update(files={}))
    line = serve_refused(model)
    assert "files is empty" in line


def test_a_graph_left_out_of_the_checksum_list_is_refused(tiny_model_dir, tmp_path):
    model = hostile(tiny_model_dir, tmp_path, lambda raw, _: raw["files"].pop(contract.MODEL_FILE))
    with pytest.raises(contract.ModelDirError, match=r"graphs\.decoder\.file names 'model\.onnx', which files"):
        contract.read_manifest(model)


def test_external_data_left_out_of_the_checksum_list_is_refused(tiny_model_dir, tmp_path):
    import onnx

    def external(raw: dict[str, Any], model: Path) -> None:
        graph = onnx.load(str(model / contract.MODEL_FILE))
        onnx.save_model(graph, str(model / contract.MODEL_FILE), save_as_external_data=True, location="weights.bin")

    message = sessions_refused(hostile(tiny_model_dir, tmp_path, external))
    assert "'weights.bin'" in message and "files" in message


# ---- 3. the manifest agrees with the graph ---------------------------------------------------------


def test_a_context_beyond_the_graphs_positions_is_refused_by_the_server(tiny_model_dir, tmp_path):
    """200,000 positions on a graph whose sinusoid table has 128: refused before the arena is sized."""
    model = hostile(tiny_model_dir, tmp_path, lambda raw, _: raw["config"].update(max_len=200_000))
    line = serve_refused(model)
    assert "config.max_len is 200000" in line and "128" in line


def more_layers(raw: dict[str, Any], model: Path) -> None:
    raw["config"]["n_layers"] = 3  # and the recorded names to match: the manifest is consistent
    spec = contract.graph_specs(contract.DECODER_ONLY, 3, contract.KV_ARENA)[contract.DECODER]
    raw["graphs"]["decoder"].update(inputs=list(spec.inputs), outputs=list(spec.outputs))


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda raw, _: raw["config"].update(vocab_size=300), "config.vocab_size is 300, the graph's is 259"),
        (more_layers, "config.n_layers is 3, the graph's is 2"),
        (lambda raw, _: raw["config"].update(n_kv_heads=2), "config.n_kv_heads is 2, the graph's is 4"),
        (lambda raw, _: raw.update(head_dim=32), "head_dim is 32, the graph's is 16"),
        (lambda raw, _: raw.update(dtype="float16"), "dtype is 'float16', the graph's is 'float32'"),
        (lambda raw, _: raw["config"].update(max_len=129), "config.max_len is 129, the graph's is 128"),
    ],
    ids=["vocab", "layers", "heads", "head-dim", "dtype", "context"],
)
def test_a_manifest_dim_the_graph_does_not_have_is_refused(tiny_model_dir, tmp_path, edit, said):
    assert said in sessions_refused(hostile(tiny_model_dir, tmp_path, edit))


# ---- 4. the arena fits the memory there is ----------------------------------------------------------


def test_an_arena_larger_than_memory_is_refused_before_it_is_allocated(tiny_model_dir):
    line = serve_refused(tiny_model_dir, "--max-batch", "100000000")
    assert "--max-batch 100000000" in line and "128-position context" in line
    assert "13,107,200,000,000-byte KV arena" in line and "bytes available" in line


# ---- 5. the tokenizer file has a size bound ---------------------------------------------------------


def test_an_oversized_tokenizer_json_is_refused(tiny_model_dir, tmp_path):
    def huge_tokenizer(raw: dict[str, Any], model: Path) -> None:
        with open(model / "tokenizer.json", "wb") as f:
            f.truncate(TOKENIZER_MAX_BYTES + 1)
        raw["tokenizer"].update(kind="bpe", file="tokenizer.json")
        raw["files"]["tokenizer.json"] = ""

    line = serve_refused(hostile(tiny_model_dir, tmp_path, huge_tokenizer))
    assert "tokenizer.json" in line and f"{TOKENIZER_MAX_BYTES + 1:,} bytes" in line
    assert f"{TOKENIZER_MAX_BYTES:,}" in line


def test_a_tokenizer_with_more_ids_than_the_models_vocabulary_is_refused(tiny_model_dir, tmp_path):
    """An id past the embedding would fail every request of the step it is fed in: refused at start-up."""
    from attnserve.core.loading import load_tokenizer

    model = hostile(tiny_model_dir, tmp_path, lambda raw, _: raw["config"].update(vocab_size=200))
    with pytest.raises(StartupError, match=r"the tokenizer has 259 ids, more than the model's 200 \(config"):
        load_tokenizer(model, contract.read_manifest(model))


# ---- 6. the core says why it did not start -------------------------------------------------------


@pytest.mark.parametrize("engine_core", ["process", "thread"])
def test_a_graph_onnx_runtime_cannot_load_is_refused_with_its_error(tiny_model_dir, tmp_path, engine_core):
    """A corrupt model.onnx whose sha256 was recomputed: ONNX Runtime's error class and message, in one
    line, from the core's process too (not only "the engine core exited during start-up")."""

    def corrupt(raw: dict[str, Any], model: Path) -> None:
        size = os.path.getsize(model / contract.MODEL_FILE)
        with open(model / contract.MODEL_FILE, "r+b") as f:
            f.truncate(size // 2)

    line = serve_refused(hostile(tiny_model_dir, tmp_path, corrupt), "--engine-core", engine_core)
    assert "model.onnx" in line and "InvalidProtobuf" in line and "exited during start-up" not in line


def test_a_core_process_failing_with_any_exception_says_its_class_and_message(tiny_model_dir):
    """Whatever the core's start-up raises reaches the front end as one line with its class (here a
    TypeError from a mistyped setting), not only "the engine core exited during start-up"."""
    config = replace(ServerConfig(model=str(tiny_model_dir), provider="cpu").core(), threads="many")
    with pytest.raises(StartupError) as refused:
        EngineClient(config, EngineObserver(), max_buffered=16)
    message = str(refused.value)
    assert message.startswith("the engine core failed to start: TypeError: ") and "\n" not in message
