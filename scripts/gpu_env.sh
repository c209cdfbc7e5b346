# Sourced by scripts/gpu_ladder_offline.sh and scripts/gpu_session.sh on an offline CUDA host, from the
# project root: unpacks .gpu/ as scripts/stage_gpu.sh stages it and puts it on PYTHONPATH before this tree.
#   .gpu/part-*        onnxruntime-gpu's files (unpacked once a machine: $HOME/ortgpu/site)
#   .gpu/py.tar.xz     optional: the server's packages the host lacks (unpacked afresh each time, so that a
#                      package staged again replaces the last one's)
#   .gpu/clean.tar.gz  optional: attnserve/ as committed, put before this tree
unpack() {  # unpack DIR: a tar.xz read from standard input into DIR
  mkdir -p "$1" && python3 -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1])" "$1"
}
[ -d "$HOME/ortgpu/site/onnxruntime" ] || cat .gpu/part-* | unpack "$HOME/ortgpu/site"
gpu_path=$HOME/ortgpu/site
if [ -f .gpu/py.tar.xz ]; then
  rm -rf "$HOME/gpupy" && unpack "$HOME/gpupy" < .gpu/py.tar.xz
  gpu_path=$gpu_path:$HOME/gpupy
fi
if [ -f .gpu/clean.tar.gz ]; then
  rm -rf "$HOME/attnserve-clean" && mkdir -p "$HOME/attnserve-clean" && tar -xzf .gpu/clean.tar.gz -C "$HOME/attnserve-clean"
  gpu_path=$gpu_path:$HOME/attnserve-clean
  echo "attnserve from the commit $(cat "$HOME/attnserve-clean/TREE")"
fi
export PYTHONPATH=$gpu_path:$PWD
