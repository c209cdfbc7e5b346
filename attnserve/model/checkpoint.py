"""Checkpoints: config and weights (and optionally optimizer state), loaded with weights_only=True; the
config compared with the weights (layer count, then every tensor's shape) before a model is built."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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


def typed(config: Any, path: Path) -> None:
    """Refuses a field of a checkpoint's config not of its default's type (an int non-negative, a float finite)."""
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: config: not a dict")
    kinds = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}
    kinds[type(None)] = "a dict or null"
    for field in dataclasses.fields(ModelConfig):
        kind, value = type(field.default), config.get(field.name, field.default)
        fits = {
            int: type(value) is int and value >= 0,
            float: type(value) in (int, float) and math.isfinite(value),
            bool: type(value) is bool,
            str: type(value) is str,
            type(None): value is None or type(value) is dict,
        }[kind]
        if not fits:
            raise CheckpointError(f"{path}: config {field.name} {value!r:.60}: not {kinds[kind]}")


def layers_held(names: Iterable[str], stack: str) -> int:
    """1 + the highest layer index among names `stack`.{i}.*; 0 where none."""
    pattern = re.compile(rf"{re.escape(stack)}\.(\d{{1,9}})\.")
    return 1 + max((int(m.group(1)) for name in names if (m := pattern.match(name))), default=-1)


def checked_config(state: dict, path: str | Path) -> ModelConfig:
    """A checkpoint's config once its weights agree with it: each stack's layer count first (no module of
    a config claiming a million layers is built), then every tensor's name and shape against a model
    built on the meta device (no memory)."""
    weights, path = state["model"], Path(path)
    if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise CheckpointError(f"{path}: model: not a state dict of tensors")
    typed(state["config"], path)
    try:
        config = ModelConfig.from_dict(state["config"])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: config: {e}") from None
    for stack, field in (("layers", "n_layers"), ("encoder_layers", "n_encoder_layers")):
        count, held = getattr(config, field), layers_held(weights, stack)
        if held != count:
            raise CheckpointError(f"{path}: config {field} {count}: the weights hold {held} layers")
    try:
        with torch.device("meta"):
            expected = build_model(config).state_dict()
    except (TypeError, ValueError, KeyError) as e:  # a rope_scaling the model cannot build
        raise CheckpointError(f"{path}: config: {type(e).__name__}: {e}") from None
    for name, tensor in expected.items():
        if name not in weights:
            raise CheckpointError(f"{path}: the weights lack {name}")
        if weights[name].shape != tensor.shape:
            found = list(weights[name].shape)
            raise CheckpointError(f"{path}: {name} has shape {found}, {gives(config, tensor, found)}")
    unexpected = sorted(weights.keys() - expected.keys())
    if unexpected:
        raise CheckpointError(f"{path}: the weights hold {unexpected[0]}, which the config has no place for")
    return config


def gives(config: ModelConfig, expected: torch.Tensor, found: list[int]) -> str:
    """The shape the config gives, naming its fields of the sizes that differ ("config d_model 128 gives ...")."""
    parted = {size for size, got in zip(expected.shape, found) if size != got} or set(expected.shape)
    sizes = [f.name for f in dataclasses.fields(config) if type(f.default) is int]
    named = [f"{name} {getattr(config, name)}" for name in sizes if getattr(config, name) in parted]
    return f"config {' or '.join(named) or 'sizes'} gives {list(expected.shape)}"


def load_checkpoint(path: str | Path) -> LanguageModel:
    """The model of a checkpoint, in eval mode."""
    state = load_state(path)
    model = build_model(checked_config(state, path))
    model.load_state_dict(state["model"])
    return model.eval()
