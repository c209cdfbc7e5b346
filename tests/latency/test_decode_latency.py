"""Quick mode of the decode benchmark: the comparisons that matter, in one process, with wide
sanity margins only (ratios, never wall-clock limits). `make bench` runs the full mode."""

import pytest

from benchmarks.decode import print_table, run


@pytest.mark.trains  # builds and runs a torch model: out of the edit loop's lane
def test_kv_cache_and_onnx_runtime_pay_off():
    result = run(None, [256], prompt_len=16, repeats=1, threads=1)
    print_table(result)
    row = result["rows"][0]
    assert row["kv_vs_recompute"] >= 2.0, row  # measured ~15x at 256 tokens on 2 cores
    assert row["ort_vs_torch"] >= 1.2, row  # measured ~4.8x
