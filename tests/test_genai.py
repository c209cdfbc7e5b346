"""The exported model directory runs unchanged in onnxruntime-genai and decodes the same tokens."""
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENAI_PYTHON = ROOT / ".venv-genai" / "bin" / "python"


def test_onnxruntime_genai_decodes_the_same_greedy_tokens(tiny_model_dir):
    if not GENAI_PYTHON.exists():
        pytest.fail("the onnxruntime-genai environment is missing: run `make test` (it builds .venv-genai)")
    proc = subprocess.run([str(GENAI_PYTHON), str(ROOT / "scripts" / "check_genai.py"), str(tiny_model_dir)],
                          capture_output=True, text=True, timeout=240)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["onnxruntime_genai"] == "0.18.0"
    assert result["all_identical"], [r for r in result["rows"] if not r["identical"]]
    assert proc.returncode == 0 and all(len(r["genai"]) == 48 for r in result["rows"])
