"""Rollout memory at Qwen2.5's vocabulary size (issue 31): recording the behaviour log-probs must not hold every
step's logits. One measurement of ``benchmarks/rollout_memory.py`` (a fresh subprocess, peak RSS increase):
:func:`grpo_lab.policy.rollout.generate` with log-probs, 16 rows × 64 tokens, V = 151,936, must stay below one float32
``[B, T, V]`` tensor (594 MiB). The former path (``output_logits=True``, logits stacked) measured +2,394 MiB at
this shape; the new one about +30 MiB, as much as HF ``generate`` itself."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import rollout_memory  # noqa: E402

B, T, V = 16, 64, 151_936


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_rollout_logprobs_memory_is_not_btv():
    # greedy decoding (log-probs at temperature 1) records exactly what sampling does, several times faster
    # on a CPU than drawing from 151,936 tokens
    r = rollout_memory.measure("grpo_greedy", B, T, V, timeout=300)
    assert r["new_tokens"] == B * T  # every row ran the whole budget (EOS impossible)
    btv_mib = B * T * V * 4 / 2**20
    assert 0 < r["peak_extra_mib"] < btv_mib, (r, btv_mib)


def test_measure_refuses_unknown_case():
    with pytest.raises(ValueError, match="unknown case 'nope'"):
        rollout_memory.measure("nope", 1, 1)


def test_table_is_the_committed_results():
    """benchmarks/README.md's rollout-memory table is what ``benchmarks/rollout_memory.py`` prints from the committed results."""
    import json

    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / "benchmarks/results/rollout_memory.json").read_text())
    tables = (root / "benchmarks" / "README.md").read_text()
    block = tables.split("<!-- rollout-memory:start -->")[1].split("<!-- rollout-memory:end -->")[0]
    assert rollout_memory._table(data["results"]) in block and data["target_met"]
    assert f"commit {data['git_commit'][:7]}" in block and not data["git_dirty"]
