"""Intra-op threads and spinning by the model's size (docs/design/decisions/intra-op-spinning.md): what
the real ONNX Runtime session is given when `attnserve serve` chooses, and when it is told; threads that
spin stop when a run returns."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np

from attnserve.runtime.model_sessions import LARGE_MODEL_BYTES, ModelSessions, default_threads, model_bytes
from attnserve.runtime.opening import open_slot_runner
from attnserve.runtime.ort_session import SPINNING, SPINNING_STOP


def cores() -> int:
    return len(os.sched_getaffinity(0))


def spinning(runner: ModelSessions) -> str:
    options = runner.session.get_session_options()
    assert options.get_session_config_entry(SPINNING_STOP) == "1"  # spinning or not, none past a run's end
    return options.get_session_config_entry(SPINNING)


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


def cpu_asleep_after_a_step(runner: ModelSessions, seconds: float) -> float:
    """The process's CPU seconds while it sleeps `seconds` right after a decode step of `runner`."""
    decoder = open_slot_runner(runner, 2, 16).decoder
    decoder.prefill(0, [[5, 6, 7, 8], [9, 10, 11, 12]])
    for _ in range(3):
        decoder.decode(np.array([5, 6]))
    start = time.process_time()
    time.sleep(seconds)
    return time.process_time() - start


def test_spinning_threads_sleep_once_a_run_returns(tiny_model_dir):
    """Threads told to spin spin within a run and stop when it returns: sleeping 100 ms right after a step
    costs the process next to no CPU, where ONNX Runtime's own default spins on for about 40 ms of a core
    (the host's work between steps, the draws and the front end, would share its core with it)."""
    runner = ModelSessions(tiny_model_dir, "cpu", threads=2, spinning=True)
    assert min(cpu_asleep_after_a_step(runner, 0.1) for _ in range(3)) < 0.01
