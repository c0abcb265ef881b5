#!/usr/bin/env bash
# GPU tests + benchmark for the Forgetting Attention kernel, in one device call:
#   bash scripts/gpu_tests.sh            (outputs under $OUT if set, else ./outputs/gpu)
# Installs the carried fla wheels from .whl/ when present (for the fla baseline in the benchmark).
set -uo pipefail
OUTDIR=${OUT:-outputs/gpu}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
if ls .whl/fla_core-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$OUTDIR/gpu.txt"
if [ "${SKIP_TESTS:-0}" != "1" ]; then
  FOX_AUTOTUNE=0 python3 -m pytest -m gpu tests/ops -q -s -x ${PYTEST_ARGS:-} 2>&1 | tee "$OUTDIR/gpu_tests.log"
fi
if [ "${SKIP_BENCH:-0}" != "1" ]; then
  python3 scripts/bench_attention.py --out "$OUTDIR/benchmarks.md" ${BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/bench.log"
fi
