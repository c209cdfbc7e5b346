#!/usr/bin/env bash
# `make gpu-ladder` on an offline CUDA host whose Python has torch but only the CPU build of onnxruntime
# (GPU.md); scripts/gpu_session.sh runs it with the other GPU checks. Run from the project root with .gpu/
# staged here (scripts/stage_gpu.sh):
#   .gpu/part-*        onnxruntime-gpu's files, tar.xz in parts (to fit a 64 MiB transfer, its CUDA kernels
#                      cut to sm_90 by scripts/fatbin_one_sm.py, and libonnxruntime.so, which the Python
#                      module does not load, left out)
#   .gpu/py.tar.xz     optional: Python packages the server imports that the host lacks, unpacked
#   .gpu/clean.tar.gz  optional: attnserve/ as committed, put before this tree on PYTHONPATH
# Results go to $OUT (default: reports/); arguments go to benchmarks.gpu_ladder.
set -euo pipefail
out=${OUT:-reports}
source scripts/gpu_env.sh  # .gpu/ unpacked and on PYTHONPATH
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
python3 -m benchmarks.gpu_ladder --smoke
python3 -m benchmarks.gpu_ladder --work "$HOME/gpu-ladder" --out "$out/gpu-ladder.json" "$@" 2> >(tee "$out/gpu-ladder.log" >&2)
