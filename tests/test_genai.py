"""The exported model directory runs unchanged in onnxruntime-genai and decodes the same tokens."""

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENAI_PYTHON = ROOT / ".venv-genai" / "bin" / "python"

# `make test` always builds .venv-genai first; a bare `pytest` without it skips, saying how to get it.
pytestmark = pytest.mark.skipif(
    not GENAI_PYTHON.exists(), reason="needs the onnxruntime-genai environment .venv-genai (`make test` builds it)"
)


def genai_check(model_dir) -> dict:
    """scripts/check_genai.py on a model directory: genai's greedy tokens against attnserve's, 64 each."""
    proc = subprocess.run(
        [str(GENAI_PYTHON), str(ROOT / "scripts" / "check_genai.py"), str(model_dir)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["all_identical"], [r for r in result["rows"] if not r["identical"]]
    assert proc.returncode == 0 and all(len(r["genai"]) == 64 for r in result["rows"])
    return result


def test_onnxruntime_genai_decodes_the_same_greedy_tokens(tiny_model_dir):
    assert genai_check(tiny_model_dir)["onnxruntime_genai"] == "0.18.0"


def test_onnxruntime_genai_decodes_the_int4_export_alike(tiny_int4_model_dir):
    """MatMulNBits and GatherBlockQuantized run in genai as in attnserve: the same greedy tokens."""
    genai_check(tiny_int4_model_dir)


def test_onnxruntime_genai_decodes_the_int8_export_alike(tiny_int8_model_dir):
    """The row-quantized int8 MatMuls (MatMulIntegerToFloat) run in genai as in attnserve."""
    genai_check(tiny_int8_model_dir)


def test_onnxruntime_genai_decodes_an_imported_model_alike(hf_model_dir):
    """A Hugging Face checkpoint of each family imported and exported (tests/fixtures_hf.py): genai reads
    its tokenizer.json and genai_config.json (the model type its builder writes for the family) and
    decodes the same greedy tokens as attnserve."""
    from attnserve.runtime.contract import GENAI_CONFIG_FILE, read_manifest

    genai_check(hf_model_dir)
    family = read_manifest(hf_model_dir).config["family"]
    written = json.loads((hf_model_dir / GENAI_CONFIG_FILE).read_text())["model"]["type"]
    assert family == hf_model_dir.name.removesuffix("-tiny")
    assert written == ("decoder" if family == "gpt2" else family)  # genai's "gpt2" is a combined-past GPT-2


# onnxruntime-genai's C API cuts text at a NUL character, so NUL is left out here (it round-trips
# in attnserve: tests/test_tokenizer.py).
GENAI_TEXTS = [
    "The return statement",
    "def f(x):\n    return x",
    "héllo wörld",
    "日本語のテキスト",
    "emoji 😀👍🏽 end",
    "combining e\u0301 a\u0308",
    "  two  spaces\n\n\ttab",
    "Καλημέρα κόσμε",
]


def test_onnxruntime_genai_tokenizes_and_generates_text_like_attnserve(tiny_bpe_model_dir):
    """genai's own tokenizer (og.Tokenizer on the directory) gives our ids, and its text-in,
    text-out greedy decode equals the text the server sends."""
    from fixtures_server import start_server

    from attnserve.runtime.contract import read_manifest
    from attnserve.tokenizer import from_model_dir
    from attnserve.v1 import generation_pb2 as pb

    ours = from_model_dir(tiny_bpe_model_dir, read_manifest(tiny_bpe_model_dir).tokenizer)
    proc = subprocess.run(
        [
            str(GENAI_PYTHON),
            str(ROOT / "scripts" / "genai_text.py"),
            str(tiny_bpe_model_dir),
            "--texts",
            json.dumps(GENAI_TEXTS),
            "--new-tokens",
            "24",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    server = start_server(tiny_bpe_model_dir)
    try:
        for row in rows:
            assert row["ids"] == ours.encode_prompt(row["text"]), row["text"]
            assert row["decoded"] == row["text"]
            reply = server.stub.Generate(pb.GenerateRequest(prompt=row["text"], max_new_tokens=24), timeout=30)
            assert row["continuation"] == reply.text, row["text"]
    finally:
        server.stop()
