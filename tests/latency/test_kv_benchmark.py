"""Quick mode of the KV benchmark on the tiny model: the arena and concat engines, the arena through
gRPC from a client process, onnxruntime-genai on the same directory, and one decode step of each
graph, all in one run. Checks that every side did the same greedy work and that the report holds
every figure; ratios are reported, never asserted against the clock (`make bench` runs the full
mode on a 1024-token model)."""

import json
from pathlib import Path

from benchmarks.kv import GENAI_PYTHON, main

ROOT = Path(__file__).resolve().parents[2]


def test_kv_benchmark_measures_every_side_on_the_same_work(tiny_model_dir, tiny_concat_model_dir, tmp_path):
    out = tmp_path / "kv.json"
    assert (
        main(
            [
                "--model",
                str(tiny_model_dir),
                "--concat-model",
                str(tiny_concat_model_dir),
                "--new-tokens",
                "16",
                "--concurrency",
                "1,16",
                "--repeats",
                "1",
                "--threads",
                "1",
                "--out",
                str(out),
                "--plot",
                str(tmp_path / "kv.png"),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    sides = result["serving"]["16"]["sides"]
    for c in ("1", "16"):
        assert sides["arena"][c]["tokens"] == sides["concat"][c]["tokens"] == sides["arena_grpc"][c]["tokens"]
        assert sides["arena"][c]["tokens"] == 16 * int(c)  # nobody stopped early: the same greedy work
    # onnxruntime-genai runs wherever its environment exists (make test builds it): never skipped silently
    assert result["genai"] == GENAI_PYTHON.exists() == (ROOT / ".venv-genai").is_dir()
    if result["genai"]:
        assert sides["genai"]["16"]["tokens"] == 16 * 16
    ratios = result["serving"]["16"]["ratios"]
    assert {"arena_vs_concat_at_1", "arena_vs_concat_at_16", "arena_grpc_16_vs_1"} <= set(ratios)
    assert [(s["batch"], s["past"]) for s in result["step"]] == [(1, 64), (16, 64)]
    assert all(s["arena_ms"] > 0 and s["concat_ms"] > 0 for s in result["step"])
    assert (tmp_path / "kv.png").stat().st_size > 0
