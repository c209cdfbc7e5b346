"""Shared fixtures. Each fixture module owns one kind of artefact (trained checkpoint,
exported model directory, running server), built once per test run and shared."""

import os
import sys

import pytest

pytest_plugins = [
    "fixtures_train",
    "fixtures_export",
    "fixtures_server",
    "fixtures_seq2seq",
    "fixtures_tls",
    "fixtures_hf",
]  # fixture modules in tests/


# Session fixtures that train or build a model: a test that needs none of them (directly or through
# another fixture), and neither trains a model itself (`trains`) nor is `slow`, is marked `fast`, the
# edit loop's lane (`make test-fast`: pytest -m fast).
TRAINED = {"tiny_checkpoint", "tiny_bpe_checkpoint", "tiny_seq2seq_checkpoint", "gpt2_dir", "hf_dir", "marian_dir"}


def pytest_collection_modifyitems(items):
    for item in items:
        marked = item.get_closest_marker("slow") or item.get_closest_marker("trains")
        if TRAINED.isdisjoint(getattr(item, "fixturenames", ())) and marked is None:
            item.add_marker(pytest.mark.fast)


# Torch's threads per test process: two alone; one in each of make test's two workers, where two
# each oversubscribed the cores (the torch-heavy files, two workers alternating: 120 and 132 s with
# two threads each, 95 and 83 s with one; docs/reports/test-suite.md).
TORCH_THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


@pytest.fixture(autouse=True)
def _torch_threads():
    """Keep tests from oversubscribing the 2 cores when torch is loaded."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(TORCH_THREADS)
    yield
