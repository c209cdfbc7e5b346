"""Runs `attnserve` command lines one after another in this one process, for the tests of the
command's refusals (test_refusals.py, test_export.py, test_attention_map.py): importing a
subcommand's code once (torch takes a second) instead of once per command line.

    python tests/cli_driver.py RUNS.json RESULTS.json
    run_in_one_process(argvs, workdir)      # from a test: the same, in a fresh Python process

RUNS.json holds {"argvs": [[...], ...], "tripwires": ["module:function", ...], "timeout": seconds}.
Each command line's stdout and stderr are caught at their file descriptors (so that log handlers,
warnings and gRPC core's own lines are caught too), its exit code taken from `attnserve.cli.main`'s
return or SystemExit; an exception that escapes is a traceback in its stderr, as a user would see.
A tripwire replaces a function that starts a subcommand's work with one that raises: a refusal
must come before it. A command line still running after the timeout is stopped (SIGALRM) and
reported as such. RESULTS.json gets one {"rc", "stdout", "stderr"} per command line, in order.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path


class WorkStarted(Exception):
    """Raised by a tripwire: the command line got past its checks."""


class StillRunning(Exception):
    """Raised by SIGALRM: the command line neither refused nor finished in time."""


def set_tripwire(path: str) -> None:
    module, _, name = path.partition(":")

    def tripwire(*args, **kwargs):
        raise WorkStarted(f"{path} was called: the command line got past its checks")

    setattr(importlib.import_module(module), name, tripwire)


def alarm(signum, frame):
    raise StillRunning("still running after the timeout: no refusal")


def run(argv: list[str], timeout: int) -> dict:
    from attnserve import cli

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        signal.alarm(timeout)
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 (what escapes is what a user would see as a traceback)
            traceback.print_exc()
            rc = "traceback"
        finally:
            signal.alarm(0)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        out.seek(0)
        err.seek(0)
        return {"rc": rc, "stdout": out.read().decode(errors="replace"), "stderr": err.read().decode(errors="replace")}


def run_in_one_process(argvs: list[list[str]], workdir: Path, tripwires=(), timeout: int = 60) -> list[dict]:
    """Each command line's {"rc", "stdout", "stderr"}, all run by one fresh Python process (this file)."""
    runs, results = workdir / "runs.json", workdir / "results.json"
    argvs = [[str(a) for a in argv] for argv in argvs]
    runs.write_text(json.dumps({"argvs": argvs, "tripwires": list(tripwires), "timeout": timeout}))
    subprocess.run([sys.executable, __file__, str(runs), str(results)], check=True, timeout=600)
    return json.loads(results.read_text())


def main(runs_path: str, results_path: str) -> None:
    with open(runs_path) as f:
        runs = json.load(f)
    for path in runs.get("tripwires", ()):
        set_tripwire(path)
    signal.signal(signal.SIGALRM, alarm)
    results = [run(argv, runs.get("timeout", 60)) for argv in runs["argvs"]]
    with open(results_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
