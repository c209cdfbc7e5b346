"""Shared fixtures. Each fixture module owns one kind of artefact (trained checkpoint,
exported model directory, running server), built once per test run and shared."""

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


@pytest.fixture(autouse=True)
def _torch_threads():
    """Keep tests from oversubscribing the 2 cores when torch is loaded."""
    import sys

    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(2)
    yield
