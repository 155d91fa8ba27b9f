#!/usr/bin/env bash
# Dry run of the chapters' GPU profile on CPU: each chapter is executed with PROFILE = "gpu" into
# OUT_DIR (the committed notebooks are not touched), its GSM8K cell training a tiny Qwen2 instruct
# model in the hub layout (tests/_hub_fixture.py, random weights) on the shipped fixture, one seed
# and one step, 16 questions x G = 2 (16: chapter 5 splits a rollout into 16 minibatches of whole groups) with a 32-token budget in bfloat16 autocast (GRPO_LAB_GPU_CONFIG),
# with GRPO_LAB_GPU_DEVICE=cpu. It checks that every chapter switches profile cleanly: the
# parameters reach the notebook, the toy experiments and their assertions run as on CPU, and the
# GSM8K cell trains through lab.run_chapter_gpu (chapter 7: its next-token cell through
# lab.run_rpt_gpu, the task's data files built from the stand-in with 16 test positions), writes its results file
# (marked dry_run) and shows it. With the run cache warm (after `make nbval`), the toy runs are not trained again.
# Usage: bash scripts/gpu_dryrun.sh [OUT_DIR [CHAPTER...]]   (default: _build/gpu_dryrun, chapters 1-8)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-_build/gpu_dryrun}
shift || true
CHAPTERS=("$@")
(( ${#CHAPTERS[@]} )) || CHAPTERS=(01_grpo 02_dapo 03_dr_grpo 04_gspo 05_cispo 06_vapo 07_rpt 08_choosing)
PY=${GRPO_LAB_PY:-.venv/bin/python}  # not $PYTHON: the Makefile uses that name for the interpreter that builds .venv
mkdir -p "$OUT"
OUT_ABS=$(cd "$OUT" && pwd)
[[ -f "$OUT_ABS/standin/config.json" ]] || \
  $PY -c "import sys; sys.path.insert(0, 'tests'); import transformers; transformers.logging.disable_progress_bar(); \
import _hub_fixture as H; H.write_tiny_instruct_model('$OUT_ABS/standin')"  # no 'Writing model shards' bar
export GRPO_LAB_GPU_MODEL="$OUT_ABS/standin" GRPO_LAB_GSM8K_SOURCE=fixture GRPO_LAB_GPU_DEVICE=cpu
# a small batch and budget (the code path, not the scale), in bfloat16 autocast (float32 is what "auto" gives on CPU)
export GRPO_LAB_GPU_CONFIG='{"prompts_per_step": 16, "group_size": 2, "max_new_tokens": 32, "micro_batch_size": 8, "precision": "bfloat16"}'
export GRPO_LAB_RESULTS_DIR="$OUT_ABS/results"
# chapter 7: its task's data files built with 16 held-out positions, not 500: evaluating 500 positions
# (greedy and sampled, before and after RPT and after continued NTP) was most of that chapter's dry-run time
export GRPO_LAB_RPT_TEST_SIZE=16
rm -rf "$GRPO_LAB_RESULTS_DIR"
for ch in "${CHAPTERS[@]}"; do
  start=$(date +%s)
  $PY -m grpo_lab.lab.book execute "book/$ch.ipynb" --out "$OUT_ABS/$ch.ipynb" \
    --param "PROFILE='gpu'" --param "GPU_STEPS=1" --param "GPU_SEEDS=(0,)" >/dev/null
  $PY - "$GRPO_LAB_RESULTS_DIR/$ch.json" "$OUT_ABS/$ch.ipynb" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["provenance"]
assert p["dry_run"] is True and p["complete"] is True and p["steps"] == 1 and p["seeds"] == [0], p
assert p["precision"] == "bfloat16", p["precision"]
if "task_data" in p:  # chapter 7: the data files were built with the dry run's test size
    assert p["task_data"]["test_positions"] == 16, p["task_data"]
nb = json.load(open(sys.argv[2]))
shown = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []) if o.get("name") == "stdout")
assert "DRY RUN of the GPU code path on cpu" in shown, "the chapter did not show its results"
print(f"{sys.argv[1].rsplit('/', 1)[-1][:-5]}: {sorted(p['runs'])}, {len(d['history'])} history rows", end="")
PYEOF
  echo ", $(( $(date +%s) - start )) s"
done
