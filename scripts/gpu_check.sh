#!/usr/bin/env bash
# GPU check: the CUDA-marked tests; chapter 1 executed on the GPU profile with fewer steps (its toy
# experiments as on CPU, then its GSM8K cell: GRPO trained on CUDA with precision "auto" through
# lab.run_chapter_gpu, the results file written with provenance and checked by
# lab.check_gpu_results); then the log-prob memory benchmark on CUDA in bfloat16 with a
# Qwen2.5-size vocabulary (V = 151,936, H = 896 as in Qwen2.5-0.5B; B*T = 8 x 1024 rows): naive vs
# chunked vs torch.compile'd chunked.
#
# The GSM8K model and data: GRPO_LAB_GPU_MODEL and GRPO_LAB_GSM8K_SOURCE if set (e.g. the real
# Qwen/Qwen2.5-0.5B-Instruct and "hub" on a machine that can download them or has them cached);
# otherwise a tiny Qwen2 instruct model in the hub layout is written here (tests/_hub_fixture.py,
# random weights: its accuracy is 0, so the run checks the code path and the timing, not learning)
# and the problems are the shipped fixture. CHAPTER_STEPS (default 3) and CHAPTER_SEEDS (default
# "(0, 1)") size the GSM8K runs; CHAPTER_BUDGET_S (default 360, at most what is left of 450 s from the start) stops the chapter if it runs longer.
# Then the memory model (grpo_lab/experiments/memory_model.py) against torch.cuda.max_memory_allocated, phase by
# phase, on a random stand-in with Qwen2.5-0.5B's config (V = 151,936) at the GPU profile's shapes
# (benchmarks/memory_model.py --scale gpu: rollout of 128 rows x 256 prompt + 512 new tokens,
# greedy evaluation of 256 rows, the state after one AdamW step, one training micro-batch of 4 rows
# with and without gradient checkpointing, one no-grad scoring micro-batch; bfloat16 autocast),
# within MEMORY_BUDGET_S (default 180 s), written to OUT_DIR/memory_model_cuda.json (+ .txt) with
# provenance.
# CPU mode (no GPU): bash scripts/gpu_check.sh --cpu-memory [OUT_DIR] runs the same benchmark at tiny
# shapes (--scale test) on CPU and exits.
# Before the memory model: benchmarks/gpu_first_steps.py, the "colab" (T4) and "gpu" profiles' first
# FIRST_STEPS (default 2) GRPO steps in float16 + GradScaler and in bfloat16 (where the card has it), on the same
# model as the chapter run, within FIRST_STEPS_BUDGET_S (default 150 s): benchmarks/results/gpu_first_steps.json
# (git commit, device, torch / transformers versions, date) and benchmarks/README.md's gpu-first-steps table.
# Budgets: tests 90 s, first steps 150 s, memory model 120 s, then the chapter and the log-prob benchmark share
# what is left of 450 s: under 8 minutes in all.
# Usage (on a machine with a CUDA GPU): bash scripts/gpu_check.sh [OUT_DIR]
# Writes OUT_DIR/gpu_tests.log, OUT_DIR/01_grpo_gpu.ipynb (the executed chapter),
# OUT_DIR/results/01_grpo.json, OUT_DIR/logprobs_memory_cuda.json (+ .txt) and prints a one-line
# summary per step. Meant to finish in under 8 minutes on one H200: the benchmark gets what is left
# of LOGPROBS_BUDGET_S (default 450 s, counted from the start of this script; skipped if under 60 s
# are left) and keeps the cases it finished if it runs out.
set -euo pipefail
cd "$(dirname "$0")/.."
CPU_MEMORY=0
if [[ "${1:-}" == "--cpu-memory" ]]; then CPU_MEMORY=1; shift; fi
OUT=${1:-${OUT:-runs/gpu_check}}
mkdir -p "$OUT"
PY=${PYTHON:-python}
if (( CPU_MEMORY )); then
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} $PY benchmarks/memory_model.py --scale test --cases state,train,rollout \
    --out "$OUT/memory_model_cpu.json" 2>&1 | tee "$OUT/memory_model_cpu.txt"
  exit "${PIPESTATUS[0]}"
