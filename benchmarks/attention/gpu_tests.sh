#!/usr/bin/env bash
# GPU tests + benchmark for the Forgetting Attention kernel, in one command from the repo root:
#   bash benchmarks/attention/gpu_tests.sh      (outputs under $OUT if set, else ./outputs/gpu)
# Installs the fla wheels from .whl/ when present (for the fla peer in the benchmark; no network needed).
# TRITON_TARBALL=path/triton.tar.xz (from slim_triton.sh) runs everything on that triton instead of the one the
# machine's torch ships (e.g. 3.7.1, the pinned version, on a machine whose torch ships 3.6).
# PYTEST_K (a pytest -k expression, e.g. PYTEST_K='fused or acp'), SKIP_TESTS=1 and SKIP_BENCH=1 split the pass
# into several shorter ones; PYTEST_ARGS adds other pytest flags (split on spaces); BENCH_ARGS, the benchmark's.
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
if [ "${SKIP_TESTS:-0}" != "1" ]; then
  FOX_AUTOTUNE=0 python3 -m pytest -m gpu tests/ops -q -s -x ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-} 2>&1 \
    | tee "$OUTDIR/gpu_tests.log"
fi
if [ "${SKIP_BENCH:-0}" != "1" ]; then
  python3 -m benchmarks.attention.bench --out "$OUTDIR/benchmarks.md" ${BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/bench.log"
fi
