"""Quick mode of the engine-cost benchmark on the tiny model: the plain loop, the engine in this
process and the engine core in a process of its own decode the same greedy requests, and the two
engines produce the same tokens. Ratios are reported, never checked against wall-clock limits;
`make perf` runs the full mode."""

import json

from benchmarks.engine_cost import main


def test_the_loop_the_engine_and_the_core_decode_the_same_requests(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "engine-cost.json"
    argv = ["--model", str(tiny_model_dir), "--new-tokens", "16", "--repeats", "2", "--concurrency", "1,4"]
    assert main([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert [row["concurrency"] for row in result["rows"]] == [1, 4]
    for row in result["rows"]:
        assert row["loop"]["tokens"] == [16 * row["concurrency"]], row
        assert row["engine"]["tokens"] == row["core"]["tokens"] and len(row["core"]["tokens"]) == 1, row
        assert 0 < row["core"]["tokens"][0] <= 16 * row["concurrency"], row
        assert row["engine_vs_loop"]["median"] > 0 and row["core_vs_loop"]["median"] > 0, row
