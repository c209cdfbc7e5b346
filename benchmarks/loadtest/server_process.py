"""`attnserve serve` in a subprocess, seen from outside: its address, its RSS, its /metrics.

What a load test needs of the server it drives, through the interfaces an operator has: the
printed address, /proc/PID/status and the Prometheus text on --metrics-port. Standard library only.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$")


class ServerProcess:
    """`attnserve serve --port 0 --metrics-port 0` on 127.0.0.1, started and ready."""

    def __init__(
        self,
        model: str,
        *serve_args: str,
        env: dict[str, str] | None = None,
        ready_timeout: float = 120.0,
        cwd: str | None = None,
        entry: tuple[str, ...] = ("attnserve.cli", "serve"),
    ):
        """`cwd`: the checkout whose attnserve runs (another tree's, for a before/after A/B); `entry`: the
        module run with `python -m` and its first arguments (a test's leaking serve: soak.py)."""
        command = [sys.executable, "-m", *entry, "--model", model, "--host", "127.0.0.1"]
        command += ["--port", "0", "--metrics-port", "0", *serve_args]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=cwd,
        )
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self.target, self.metrics_url = self._wait_ready(ready_timeout)
        threading.Thread(target=self._drain_output, daemon=True).start()

    def _wait_ready(self, timeout: float) -> tuple[str, str]:
        """The gRPC target and the /metrics URL, from the lines the server prints once it serves."""
        end, target, metrics = time.monotonic() + timeout, None, None
        assert self.proc.stdout is not None
        while time.monotonic() < end and (target is None or metrics is None):
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if found := re.search(r"listening on (\S+:\d+)", line):
                target = found.group(1)
            if found := re.search(r"metrics on (http://\S+/metrics)", line):
                metrics = found.group(1)
        if target is None or metrics is None:
            self.proc.kill()
            raise RuntimeError("attnserve serve did not start:\n" + "".join(self.lines[-30:]))
        return target, metrics

    def _drain_output(self) -> None:
        """Keep reading the log, so that a full pipe never blocks the server; keep the last lines."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines = [*self.lines[-199:], line]

    def rss_bytes(self) -> int:
        """Resident set size now (VmRSS)."""
        return status_bytes(self.pid, "VmRSS")

    def tree_rss_bytes(self) -> int:
        """Resident set size now of the server and every process under it (its engine core); a process
        that ended meanwhile counts nothing."""
        total = 0
        for pid in descendants(self.pid):
            try:
                total += status_bytes(pid, "VmRSS")
            except OSError:
                continue
        return total

    def metrics(self, timeout: float = 10.0) -> dict[str, float]:
        """Every sample on /metrics: 'name{label="value",...}' -> value."""
        with urllib.request.urlopen(self.metrics_url, timeout=timeout) as response:
            text = response.read().decode()
        samples = {}
        for line in text.splitlines():
            if (found := SAMPLE.match(line)) is not None:
                samples[found.group(1)] = float(found.group(2))
        return samples

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (a drain), then the exit code; killed if it has not exited within `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def status_bytes(pid: int | str, field: str) -> int:
    """A size field of /proc/PID/status in bytes (VmRSS, VmHWM, ...); pid may be "self"."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for process {pid}")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of one process so far (not its children), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # from the state on: utime is 12th, stime 13th
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """`pid` and every living process under it, from /proc's parent ids."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def by_label(samples: dict[str, float], name: str, label: str) -> dict[str, float]:
    """The samples of one metric keyed by one label's value, e.g. requests by code (summed over the rest)."""
    found: dict[str, float] = {}
    for key, value in samples.items():
        if key.startswith(name + "{") and (match := re.search(rf'{label}="([^"]*)"', key)):
            found[match.group(1)] = found.get(match.group(1), 0.0) + value
    return found
