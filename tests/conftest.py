"""Shared fixtures. Each fixture module owns one kind of artefact (trained checkpoint,
exported model directory, running server), built once per test run and shared."""

import fcntl
import os
import sys
import time

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


@pytest.fixture(autouse=True)
def _alone_or_beside(request, tmp_path_factory):
    """Under make test's two workers, a test marked `alone` (a load scenario sized for this machine, which
    the other worker's tests beside it would double or change halfway: test_overload's thousand calls a
    second failed so twice in a dozen runs beside CI's CPU burner, and its four times capacity once, its
    capacity measured beside one load and its refusals beside another) runs while the other worker
    waits: it takes the run's lock alone, every other test shares it. Its intent file keeps the other
    worker from taking the lock again between two of its tests. Run without workers, nothing is held."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    root = tmp_path_factory.getbasetemp().parent  # the run's directory, shared by its workers (built_once.py)
    alone, intent = request.node.get_closest_marker("alone") is not None, root / "alone.intent"
    with open(root / "alone.lock", "a+") as lock:
        if alone:
            intent.touch()
        while not alone and intent.exists():
            time.sleep(0.05)  # polled: the other worker's test holds the run until it ends
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            if alone:
                intent.unlink(missing_ok=True)
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(params=["compiled", "numpy"])
def whole_draw_kind(request, monkeypatch):
    """Each test of the host's draw once with the compiled whole-row draw (engine/whole_draw.c; skipped where
    it is not built, which tests/test_whole_draw.py does not allow where a C compiler is) and once with
    numpy's alone."""
    from attnserve.engine import whole_draw

    if request.param == "numpy":
        monkeypatch.setattr(whole_draw, "LIBRARY", None)
    elif not whole_draw.available():
        pytest.skip("the compiled whole-row draw is not built here")
    return request.param
