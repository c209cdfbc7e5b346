"""TEST ONLY: the switches a test outside the server's process sets in its environment (no flags),
read by `attnserve serve` and `attnserve ray-serve` at start-up and passed to the Server beside its
configuration, never inside it: bytes every call leaks (the soak test's negative control) and a
sleep in every engine step with a batch (so that a test finds generations still running).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TEST_LEAK_VARIABLE = "ATTNSERVE_TEST_LEAK_BYTES"
TEST_STEP_DELAY_VARIABLE = "ATTNSERVE_TEST_STEP_DELAY_MS"


@dataclass(frozen=True)
class TestSwitches:
    __test__ = False  # not a test class, for pytest

    leak_bytes: int = 0  # kept forever per finished call
    step_delay_ms: int = 0  # slept by every engine step with a batch

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None) -> TestSwitches:
        """The switches set in `environ`, each a whole number (0 where unset); ValueError naming the variable."""
        values = {}
        for name, variable, unit in (
            ("leak_bytes", TEST_LEAK_VARIABLE, "bytes"),
            ("step_delay_ms", TEST_STEP_DELAY_VARIABLE, "ms"),
        ):
            text = (environ or {}).get(variable, "0")
            if not text.isdigit():
                raise ValueError(f"${variable} must be a number of {unit}, not {text!r}")
            values[name] = int(text)
        return cls(**values)
