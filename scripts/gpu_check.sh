#!/usr/bin/env bash
# GPU check: the CUDA-marked tests, then a timed GPU-profile GRPO run (one seed, fewer steps).
# Usage (on a machine with a CUDA GPU): bash scripts/gpu_check.sh [OUT_DIR]
# Writes OUT_DIR/gpu_tests.log, OUT_DIR/grpo_gpu_smoke.json and prints a one-line summary.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-runs/gpu_check}}
mkdir -p "$OUT"
PY=${PYTHON:-python}
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0), torch.__version__)"
$PY -m pytest -q -m gpu tests 2>&1 | tee "$OUT/gpu_tests.log"
start=$(date +%s)
$PY -m grpo_lab.experiments GRPO --profile gpu --seeds 0 --steps 30 --out "$OUT/grpo_gpu_smoke.json"
echo "GPU-profile smoke run (30 steps, 1 seed): $(( $(date +%s) - start )) s"
