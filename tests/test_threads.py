"""Intra-op threads and spinning by the model's size (docs/design/decisions/intra-op-spinning.md): what
the real ONNX Runtime session is given when `attnserve serve` chooses, and when it is told."""

from __future__ import annotations

import os
import shutil

from attnserve.runtime.model_sessions import LARGE_MODEL_BYTES, ModelSessions, default_threads, model_bytes

SPINNING = "session.intra_op.allow_spinning"


def cores() -> int:
    return len(os.sched_getaffinity(0))


def spinning(runner: ModelSessions) -> str:
    return runner.session.get_session_options().get_session_config_entry(SPINNING)


def test_a_large_model_gets_every_core_and_a_small_one_leaves_one_to_the_front_end():
    assert default_threads(LARGE_MODEL_BYTES) == cores()
    assert default_threads(LARGE_MODEL_BYTES - 1) == max(1, cores() - 1)
    assert default_threads() == max(1, cores() - 1)


def test_a_small_model_chosen_for_sleeps_and_a_told_session_spins(tiny_model_dir):
    assert model_bytes(tiny_model_dir) < LARGE_MODEL_BYTES
    chosen = ModelSessions(tiny_model_dir, "cpu")
    assert (chosen.threads, chosen.spinning, spinning(chosen)) == (max(1, cores() - 1), False, "0")
    told = ModelSessions(tiny_model_dir, "cpu", threads=2, spinning=True)
    assert (told.threads, told.spinning, spinning(told)) == (2, True, "1")


def test_a_model_of_the_bound_is_chosen_for_as_large(tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for f in tiny_model_dir.iterdir():  # copied: a model directory's files may not be symlinks out of it
        shutil.copy(f, model / f.name)
    (model / "padding.data").write_bytes(b"\0" * (LARGE_MODEL_BYTES - model_bytes(tiny_model_dir)))
    runner = ModelSessions(model, "cpu")
    assert (runner.threads, runner.spinning, spinning(runner)) == (cores(), True, "1")
