#!/usr/bin/env bash
# GPU checks of the training stack in one command; outputs under $OUT (else outputs/gpu_train).
#   bash scripts/gpu_train_checks.sh single   # one GPU: train.py end to end (bf16), bench_train.py 125M/760M at 16k
#   bash scripts/gpu_train_checks.sh multi    # two GPUs: FSDP 1 vs 2 ranks (same global batch), FSDP throughput
#   bash scripts/gpu_train_checks.sh precision  # every GPU (NGPU=N: the first N): FSDP tokens/s and peak memory of
#                                             # compiled FoX (Pro) 760M at 16k, strategy.fsdp_precision=bf16_params
#                                             # then autocast
# Hydra, omegaconf, antlr4 and zarr must be importable (on a machine without network access: install wheels first).
set -uo pipefail
OUTDIR=${OUT:-outputs/gpu_train}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 FOX_CACHE_DIR=${FOX_CACHE_DIR:-/tmp/fox_cache}
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUTDIR/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUTDIR/gpu.txt"
common=(train.batch_size=16 train.micro_batch_size=8 eval.per_token_rows=8)
case "${1:-single}" in
  single)
    python3 train.py output_dir="$OUTDIR/tiny_gpu" train.max_steps=96 "${common[@]}" 2>&1 | tee "$OUTDIR/tiny_gpu.log"
    python3 scripts/bench_train.py --models fox_pro transformer_pro --sizes 125m 760m --seq-len 16384 \
      --write "$OUTDIR/bench_train.md" 2>&1 | tee "$OUTDIR/bench_train.log"
    ;;
  multi)
    for n in 1 2; do
      torchrun --standalone --nproc_per_node=$n train.py strategy=fsdp output_dir="$OUTDIR/fsdp$n" \
        train.max_steps=64 eval.per_token_loss=false "${common[@]}" 2>&1 | tee "$OUTDIR/fsdp$n.log"
    done
    python3 - "$OUTDIR" <<'PY' | tee "$OUTDIR/fsdp_compare.txt"
import json, sys
rows = {n: [json.loads(l) for l in open(f"{sys.argv[1]}/fsdp{n}/metrics.jsonl")] for n in (1, 2)}
diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(rows[1], rows[2]) if "loss" in a]
print("steps", len(diffs), "max |loss_1gpu - loss_2gpu|", max(diffs), "final", rows[1][-1], rows[2][-1])
PY
    for n in 1 2; do
      torchrun --standalone --nproc_per_node=$n scripts/bench_train.py --strategy fsdp --sizes 125m 760m \
        --seq-len 16384 --write "$OUTDIR/bench_train_fsdp.md" 2>&1 | tee -a "$OUTDIR/bench_train_fsdp.log"
    done
    ;;
  precision)
    n=${NGPU:-$(nvidia-smi -L | wc -l)}
    for p in bf16_params autocast; do  # a process each: each peak memory is its own
      torchrun --standalone --nproc_per_node="$n" scripts/bench_train.py --strategy fsdp --fsdp-precision $p \
        --models fox_pro --sizes 760m --seq-len 16384 --compile --write "$OUTDIR/bench_fsdp_precision.md" 2>&1 \
        | tee -a "$OUTDIR/bench_fsdp_precision.log"
    done
    ;;
esac
