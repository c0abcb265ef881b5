#!/usr/bin/env bash
# GPU tests + benchmark for the Forgetting Attention kernel, in one command from the repo root:
#   bash benchmarks/attention/gpu_tests.sh      (outputs under $OUT if set, else ./outputs/gpu)
# Installs the fla wheels from .whl/ when present (for the fla peer in the benchmark; no network needed).
# TRITON_TARBALL=path/triton.tar.xz (from slim_triton.sh) runs everything on that triton instead of the one the
# machine's torch ships (e.g. 3.7.1, the pinned version, on a machine whose torch ships 3.6).
# The GPU tests run twice: as users get the op (the default options: Triton kernels autotuned over the configs that
# fit the GPU's shared memory; the pass that counts), then with each head dim's fixed configs (FOX_AUTOTUNE=0).
# Then the shared-memory bound by which configs are pruned, against this triton's compiler (compile_kernels --smem,
# no GPU needed), and the benchmark. Exits 1 if any step failed.
# PASSES (default "autotuned fixed"), SHARD=I/N (the I-th of N disjoint parts of the tests, round robin; an
# autotuned pass on one H200 takes longer than 10 minutes, so e.g. SHARD=1/3, 2/3, 3/3 in three calls), PYTEST_K
# (a pytest -k expression, e.g. PYTEST_K='fused or acp'), SKIP_TESTS=1, SKIP_SMEM=1 and SKIP_BENCH=1 split the run
# into several shorter ones; PYTEST_ARGS adds other pytest flags (split on spaces, e.g. -x); BENCH_ARGS, the
# benchmark's.
set -uo pipefail
OUTDIR=${OUT:-outputs/gpu}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
if [ -n "${TRITON_TARBALL:-}" ]; then
  if [ ! -f "$TRITON_TARBALL" ]; then
    echo "TRITON_TARBALL=$TRITON_TARBALL: no such file (make one with benchmarks/attention/slim_triton.sh)" >&2
    exit 2
  fi
  TRITON_DIR=$(mktemp -d)
  tar -xJf "$TRITON_TARBALL" -C "$TRITON_DIR" || exit 2
  # the backends of the unpacked tree, not those the installed triton registers as entry points
  export PYTHONPATH=$TRITON_DIR:${PYTHONPATH:-} TRITON_BACKENDS_IN_TREE=1
fi
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, triton.__file__)" \
  | tee "$OUTDIR/versions.txt"
if ls .whl/fla_core-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUTDIR/gpu.txt"
status=0
if [ "${SKIP_TESTS:-0}" != "1" ]; then
  for pass in ${PASSES:-autotuned fixed}; do
    case $pass in
      autotuned) autotune=1 ;;
      fixed) autotune=0 ;;
      *) echo "PASSES: unknown pass '$pass' (autotuned, fixed)" >&2; exit 2 ;;
    esac
    echo "== GPU tests, $pass configs (FOX_AUTOTUNE=$autotune)${SHARD:+, part $SHARD}"
    FOX_AUTOTUNE=$autotune python3 -m pytest -m gpu tests/ops -q -s ${PYTEST_K:+-k "$PYTEST_K"} \
      ${SHARD:+--shard "$SHARD"} --durations=10 ${PYTEST_ARGS:-} 2>&1 \
      | tee "$OUTDIR/gpu_tests_$pass${SHARD:+_part${SHARD%/*}}.log" || status=1
  done
fi
if [ "${SKIP_SMEM:-0}" != "1" ]; then
  python3 -m benchmarks.attention.compile_kernels --smem --arch 90 80 --head-dims 64 128 256 2>&1 \
    | tee "$OUTDIR/smem.log" || status=1
fi
if [ "${SKIP_BENCH:-0}" != "1" ]; then
  python3 -m benchmarks.attention.bench --out "$OUTDIR/benchmarks.md" ${BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/bench.log" \
    || status=1
fi
exit $status
