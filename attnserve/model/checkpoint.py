"""Checkpoints: config and weights (and optionally optimizer state), loaded with weights_only=True."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .config import DECODER, ModelConfig
from .lm import DecoderLM
from .seq2seq import EncoderDecoder

LanguageModel = DecoderLM | EncoderDecoder  # what a checkpoint holds


class CheckpointError(Exception):
    """A checkpoint is missing, unreadable or not an attnserve checkpoint."""


def build_model(config: ModelConfig) -> LanguageModel:
    return DecoderLM(config) if config.arch == DECODER else EncoderDecoder(config)


def save_checkpoint(path: str | Path, model: LanguageModel, **extra) -> None:
    """Write atomically: a crash mid-save never leaves a truncated checkpoint behind."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save({"config": model.config.to_dict(), "model": model.state_dict(), **extra}, tmp)
    os.replace(tmp, path)


def load_state(path: str | Path) -> dict:
    """The raw checkpoint dict; raises CheckpointError with a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises several types for a corrupt file)
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable ({type(e).__name__})") from None
    if not isinstance(state, dict) or "config" not in state or "model" not in state:
        raise CheckpointError(f"{path} is not an attnserve checkpoint (no config/model entries)")
    return state


def load_checkpoint(path: str | Path) -> LanguageModel:
    """The model of a checkpoint, in eval mode."""
    state = load_state(path)
    model = build_model(ModelConfig.from_dict(state["config"]))
    model.load_state_dict(state["model"])
    return model.eval()
