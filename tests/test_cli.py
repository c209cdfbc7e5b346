"""The `attnserve` command itself: its version, written once (attnserve/__init__.py) and the same
in the installed package's metadata and `--version` (tests/test_oip.py checks that GetModelInfo's
server_version is the metadata's)."""

import subprocess
import sys
from importlib import metadata

import attnserve


def test_version_is_written_once():
    done = subprocess.run([sys.executable, "-m", "attnserve.cli", "--version"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"attnserve {attnserve.__version__}"
    assert metadata.version("attnserve") == attnserve.__version__  # pyproject.toml reads it (dynamic)
