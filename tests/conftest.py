"""Shared fixtures. Each fixture module owns one kind of artefact (trained checkpoint,
exported model directory, running server), built once per test run and shared."""

import pytest

pytest_plugins = [
    "fixtures_train",
    "fixtures_export",
    "fixtures_server",
    "fixtures_seq2seq",
    "fixtures_tls",
]  # fixture modules in tests/


@pytest.fixture(autouse=True)
def _torch_threads():
    """Keep tests from oversubscribing the 2 cores when torch is loaded."""
    import sys

    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(2)
    yield
