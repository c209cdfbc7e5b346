#!/usr/bin/env bash
# Every GPU check of issues 60 and 62 in one device call (at most about 9.5 minutes), on an offline CUDA
# host from .gpu/ as scripts/stage_gpu.sh stages it; results in $OUT (default: reports/), at most six
# files, the device tool's limit being eight:
#   pytest -m gpu            tests/test_gpu.py (the TLS fixtures left out: such a host lacks cryptography)
#   the GPU ladder           float16, 1 to 256 streams: the defaults beside --max-waiting-steps 16 and
#                            --run-ahead on, the request kinds at 64 streams (gpu-ladder.json/.md/.png)
#   the GPU check            the small model trained 30 s there, its float16 and bfloat16 exports' gates,
#                            per token against PyTorch, served at 1, 16 and 64 streams (gpu-check.json/.md)
# Each part has its own time limit, and one that fails leaves the others; everything they print goes to
# session.log, and the tables also to standard output.
#   bash scripts/gpu_session.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-reports}
mkdir -p "$out"
log=$out/session.log
start=$(date +%s)
say() { echo "[gpu-session +$(($(date +%s) - start))s] $*" | tee -a "$log"; }
source scripts/gpu_env.sh  # .gpu/ unpacked and on PYTHONPATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$log"
python3 -m benchmarks.gpu_ladder --smoke 2>&1 | tee -a "$log" || exit 1
part() {  # part SECONDS NAME COMMAND...: COMMAND under a time limit, its output to the log, its end shown
  local limit=$1 name=$2
  shift 2
  say "$name"
  timeout "$limit" "$@" 2>&1 | grep -v "No registered plugin EP device" >> "$log"
  say "$name: exit ${PIPESTATUS[0]}"
}
part 120 "pytest -m gpu" python3 -m pytest -q -m gpu -p no:cacheprovider -p no:fixtures_tls tests/test_gpu.py
grep -E "passed|failed|error" "$log" | tail -3
part 280 "the GPU ladder" python3 -m benchmarks.gpu_ladder --exports float16 --work "$HOME/gpu-ladder" \
  --out "$out/gpu-ladder.json"
[ -f "$out/gpu-ladder.json" ] && rm -f "$out/gpu-ladder.partial.json"
grep -A14 "^gpu-ladder:" "$log" | tail -15
part 170 "the GPU check" python3 -m benchmarks.gpu_check --skip-tests --train-seconds 30 --concurrency 1,16,64 \
  --work "$HOME/gpu-check" --out "$out/gpu-check.json"
grep -A14 "^gpu-check on" "$log" | tail -15
