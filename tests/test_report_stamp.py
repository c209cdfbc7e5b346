"""The benchmarks' stamp and Markdown report (attnserve/report_stamp.py), on this very checkout: every
field is there and agrees with what git, the OS and ONNX Runtime say; the command reads back as run;
the report carries the command, the rows as a table and a relative link to the PNG only when one
was written; and the module stamps on a client host, where onnxruntime is not installed."""

import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import onnxruntime
import pytest

from attnserve.report_stamp import LONG_LIST, Stamp, write_report

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {
    "tree",
    "date",
    "command",
    "cpu",
    "cores",
    "python",
    "onnxruntime",
    "providers",
    "provider",
    "load_before",
    "load_after",
}


def run_python(*args: str, cwd: Path = ROOT) -> dict:
    """A fresh interpreter's stdout, read as JSON (the package found from the checkout)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_field_is_there_and_says_what_the_machine_says():
    stamp = Stamp.start(provider="cpu").finish()
    assert set(stamp) == FIELDS
    described = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT)
    assert stamp["tree"] == described.stdout.strip() != ""
    started = datetime.fromisoformat(stamp["date"])
    assert started.utcoffset() == timedelta(0) and abs(datetime.now(timezone.utc) - started) < timedelta(minutes=1)
    assert stamp["cpu"] and stamp["cpu"] != "unknown" and stamp["cores"] == os.cpu_count()
    assert stamp["python"] == platform.python_version()
    assert stamp["onnxruntime"] == onnxruntime.__version__ and "CPUExecutionProvider" in stamp["providers"]
    assert stamp["provider"] == "cpu"
    for key in ("load_before", "load_after"):
        assert len(stamp[key]) == 3 and all(isinstance(x, float) and x >= 0 for x in stamp[key]), stamp[key]
    assert json.loads(json.dumps(stamp)) == stamp


def test_the_command_reads_back_as_it_was_run(tmp_path):
    """`python -m module` where the program was run so, each argument shell-quoted."""
    (tmp_path / "measure.py").write_text(
        "import json\nfrom attnserve.report_stamp import Stamp\nprint(json.dumps(Stamp.start().finish()))\n"
    )
    by_module = run_python("-m", "measure", "two words", "--x=1", cwd=tmp_path)
    assert shlex.split(by_module["command"]) == [sys.executable, "-m", "measure", "two words", "--x=1"]
    by_path = run_python("measure.py", "--out", "a b.json", cwd=tmp_path)
    assert shlex.split(by_path["command"]) == [sys.executable, "measure.py", "--out", "a b.json"]


def test_the_tree_is_unknown_outside_a_checkout(tmp_path):
    """A copy of the package that no git repository tracks (installed, or a venv inside a checkout)."""
    (tmp_path / "attnserve").mkdir()
    for name in ("__init__.py", "report_stamp.py"):
        shutil.copy(ROOT / "attnserve" / name, tmp_path / "attnserve" / name)
    code = "import json; from attnserve.report_stamp import tree; print(json.dumps(tree()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == "unknown"


def test_a_client_host_without_onnxruntime_stamps():
    code = (
        "import json, sys\n"
        "sys.modules['onnxruntime'] = None  # as if not installed: importing it raises ImportError\n"
        "from attnserve.report_stamp import Stamp\n"
        "print(json.dumps(Stamp.start().finish()))\n"
    )
    stamp = run_python("-c", code)
    assert (stamp["onnxruntime"], stamp["providers"], stamp["provider"]) == ("not installed", [], None)
    assert set(stamp) == FIELDS and stamp["tree"] != "unknown"


def result_with_rows(stamp: dict) -> dict:
    return {
        "model": "models/tiny",
        "rows": [
            {"concurrency": 1, "tokens_per_s": {"median": 1234.5, "min": 1200.0, "max": 1300.25}, "same": True},
            {"concurrency": 16, "tokens_per_s": {"median": 9876.0, "min": 9000.0, "max": 9999.0}, "same": False},
        ],
        "timeline": list(range(LONG_LIST + 1)),
        "stamp": stamp,
    }


def test_the_report_has_the_stamp_the_command_and_the_rows_as_a_table(tmp_path):
    stamp = Stamp.start(provider="cpu").finish()
    result = result_with_rows(stamp)
    (tmp_path / "reports").mkdir()
    out = tmp_path / "reports" / "speed.json"
    report = write_report(out, result, title="Speed, measured")
    assert report == tmp_path / "reports" / "speed.md"
    assert json.loads(out.read_text()) == result
    text = report.read_text()
    assert text.startswith("# Speed, measured\n")
    assert f"| tree | {stamp['tree']} |" in text and f"| cores | {stamp['cores']} |" in text
    assert f"```sh\n{stamp['command']}\n```" in text
    assert "| concurrency | tokens_per_s | same |\n|---|---|---|\n" in text
    assert "| 1 | 1,234 (1,200-1,300) | True |" in text and "| 16 | 9,876 (9,000-9,999) | False |" in text
    assert '"model": "models/tiny"' in text and f'"timeline": "{LONG_LIST + 1} items: see the JSON"' in text
    assert "![" not in text and "[speed.json](speed.json)" in text


def test_the_plot_is_linked_relative_to_the_report_and_only_once_written(tmp_path):
    result = result_with_rows(Stamp.start().finish())
    (tmp_path / "json").mkdir()
    plot = tmp_path / "plots" / "speed.png"
    out = tmp_path / "json" / "speed.json"
    assert "![" not in write_report(out, result, plot, "Speed").read_text()  # asked for, never written
    plot.parent.mkdir()
    plot.write_bytes(b"\x89PNG\r\n\x1a\n")
    assert "![Speed](../plots/speed.png)" in write_report(out, result, plot, "Speed").read_text()


def test_a_result_without_a_stamp_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no stamp"):
        write_report(tmp_path / "r.json", {"rows": []})
    assert not (tmp_path / "r.json").exists()


def test_a_hand_written_page_of_the_reports_name_is_never_overwritten(tmp_path):
    """--out docs/reports/sampling.json beside the hand-written sampling.md: the page stays, the report
    goes beside it as sampling.report.md; a report of ours is rewritten in place."""
    result = result_with_rows(Stamp.start().finish())
    page = tmp_path / "sampling.md"
    page.write_text("# Sampling\n\nMeasured by hand.\n")
    report = write_report(tmp_path / "sampling.json", result, title="Kinds")
    assert report == tmp_path / "sampling.report.md" and report.read_text().startswith("# Kinds\n")
    assert page.read_text() == "# Sampling\n\nMeasured by hand.\n"
    ours = write_report(tmp_path / "speed.json", result, title="Speed")
    assert write_report(tmp_path / "speed.json", result, title="Speed, again") == ours == tmp_path / "speed.md"
    assert ours.read_text().startswith("# Speed, again\n")
