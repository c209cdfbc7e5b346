"""One build of a session fixture's model per test run, however many pytest-xdist workers ask for it
(`make test` runs the suite in two): the first worker to ask builds it in the run's directory, which
the workers share, while the others wait on its lock and then read what it wrote. Run without
workers, it is an ordinary build into the session's own temporary directory.

    path = built_once(tmp_path_factory, "models/tiny", lambda out: export_checkpoint(ckpt, out))

What is built this way is shared: a test that changes it copies it first, as for any session fixture.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """The path `name` (under the run's shared directory), after `build(path)` has written it once."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # basetemp/popen-gwN/..: the run's directory, shared by its workers
    path = root / "built-once" / name
    done = path.with_name(path.name + ".done")  # beside the build, not in it: a model directory lists its files
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not done.exists():
            if path.exists():  # a build that failed part-way in another worker: start again
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            build(path)
            done.touch()
    return path
