"""The size ladder's sides (benchmarks/ladder_sides.py), each in its own process as `make sizes` runs
them, decode the same greedy tokens on the same weights: attnserve's plain loop over an imported
Hugging Face checkpoint's export, onnxruntime-genai on that directory, transformers' generate on the
checkpoint and CTranslate2 on its converted copy. And the ladder's checks read the goals off its rows."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from benchmarks.engine_core import genai_prompts
from benchmarks.kv import GENAI_PYTHON
from benchmarks.size_ladder import CT2_CONVERTER, Worker, checks


@pytest.mark.parametrize("hf_dir", ["gpt2", "llama"], indirect=True)
def test_every_side_decodes_the_plain_loops_tokens(hf_dir, hf_model_dir, tmp_path):
    prompts = genai_prompts(str(hf_model_dir), 3, 7)
    sides = {"plain": Worker("plain", hf_model_dir, 1), "torch": Worker("torch", hf_dir, 1)}
    if GENAI_PYTHON.exists():
        sides["genai"] = Worker("genai", hf_model_dir, 1)
    if importlib.util.find_spec("ctranslate2") is not None:
        ct2_dir = tmp_path / "ct2"
        subprocess.run([str(CT2_CONVERTER), "--model", str(hf_dir), "--output_dir", str(ct2_dir)], check=True)
        sides["ct2"] = Worker("ct2", ct2_dir, 1)
    try:
        runs = {side: worker.run(prompts, 24) for side, worker in sides.items()}
        again = sides["plain"].run(prompts, 24)  # on the arena it kept, each slot cleared
        shorter = sides["plain"].run(prompts[:2], 24)  # a batch of another size gets an arena of its own
    finally:
        for worker in sides.values():
            worker.close()
    assert len(runs["plain"]["tokens"]) == 24
    assert again["tokens"] == shorter["tokens"] == runs["plain"]["tokens"]
    for side, run in runs.items():
        assert run["tokens"] == runs["plain"]["tokens"], side
        assert run["seconds"] > 0 and run["rss_bytes"] > 0


def test_a_side_that_fails_says_which_and_why(tmp_path):
    with pytest.raises(RuntimeError, match="the plain side exited"):
        Worker("plain", tmp_path / "missing", 1)


def rows_of(rung: str, figures: dict[tuple[str, int, str], float]) -> list[dict]:
    return [
        {"rung": rung, "quantization": q, "streams": s, "side": side, "tokens_per_s": v}
        for (q, s, side), v in figures.items()
    ]


def test_the_checks_divide_the_measured_figures_and_compare_with_the_goals():
    rows = rows_of(
        "gpt2-124m",
        {
            ("float32", 1, "plain"): 30.0,
            ("int4", 1, "plain"): 100.0,
            ("int8", 16, "plain"): 500.0,
            ("int4", 16, "plain"): 400.0,
        },
    )
    rows[1]["share_of_limit"] = 0.5
    found = {c["check"]: c for c in checks(rows)}
    assert found["int4 / float32 at 1 stream (plain loop)"]["value"] == pytest.approx(3.333, abs=1e-3)
    assert found["int4 / float32 at 1 stream (plain loop)"]["met"]
    assert not found["int4 / int8 at 16 streams (plain loop)"]["met"]
    assert not found["int4's share of the bandwidth limit at 1 stream (plain loop)"]["met"]
    assert all(c["rung"] == "gpt2-124m" for c in found.values())
    assert not any("served" in name for name in found)  # no served row measured: no served check
