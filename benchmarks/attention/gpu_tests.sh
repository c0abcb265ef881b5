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
# JOBS=N runs each pass as N pytest processes at once on the same GPU, the N disjoint parts of the tests (the
# autotuned pass is bound by triton's compilations on the CPU: with JOBS=4 both passes took under 9 minutes on an
# H100 machine of 16 cores, where one process had not finished a third of the autotuned pass in 10 minutes; tests
# time nothing, so sharing the GPU changes no result, only which config an autotuning picks). A line every 30 s
# counts the tests done.
# PASSES (default "autotuned fixed"), SHARD=I/N (the I-th of N disjoint parts of the tests, round robin, e.g.
# SHARD=1/3, 2/3, 3/3 in three sittings; not with JOBS), PYTEST_K
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
case ${JOBS:-1} in
  '' | *[!0-9]* | 0) echo "JOBS=${JOBS}: expected a positive integer" >&2; exit 2 ;;
esac
if [ -n "${SHARD:-}" ] && [ "${JOBS:-1}" -gt 1 ]; then
  echo "SHARD and JOBS go separately: JOBS=N runs all N parts at once" >&2
  exit 2
fi
gpu_pytest() {  # the GPU tests of tests/ops under FOX_AUTOTUNE=$autotune, plus the arguments given
  FOX_AUTOTUNE=$autotune python3 -m pytest -m gpu tests/ops -q -s ${PYTEST_K:+-k "$PYTEST_K"} --durations=10 \
    ${PYTEST_ARGS:-} "$@"
}
parallel_pass() {  # JOBS=N: the N parts of pass $pass at once, a count of tests done every 30 s, then each part's end
  echo "== GPU tests, $pass configs (FOX_AUTOTUNE=$autotune), $JOBS processes at once"
  local pids=() waited=0 done_count i
  for i in $(seq 1 "$JOBS"); do
    gpu_pytest --shard "$i/$JOBS" > "$OUTDIR/gpu_tests_${pass}_part$i.log" 2>&1 &
    pids+=($!)
  done
  while kill -0 "${pids[@]}" 2>/dev/null; do  # (true while any part runs)
    sleep 5
    waited=$((waited + 5))
    if [ $((waited % 30)) = 0 ]; then
      done_count=$(cat "$OUTDIR"/gpu_tests_"$pass"_part*.log | grep -o '^[.sFE]*' | tr -d '\n' | wc -c)
      echo "  $waited s: $done_count tests done"
    fi
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || status=1
    echo "part $((i + 1))/$JOBS: $(tail -n 1 "$OUTDIR/gpu_tests_${pass}_part$((i + 1)).log")"
  done
}
if [ "${SKIP_TESTS:-0}" != "1" ]; then
  for pass in ${PASSES:-autotuned fixed}; do
    case $pass in
      autotuned) autotune=1 ;;
      fixed) autotune=0 ;;
      *) echo "PASSES: unknown pass '$pass' (autotuned, fixed)" >&2; exit 2 ;;
    esac
    if [ "${JOBS:-1}" -gt 1 ]; then
      parallel_pass
      continue
    fi
    echo "== GPU tests, $pass configs (FOX_AUTOTUNE=$autotune)${SHARD:+, part $SHARD}"
    gpu_pytest ${SHARD:+--shard "$SHARD"} 2>&1 | tee "$OUTDIR/gpu_tests_$pass${SHARD:+_part${SHARD%/*}}.log" \
      || status=1
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