fi
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0), torch.__version__)"
timeout --signal=TERM --kill-after=10 "${TESTS_BUDGET_S:-90}" $PY -m pytest -q -m gpu tests 2>&1 | tee "$OUT/gpu_tests.log"
OUT_ABS=$(cd "$OUT" && pwd)  # the chapter's kernel runs in book/: absolute paths only
if [[ -z "${GRPO_LAB_GPU_MODEL:-}" ]]; then
  $PY -c "import sys; sys.path.insert(0, 'tests'); import _hub_fixture as H; H.write_tiny_instruct_model('$OUT_ABS/standin')"
  export GRPO_LAB_GPU_MODEL="$OUT_ABS/standin"
  export GRPO_LAB_GSM8K_SOURCE="${GRPO_LAB_GSM8K_SOURCE:-fixture}"
fi
# the colab (T4) and gpu profiles' first steps in float16 + GradScaler and in bfloat16: step time, generation
# tokens/s, peak memory beside the memory model; benchmarks/results/gpu_first_steps.json (provenance inside),
# then benchmarks/README.md's gpu-first-steps table from it
fs_rc=0
timeout --signal=TERM --kill-after=10 "${FIRST_STEPS_BUDGET_S:-150}" \
  $PY benchmarks/gpu_first_steps.py --device cuda --steps "${FIRST_STEPS:-2}" --model "$GRPO_LAB_GPU_MODEL" \
    --source "$GRPO_LAB_GSM8K_SOURCE" --out benchmarks/results/gpu_first_steps.json 2>&1 | tee "$OUT/gpu_first_steps.txt" \
  || fs_rc=$?
$PY benchmarks/gpu_first_steps.py --write-table || true
cp benchmarks/results/gpu_first_steps.json "$OUT/" 2>/dev/null || true
echo "first steps (colab and gpu profiles, float16 and bfloat16): exit ${fs_rc}, see $OUT/gpu_first_steps.txt"
mem_rc=0
timeout --signal=TERM --kill-after=10 "${MEMORY_BUDGET_S:-120}" \
  $PY benchmarks/memory_model.py --device cuda --scale gpu --cases rollout,evaluation,state,train,train_ckpt,score \
    --out "$OUT/memory_model_cuda.json" 2>&1 | tee "$OUT/memory_model_cuda.txt" || mem_rc=$?
echo "memory model vs CUDA max_memory_allocated (V=151936, GPU-profile shapes): exit ${mem_rc}, see $OUT/memory_model_cuda.txt"

start=$(date +%s)
export GRPO_LAB_RESULTS_DIR="$OUT_ABS/results"
chapter_budget=$(( ${CHAPTER_BUDGET_S:-360} < 450 - SECONDS ? ${CHAPTER_BUDGET_S:-360} : 450 - SECONDS ))
(( chapter_budget >= 30 )) || chapter_budget=30  # never 0 (timeout 0: no limit)
timeout --signal=TERM --kill-after=10 "$chapter_budget" \
$PY -m grpo_lab.lab.book execute book/01_grpo.ipynb --timeout 900 --out "$OUT/01_grpo_gpu.ipynb" \
  --param "PROFILE='gpu'" --param "GPU_STEPS=${CHAPTER_STEPS:-3}" --param "GPU_SEEDS=${CHAPTER_SEEDS:-(0, 1)}"
$PY - "$OUT/results/01_grpo.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["provenance"]
rows = [r for r in d["history"] if r.get("step", 0) > 0]
step_s = sum(r["step_seconds"] for r in rows) / len(rows)
print(f"chapter 1 on the GPU profile: {p['device_name']}, {p['precision']}, model {p['base']}, seeds {p['seeds']}, "
      f"{p['steps']} steps, {p['wall_seconds']} s for the GSM8K runs, {step_s:.1f} s per RL step, "
      f"peak {max(r['peak_mem_mb'] for r in rows):.0f} MB")
PYEOF
echo "chapter 1 on the GPU profile: $(( $(date +%s) - start )) s in all"

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
