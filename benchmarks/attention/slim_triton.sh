#!/usr/bin/env bash
# Builds a slimmed triton wheel tree as a .tar.xz small enough to carry to a GPU machine whose torch ships another
# triton (docs/kernel.md, "Another triton on the GPU machine"). NVIDIA sm80/sm90 only.
#
#   bash benchmarks/attention/slim_triton.sh triton-3.7.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl out.tar.xz
#
# On the GPU machine: mkdir -p /tmp/t && tar -xJf out.tar.xz -C /tmp/t
#                     export PYTHONPATH=/tmp/t:$PYTHONPATH TRITON_BACKENDS_IN_TREE=1
set -euo pipefail
wheel=$(realpath "$1")
out=$(realpath -m "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
unzip -q "$wheel"
strip --strip-unneeded triton/_C/libtriton.so  # debug info: 461 -> 180 MB for 3.7.1
# Not used on sm80/sm90: the AMD backend, the profiler (proton), CUPTI, Blackwell's ptxas, disassemblers, test libs.
rm -rf triton/backends/amd triton/_C/libproton.so triton/backends/nvidia/lib/cupti \
  triton/backends/nvidia/bin/ptxas-blackwell triton/backends/nvidia/bin/nvdisasm triton/backends/nvidia/bin/cuobjdump \
  triton/instrumentation triton/plugins triton/FileCheck triton/profiler
tar -cf - triton triton-*.dist-info | xz -T0 -9 > "$out"
ls -l "$out"
