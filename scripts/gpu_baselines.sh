#!/usr/bin/env bash
# The fla baselines on a GPU, in one command (logs under $OUT if set, else ./outputs/gpu_baselines):
#
#   bash scripts/gpu_baselines.sh                           # all five baselines
#   MODELS="mamba2 deltanet" bash scripts/gpu_baselines.sh  # a subset (e.g. to split the work over calls)
#   COMMON=0 MODELS="hgrn2 samba" bash scripts/gpu_baselines.sh   # ... without the shared tests again
#
# For each model, independently: its tests of tests/models/test_baselines.py on CUDA (the model contract, the
# chunked kernels against the recurrent ones / fla's naive SSD / masked SDPA, bf16 training), then a short
# `train.py model=<m> model/size=tiny data=embedded` run (TRAIN_STEPS steps, held-out and per-token loss).
# First the tests every model shares. One summary line per model at the end (and in $OUT/summary.txt).
# Stages left when BUDGET_S seconds have passed are skipped (reported as such), so the logs come back before
# a 10-minute time limit on the job; fla's Triton kernels compile and autotune on first use, which takes most of it.
# Needs: torch + triton (CUDA), hydra/omegaconf/zarr/tokenizers/transformers on PYTHONPATH (set by the caller);
# fla and einops install from the wheels in .whl/ when present (no network needed).
set -uo pipefail
OUTDIR=${OUT:-outputs/gpu_baselines}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
MODELS=${MODELS:-mamba2 deltanet hgrn2 samba transformer_swa}
TRAIN_STEPS=${TRAIN_STEPS:-20}
BUDGET_S=${BUDGET_S:-540}
START=$(date +%s)
SUMMARY="$OUTDIR/summary.txt"
: > "$SUMMARY"

if ls .whl/fla_core-*.whl >/dev/null 2>&1; then
  wheels=(.whl/fla_core-*.whl .whl/flash_linear_attention-*.whl)
  python3 -c "import einops" 2>/dev/null || wheels+=(.whl/einops-*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${wheels[@]}" 2>&1 | tee "$OUTDIR/pip.log" && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUTDIR/gpu.txt"
python3 - <<'EOF' 2>&1 | tee "$OUTDIR/versions.txt"
import importlib
for name in ("torch", "triton", "fla", "einops", "transformers", "hydra", "omegaconf", "zarr", "tokenizers"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as e:  # report every missing package, not just the first
        print(name, "MISSING:", repr(e))
EOF

# fla's layers import transformers (an fla dependency): without it every model fails; say so up front.
if ! python3 -c "import fla.layers" > "$OUTDIR/fla_import.log" 2>&1; then
  echo "fla.layers does not import ($(tail -1 "$OUTDIR/fla_import.log")): every baseline will fail" | tee -a "$SUMMARY"
fi

time_left() { [ $(( $(date +%s) - START )) -lt "$BUDGET_S" ]; }

# Runs the tests selected by -k "$2" into $OUTDIR/tests_$1.log; prints PASS/FAIL with pytest's count line.
run_tests() {
  local name=$1 select=$2 log="$OUTDIR/tests_$1.log"
  if ! time_left; then echo "SKIPPED (time budget)"; return; fi
  timeout 300 python3 -m pytest tests/models/test_baselines.py -q -s -p no:cacheprovider -k "$select" > "$log" 2>&1
  local rc=$? counts
  counts=$(grep -E "[0-9]+ (passed|failed|error)" "$log" | tail -1)
  if [ $rc -eq 0 ]; then echo "PASS (${counts})"; else echo "FAIL rc=$rc (${counts:-see $log})"; fi
}

# Trains model $1 for TRAIN_STEPS steps; prints PASS/FAIL with first/last training loss and the held-out loss.
run_train() {
  local m=$1 run="$OUTDIR/train_$1" log="$OUTDIR/train_$1.log"
  if ! time_left; then echo "SKIPPED (time budget)"; return; fi
  rm -rf "$run"
  timeout 300 python3 train.py model="$m" model/size=tiny data=embedded train.max_steps="$TRAIN_STEPS" \
    strategy.device=cuda output_dir="$run" train.log_every=5 train.checkpoint_every="$TRAIN_STEPS" \
    eval.heldout_batches=2 eval.per_token_rows=2 > "$log" 2>&1
  local rc=$?
  local stats
  stats=$(python3 - "$run/metrics.jsonl" <<'EOF' 2>/dev/null
import json, sys
rows = [json.loads(r) for r in open(sys.argv[1])]
loss = [r["loss"] for r in rows if "loss" in r]
held = [r["heldout_loss"] for r in rows if "heldout_loss" in r]
tps = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
print(f"loss {loss[0]:.3f} -> {loss[-1]:.3f}, heldout {held[-1]:.3f}, {tps[-1]:.0f} tok/s" if loss and held
      else f"incomplete metrics ({len(loss)} loss rows, {len(held)} heldout)")
EOF
)
  if [ $rc -eq 0 ] && [ -f "$run/per_token_loss.json" ]; then echo "PASS (${stats})"; else echo "FAIL rc=$rc (${stats:-see $log})"; fi
}

declare -A SELECT=(
  [mamba2]="mamba2"
  [deltanet]="deltanet"
  [hgrn2]="hgrn2"
  [samba]="samba"
  [transformer_swa]="transformer_swa or sliding"
)
common="not run (COMMON=0)"
[ "${COMMON:-1}" = "1" ] && common=$(run_tests common "not mamba2 and not deltanet and not hgrn2 and not samba and not transformer_swa and not sliding")
echo "common tests: $common" | tee -a "$SUMMARY"
declare -A RESULT
for m in $MODELS; do
  t=$(run_tests "$m" "${SELECT[$m]:-$m}")
  r=$(run_train "$m")
  RESULT[$m]="tests $t | train $r"
  echo "[$(( $(date +%s) - START ))s] $m: ${RESULT[$m]}"
done
echo "== summary ($(( $(date +%s) - START )) s)" | tee -a "$SUMMARY"
echo "common tests: $common"
for m in $MODELS; do echo "$m: ${RESULT[$m]}" | tee -a "$SUMMARY"; done
