#!/usr/bin/env bash
# Stage .gpu/ for an offline CUDA host whose Python 3.12 has torch but only the CPU build of onnxruntime
# (GPU.md; the device tool's H200): what scripts/gpu_session.sh unpacks there. Run here, from the project
# root, with the venv built (make .venv/.installed-stamp). Writes, under .gpu/ (ignored by git):
#   part-00      onnxruntime-gpu's files, its CUDA kernels cut to one architecture (scripts/fatbin_one_sm.py;
#                sm_90: the H100's and H200's), libonnxruntime.so (the Python module does not load it),
#                TensorRT's provider, transformers/ and datasets/ left out; tar, xz with the x86 filter
#   py.tar.xz    the packages the server imports that the host lacks, each with its .dist-info (llguidance
#                reads its own version from it)
# and says whether the tracked tree and .gpu/ fit the device's 64 MiB transfer together.
#   ORT_GPU_VERSION=1.31.1 SM=90 bash scripts/stage_gpu.sh
set -euo pipefail
version=${ORT_GPU_VERSION:-1.31.1}
sm=${SM:-90}
python=.venv/bin/python
mkdir -p .git/info
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
download() {  # download DIR SPEC...: cp312 x86-64 wheels, no dependencies
  local into=$1
  shift
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d "$into" "$@" 2> >(grep -v '^WARNING' >&2)
}

download "$work/whl" "onnxruntime-gpu==$version"
"$python" -m zipfile -e "$work"/whl/onnxruntime_gpu-*.whl "$work/ort"
capi=$work/ort/onnxruntime/capi
rm -rf "$work/ort/onnxruntime/transformers" "$work/ort/onnxruntime/datasets" \
  "$capi"/libonnxruntime.so.* "$capi/libonnxruntime_providers_tensorrt.so"
"$python" scripts/fatbin_one_sm.py "$capi/libonnxruntime_providers_cuda.so" --sm "$sm"
rm -rf .gpu && mkdir -p .gpu
tar -C "$work/ort" -cf - . | xz --x86 --lzma2=preset=9e -T2 > .gpu/part-00

# the server's imports the host's image lacks (its torch image has grpcio, numpy, tokenizers, jinja2 ...)
packages=(llguidance==1.9.1 msgspec==0.23.0 starlette==1.10.0 uvicorn==0.54.0
  grpcio-health-checking==1.81.1 grpcio-reflection==1.81.1 protobuf==6.33.6)
download "$work/py-whl" "${packages[@]}"
mkdir -p "$work/py"
for wheel in "$work"/py-whl/*.whl; do "$python" -m zipfile -e "$wheel" "$work/py"; done
tar -C "$work/py" -cf - . | xz --x86 --lzma2=preset=9e -T2 > .gpu/py.tar.xz

mib() { awk '{s += $1} END {printf "%.1f", s / 1048576}'; }
tree=$(git ls-files -z | xargs -0 stat -c %s | mib)
staged=$(stat -c %s .gpu/* | mib)
reports=$(git ls-files -z docs/reports | xargs -0 stat -c %s | mib)
echo "staged: .gpu/ $staged MiB, the tracked tree $tree MiB (docs/reports/ $reports MiB of it); the limit is 64"
cat <<MSG
If over, take docs/reports/ out of what travels for the call only, and put it back after:
  git rm -r --cached -q docs/reports && echo /docs/reports/ >> .git/info/exclude
  ... the device call: carry [".gpu"], command "bash scripts/gpu_session.sh" ...
  git reset -q && sed -i '\\#^/docs/reports/\$#d' .git/info/exclude
MSG
