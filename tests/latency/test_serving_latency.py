"""Quick mode of the serving benchmark: continuous batching and the gRPC layer, measured in one
run on the tiny model, with wide sanity margins only (ratios, never wall-clock limits).
`make bench` runs the full mode on the trained `small` model."""
import asyncio

from attnserve.server.serving_benchmark import print_table, run


def test_batching_pays_off_and_grpc_costs_little_per_token(tiny_model_dir):
    result = asyncio.run(run(str(tiny_model_dir), [1, 8], new_tokens=32, repeats=1, threads=1))
    print_table(result)
    engine, via_grpc = result["throughput"]["in_process"], result["throughput"]["grpc"]
    assert all(row["tokens"] > 0 for row in engine + via_grpc)
    assert engine[1]["vs_first_level"] >= 1.5, engine       # measured ~4x at 16 streams on 2 cores
    assert via_grpc[1]["vs_first_level"] >= 1.2, via_grpc    # measured ~2.5x
    assert result["grpc_vs_in_process_per_token"] <= 4.0, result["latency"]  # measured ~1.3x
