"""The stamp every benchmark puts in its JSON, and the Markdown report written beside that JSON.

The stamp says what ran where: the tree (`git describe --always --dirty` of the checkout this
package lives in), the date, the machine, ONNX Runtime and its providers, the load average before
and after, the Python and the exact command. Standard library only, so that `attnserve bench` on
a client host (grpcio, no onnxruntime) and a benchmark in a venv of its own can stamp; onnxruntime
is imported only if it is there. Knows nothing of what a benchmark measures: the report renders
any result, lists of flat rows as tables and the rest as JSON.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent
NOT_INSTALLED = "not installed"
LONG_LIST = 20  # longer lists are left to the JSON file in the report's JSON block
SHORT_CELL = 40  # characters of a list shown in a table cell
# the summaries benchmarks' rows are full of, each shown as one cell: its keys, the column's suffix, the text
SUMMARIES = (
    (("median", "min", "max"), "", "{median} ({min}-{max})"),
    (("p50", "p90", "p99"), " p50/p90/p99", "{p50} / {p90} / {p99}"),
)


@dataclass
class Stamp:
    """What is known at a benchmark's start; `finish()` adds the load average at its end."""

    tree: str
    date: str  # UTC, ISO 8601, at the start
    command: str
    cpu: str
    cores: int | None
    python: str
    onnxruntime: str  # its version, or "not installed"
    providers: list[str]  # the execution providers it offers here
    provider: str | None  # the one the benchmark ran on, where it says (it may set it after the start)
    load_before: list[float]  # 1, 5 and 15-minute load averages

    @classmethod
    def start(cls, provider: str | None = None) -> Stamp:
        version, providers = onnxruntime_facts()
        return cls(
            tree=tree(),
            date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            command=command(),
            cpu=cpu_model(),
            cores=os.cpu_count(),
            python=platform.python_version(),
            onnxruntime=version,
            providers=providers,
            provider=provider,
            load_before=load_average(),
        )

    def finish(self) -> dict[str, Any]:
        """The stamp as the JSON's "stamp" value, with the load average now."""
        return {**asdict(self), "load_after": load_average()}


def tree() -> str:
    """`git describe --always --dirty` of the checkout this package is part of; "unknown" when it is
    installed (a venv inside a checkout is not the checkout) or git is missing."""
    try:
        git = ["git", "-C", str(PACKAGE)]
        subprocess.run(
            [*git, "ls-files", "--error-unmatch", "__init__.py"], capture_output=True, check=True, timeout=10
        )
        done = subprocess.run([*git, "describe", "--always", "--dirty"], capture_output=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.decode().strip()


def command() -> str:
    """This process's command line, shell-quoted: `python -m module ...` where it was run so."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is not None:
        head = [python(), "-m", spec.name.removesuffix(".__main__")]
    elif sys.argv[0].endswith(".py") or sys.argv[0] in ("-c", "-"):
        head = [python(), sys.argv[0]]
    else:  # a console script such as `attnserve`: its name where PATH finds it
        name = Path(sys.argv[0]).name
        found = shutil.which(name)
        head = [name if found and Path(found).resolve() == Path(sys.argv[0]).resolve() else sys.argv[0]]
    return shlex.join([*head, *sys.argv[1:]])


def python() -> str:
    """The interpreter, relative to the working directory where it is below it (a checkout's venv)."""
    executable = Path(sys.executable)
    try:
        return str(executable.relative_to(Path.cwd()))
    except ValueError:
        return str(executable)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def onnxruntime_facts() -> tuple[str, list[str]]:
    """ONNX Runtime's version and available providers; "not installed" and none on a client host."""
    try:
        import onnxruntime
    except ImportError:
        return NOT_INSTALLED, []
    return onnxruntime.__version__, list(onnxruntime.get_available_providers())


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_report(
    json_path: str | Path, result: dict[str, Any], plot_path: str | Path | None = None, title: str = ""
) -> Path:
    """Write `result` (which carries its "stamp") as JSON, and the Markdown report beside it (same stem,
    .md), embedding the plot if one was written; returns the report's path. A page of that name that
    this function did not write (a hand-written report: --out docs/reports/sampling.json beside
    sampling.md) is left as it is, and the report goes to NAME.report.md instead."""
    if "stamp" not in result:
        raise ValueError("the result has no stamp: set result['stamp'] = stamp.finish() first")
    json_path = Path(json_path)
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    plot = Path(plot_path) if plot_path and Path(plot_path).exists() else None
    link = Path(os.path.relpath(plot, json_path.parent)).as_posix() if plot else None
    report = json_path.with_suffix(".md")
    if report.exists() and not report.read_text().endswith(last_line(json_path.name)):
        report = json_path.with_suffix(".report.md")
    report.write_text(markdown(result, title or json_path.stem, json_path.name, link))
    return report


def markdown(result: dict[str, Any], title: str, json_name: str, plot_link: str | None) -> str:
    """The report: title, stamp, command, plot, a table per list of rows, the rest as JSON."""
    stamp = result["stamp"]
    parts = [f"# {title}", table([{"stamp": k, "": cell(v, None)} for k, v in stamp.items() if k != "command"])]
    parts.append(f"```sh\n{stamp['command']}\n```")
    if plot_link:
        parts.append(f"![{title}]({plot_link})")
    rest = {key: value for key, value in result.items() if key != "stamp" and not is_rows(value)}
    for key, rows in result.items():
        if key != "stamp" and is_rows(rows):
            parts += [f"## {key}", table([flatten(row) for row in rows])]
    if rest:
        parts += ["## The rest", f"```json\n{json.dumps(shorten(rest), indent=2)}\n```"]
    parts.append(last_line(json_name).rstrip("\n"))
    return "\n\n".join(parts) + "\n"


def last_line(json_name: str) -> str:
    """How a report this module writes ends: the link to its JSON (what marks a page as one of ours)."""
    return f"All of it: [{json_name}]({json_name})\n"


def is_rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(row, dict) for row in value)


def flatten(row: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A row's cells: nested dicts as dotted columns, each summary in SUMMARIES as one cell."""
    cells = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if not isinstance(value, dict):
            cells[name] = cell(value)
            continue
        for keys, suffix, text in SUMMARIES:
            if set(keys) <= set(value):
                cells[name + suffix] = text.format(**{k: cell(value[k]) for k in keys})
                value = {k: v for k, v in value.items() if k not in keys}
        cells.update(flatten(value, f"{name}."))
    return cells


def cell(value: Any, limit: int | None = SHORT_CELL) -> str:
    """One value as table text: numbers to 4 significant digits, a list or dict of more than `limit`
    characters as its length."""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if value is None:
        return "-"
    if isinstance(value, (list, dict)):
        text = ", ".join(map(cell, value)) if isinstance(value, list) else json.dumps(value)
        return text if limit is None or len(text) <= limit else f"{len(value)} items"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict[str, str]]) -> str:
    """Rows of cells as a Markdown table; the columns of every row, in first-seen order."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row.get(c, "") for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def shorten(value: Any) -> Any:
    """`value` with every list over LONG_LIST items replaced by a note (the JSON file has them)."""
    if isinstance(value, dict):
        return {key: shorten(v) for key, v in value.items()}
    if isinstance(value, list):
        return [shorten(v) for v in value] if len(value) <= LONG_LIST else f"{len(value)} items: see the JSON"
    return value
