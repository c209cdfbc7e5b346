"""Quick modes of the engine benchmarks on the tiny model: the plain loop, the engine in this
process and the engine core in a process of its own decode the same greedy requests, and the two
engines produce the same tokens; the mixed workload runs through a server and through genai; the
prefix cache hits where prompts share a preamble. Ratios
are reported, never checked against wall-clock limits; `make perf` runs the full modes."""

import json

import pytest

from benchmarks.engine_cost import main
from benchmarks.kv import GENAI_PYTHON


def test_the_loop_the_engine_and_the_core_decode_the_same_requests(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "engine-cost.json"
    argv = ["--model", str(tiny_model_dir), "--new-tokens", "16", "--repeats", "2", "--concurrency", "1,4"]
    assert main([*argv, "--intervals", "1,unary", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert [(row["concurrency"], row["interval"]) for row in result["rows"]] == [
        (1, "1"),
        (1, "unary"),
        (4, "1"),
        (4, "unary"),
    ]
    for row in result["rows"]:
        assert row["loop"]["tokens"] == [16 * row["concurrency"]], row
        assert row["engine"]["tokens"] == row["core"]["tokens"] and len(row["core"]["tokens"]) == 1, row
        assert 0 < row["core"]["tokens"][0] <= 16 * row["concurrency"], row
        assert row["engine_vs_loop"]["median"] > 0 and row["core_vs_loop"]["median"] > 0, row


@pytest.mark.skipif(not GENAI_PYTHON.exists(), reason="needs .venv-genai (`make test` builds it)")
def test_the_mixed_workload_is_served_by_both_sides(tiny_model_dir, tmp_path, capsys):
    """benchmarks.mixed in small: the same seeded requests through `attnserve serve` and through
    onnxruntime-genai's static batches; genai's useful tokens are exactly the lengths asked for, the
    server's at most those (a request may end at EOS), and each side's p50 is within its p99."""
    from benchmarks.mixed import main as mixed

    out = tmp_path / "mixed.json"
    argv = ["--model", str(tiny_model_dir), "--requests", "6", "--in-flight", "3", "--prompt-tokens", "8"]
    argv += ["--mean-new-tokens", "8", "--min-new-tokens", "4", "--max-new-tokens", "16", "--repeats", "1"]
    assert mixed([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert result["genai"]["useful_tokens"] == [result["asked_tokens"]]
    assert 0 < result["attnserve"]["useful_tokens"][0] <= result["asked_tokens"]
    for side in ("attnserve", "genai"):
        assert 0 < result[side]["latency_p50_ms"]["median"] <= result[side]["latency_p99_ms"]["median"], side
    assert result["throughput_attnserve_vs_genai"]["median"] > 0


def test_the_structured_output_benchmark_constrains_the_rows_it_says(tiny_model_dir, tmp_path, capsys):
    """benchmarks.structured in small: its grammar cannot end before --new-tokens, so every constrained
    row runs every step; each constrained token was one its grammar allowed (the replay asserts it)."""
    from benchmarks.structured import main as structured

    out, plot = tmp_path / "structured.json", tmp_path / "structured.png"
    argv = ["--model", str(tiny_model_dir), "--new-tokens", "16", "--repeats", "1", "--concurrency", "1,4"]
    assert structured([*argv, "--out", str(out), "--plot", str(plot)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    one, four = result["rows"]
    assert "one" not in one and one["all"]["tokens"] == [16] and four["all"]["tokens"] == [64]
    assert 16 <= four["one"]["tokens"][0] <= 64 and four["one_vs_free"]["median"] > 0
    assert one["mask_us"]["median"] > 0 and plot.stat().st_size > 0


def test_the_protocols_benchmark_streams_the_same_requests_through_grpc_and_http(tiny_model_dir, tmp_path, capsys):
    """benchmarks.protocols in small: one server, the same greedy requests through GenerateStream and
    through /v1/completions' server-sent events; both sides count the same tokens."""
    from benchmarks.protocols import main as protocols

    out = tmp_path / "protocols.json"
    argv = ["--model", str(tiny_model_dir), "--new-tokens", "8", "--repeats", "1", "--concurrency", "1,2"]
    assert protocols([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    for row in result["rows"]:
        assert row["grpc"]["tokens"] == row["http"]["tokens"] and row["http"]["tokens"][0] > 0, row
        assert row["http_vs_grpc_tokens_per_s"]["median"] > 0 and row["http"]["ttft_ms"] > 0, row
        latency = row["http_vs_grpc_per_token_ms"]  # None: every gRPC request's tokens came in one message
        assert latency is None or latency["median"] >= 0, row


def test_the_prefix_cache_benchmark_hits_only_where_prompts_share_a_preamble(tiny_model_dir, tmp_path, capsys):
    """benchmarks.prefix_cache in small: two servers, cache on and off; on the shared workload the
    second wave's prompts find the first wave's preamble (3 whole blocks of 48 ids), never with the
    cache off, and distinct prompts find nothing."""
    from benchmarks.prefix_cache import main as prefix_cache

    out = tmp_path / "prefix.json"
    argv = ["--model", str(tiny_model_dir), "--requests", "6", "--in-flight", "3", "--preamble-tokens", "48"]
    argv += ["--question-tokens", "8", "--new-tokens", "4", "--repeats", "1"]
    assert prefix_cache([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    shared, distinct = result["shared"], result["distinct"]
    assert shared["on"]["cached_tokens"]["median"] >= 3 * 48 and shared["off"]["cached_tokens"]["median"] == 0
    assert distinct["on"]["cached_tokens"]["median"] == distinct["off"]["cached_tokens"]["median"] == 0
    assert shared["ttft_p50_off_over_on"]["median"] > 0 and distinct["throughput_on_over_off"]["median"] > 0


def test_the_graph_benchmark_compares_two_model_directories_step_for_step(tiny_model_dir, tmp_path, capsys):
    """benchmarks.graph_speed in small, a directory against itself: the same tokens, a ratio per batch,
    and the same weight bytes a token on both sides, with the share of the batch-1 bandwidth limit."""
    from benchmarks.graph_speed import main as graph_speed

    out = tmp_path / "graph-speed.json"
    argv = ["--model", str(tiny_model_dir), "--baseline", str(tiny_model_dir), "--batch", "1,3"]
    small = ["--new-tokens", "8", "--repeats", "2", "--bandwidth-mib", "16"]
    assert graph_speed([*argv, *small, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert [row["batch"] for row in result["rows"]] == [1, 3]
    assert all(row["same_tokens"] and row["ratio"]["median"] > 0 for row in result["rows"])
    limits = result["bandwidth"]
    assert limits["read_bytes_per_s"] > 0 and limits["model"]["weight_bytes_per_token"] > 0
    assert limits["model"]["weight_bytes_per_token"] == limits["baseline"]["weight_bytes_per_token"]
    assert limits["model"]["share_at_batch_1"] > 0
