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
unpack() {  # unpack() ARCHIVE_ON_STDIN DIR: a tar.xz read from stdin into DIR
  mkdir -p "$1" && python3 -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1])" "$1"
}
[ -d "$HOME/ortgpu/site/onnxruntime" ] || cat .gpu/part-* | unpack "$HOME/ortgpu/site"
path=$HOME/ortgpu/site
if [ -f .gpu/py.tar.xz ]; then
  [ -d "$HOME/gpupy/msgspec" ] || unpack "$HOME/gpupy" < .gpu/py.tar.xz
  path=$path:$HOME/gpupy
fi
if [ -f .gpu/clean.tar.gz ]; then
  rm -rf "$HOME/attnserve-clean" && mkdir -p "$HOME/attnserve-clean" && tar -xzf .gpu/clean.tar.gz -C "$HOME/attnserve-clean"
  path=$path:$HOME/attnserve-clean
  echo "attnserve from the commit $(cat "$HOME/attnserve-clean/TREE")"
fi
export PYTHONPATH=$path:$PWD
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
python3 -m benchmarks.gpu_ladder --smoke
python3 -m benchmarks.gpu_ladder --work "$HOME/gpu-ladder" --out "$out/gpu-ladder.json" "$@" 2> >(tee "$out/gpu-ladder.log" >&2)
