#!/usr/bin/env bash
# GPU check: the CUDA-marked tests, a timed GPU-profile GRPO run (one seed, fewer steps), then the
# log-prob memory benchmark on CUDA in bfloat16 with a Qwen2.5-size vocabulary (V = 151,936,
# H = 896 as in Qwen2.5-0.5B; B*T = 8 x 1024 rows): naive vs chunked vs torch.compile'd chunked.
# Usage (on a machine with a CUDA GPU): bash scripts/gpu_check.sh [OUT_DIR]
# Writes OUT_DIR/gpu_tests.log, OUT_DIR/grpo_gpu_smoke.json, OUT_DIR/logprobs_memory_cuda.json (+ .txt)
# and prints a one-line summary per step. Meant to finish in under 8 minutes on one H200: the
# benchmark gets what is left of LOGPROBS_BUDGET_S (default 450 s, counted from the start of
# this script; skipped if under 60 s are left) and keeps the cases it finished if it runs out.
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

budget=$(( ${LOGPROBS_BUDGET_S:-450} - SECONDS ))
if (( budget < 60 )); then
  echo "log-prob benchmark (CUDA, bf16, V=151936): skipped, only ${budget} s left of LOGPROBS_BUDGET_S"
  exit 0
fi
start=$(date +%s)
rc=0
timeout --signal=TERM --kill-after=10 "$budget" \
  $PY benchmarks/logprobs_memory.py --device cuda --dtype bfloat16 --V 151936 --H 896 --B 8 --T 1024 \
    --repeats 5 --out "$OUT/logprobs_memory_cuda.json" \
    --cases hidden:naive,hidden:chunked:1024,hidden:compiled:1024,hidden:chunked:4096,hidden:compiled:4096,logits:naive,logits:fused,logits:chunked:1024 \
  2>&1 | tee "$OUT/logprobs_memory_cuda.txt" || rc=$?
if (( rc == 124 || rc == 137 )); then
  echo "log-prob benchmark (CUDA, bf16, V=151936): stopped after ${budget} s; finished cases in $OUT/logprobs_memory_cuda.json"
elif (( rc != 0 )); then
  echo "log-prob benchmark (CUDA, bf16, V=151936): FAILED (exit $rc), see $OUT/logprobs_memory_cuda.txt"
  exit "$rc"
else
  echo "log-prob benchmark (CUDA, bf16, V=151936): $(( $(date +%s) - start )) s"
fi
