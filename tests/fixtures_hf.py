"""Session fixtures: Hugging Face checkpoint directories of each family made from configs at test time
(benchmarks/hf_checkpoints.py: random weights, a BPE trained here; nothing downloaded), imported into
attnserve and exported, each once."""

from __future__ import annotations

from pathlib import Path

import pytest
from built_once import built_once
from fixtures_export import exported

from benchmarks.hf_checkpoints import save_hf

FAMILIES = ("gpt2", "llama", "qwen2", "mistral")


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory):
    """A Hugging Face GPT-2 checkpoint directory: config.json, model.safetensors, tokenizer.json, ..."""
    return built_once(tmp_path_factory, "hf/gpt2-tiny", lambda out: save_hf(out, "gpt2"))


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """A Hugging Face Llama checkpoint directory (grouped KV heads, an untied head, BOS first)."""
    return built_once(tmp_path_factory, "hf/llama-tiny", lambda out: save_hf(out, "llama"))


@pytest.fixture(scope="session", params=FAMILIES)
def hf_dir(request, tmp_path_factory, gpt2_dir, llama_dir):
    """A checkpoint directory of each family in turn."""
    made = {"gpt2": gpt2_dir, "llama": llama_dir}
    family = request.param
    return made.get(family) or built_once(tmp_path_factory, f"hf/{family}-tiny", lambda out: save_hf(out, family))


def imported(tmp_path_factory, checkpoint_dir: Path) -> Path:
    """runs/NAME/checkpoint.pt of a Hugging Face directory imported once per test run (attnserve
    import, its proof against transformers over 64 steps passed)."""
    from attnserve.model.hf.import_cli import run

    name = f"runs/{checkpoint_dir.name}"
    return built_once(tmp_path_factory, name, lambda out: run(checkpoint_dir, out, steps=64)) / "checkpoint.pt"


@pytest.fixture(scope="session")
def hf_checkpoint(hf_dir, tmp_path_factory):
    """runs/NAME/checkpoint.pt of the imported directory; its proof against transformers has passed."""
    return imported(tmp_path_factory, hf_dir)


@pytest.fixture(scope="session")
def hf_model_dir(hf_checkpoint, tmp_path_factory):
    """The imported model exported (float32, the arena); the export's parity gate has passed."""
    return exported(tmp_path_factory, hf_checkpoint.parent.name, hf_checkpoint)


@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory):
    """A Hugging Face Marian checkpoint directory (MarianMTModel, OPUS-MT's settings at a small width):
    config.json, model.safetensors, source.spm, target.spm, vocab.json, trained and drawn here."""
    from benchmarks.hf_checkpoints import save_marian

    return built_once(tmp_path_factory, "hf/marian-tiny", save_marian)


@pytest.fixture(scope="session")
def marian_checkpoint(marian_dir, tmp_path_factory):
    """runs/NAME/checkpoint.pt of the imported Marian directory; its proof against transformers has passed."""
    return imported(tmp_path_factory, marian_dir)


@pytest.fixture(scope="session")
def marian_model_dir(marian_checkpoint, tmp_path_factory):
    """The imported Marian model exported (float32, the arena); its parity gate has passed."""
    return exported(tmp_path_factory, marian_checkpoint.parent.name, marian_checkpoint)
