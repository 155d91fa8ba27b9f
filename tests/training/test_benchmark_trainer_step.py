"""benchmarks/trainer_step.py: each contender runs one step at a tiny shape and the result is sane JSON."""

import json
import math
import sys

import pytest

from _benchmarks import BENCHMARKS, benchmark_module

SCRIPT = BENCHMARKS / "trainer_step.py"


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("trainer_step.py", "benchmark_trainer_step") as module:
        yield module


def _check_times(result, shape_name, contenders, length):
    shape = result["shapes"][shape_name]
    for name in contenders:
        times = shape["times"][name]
        assert len(times) == 1 and all(math.isfinite(t) and t > 0 for t in times), (name, times)
        assert shape["summary"][name]["median"] == pytest.approx(times[0])
        assert length(shape["mean_length"][name]), (name, shape["mean_length"][name])
    return shape


def test_grpo_lab_and_bare_one_step(bench):
    assert bench._orders(("a", "b", "c"), 4) == [("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b"), ("a", "b", "c")]
    forced = bench.Shape("tiny", max_new_tokens=4, group_size=2, forced=True, prompts=2)
    free = bench.Shape("tiny_eos", max_new_tokens=4, group_size=2, forced=False, prompts=2)
    result = bench.run_benchmark([forced, free], warmup=0, reps=1, threads=1, with_trl=False)
    result = json.loads(json.dumps(result))  # JSON-able, and check what a reader of the file gets
    assert set(result["shapes"]) == {"tiny", "tiny_eos"}
    assert {"config", "versions", "processor", "threads", "warmup", "reps", "target"} <= set(result)
    assert result["threads"] == 1 and result["versions"]["torch"] and result["versions"]["trl"] is None
    assert result["target"]["met"] is None  # no short shape, no TRL
    shape = _check_times(result, "tiny", ("grpo_lab", "bare"), lambda n: n == 4.0)  # forced: the whole budget
    assert "trl" not in shape["times"]
    assert shape["ratios"]["grpo_lab/bare"] > 0 and shape["ratios"]["grpo_lab/trl"] is None
    _check_times(result, "tiny_eos", ("grpo_lab", "bare"), lambda n: 1.0 <= n <= 4.0)
    table = bench.markdown_table(result)
    assert table.startswith("| shape (16 questions × G) | grpo_lab s | bare s | TRL s |")
    assert "| tiny (2 × 2, =4 tok) |" in table and "not measured" in table


def test_missing_trl_exits_with_install_hint(bench, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # makes `import trl` raise ImportError
    with pytest.raises(SystemExit, match=r"pip install -e '\.\[bench\]'"):
        bench._import_trl()


@pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning")
def test_trl_one_generation_cycle(bench):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    forced = bench.Shape("tiny", max_new_tokens=4, group_size=2, forced=True, prompts=2)
    result = json.loads(json.dumps(bench.run_benchmark([forced], warmup=0, reps=1, threads=1, with_trl=True)))
    shape = _check_times(result, "tiny", ("grpo_lab", "bare", "trl"), lambda n: n == 4.0)
    setup = shape["trl_setup"]
    assert setup["computes_old_logps"] and setup["ref_model"] and setup["ref_equals_checkpoint"]
    assert setup["generation_batch_size"] == 4 and setup["steps_per_generation"] == 2
    assert not setup["activation_checkpointing"]
    assert all(r is not None and r > 0 for r in shape["ratios"].values())


def test_table_is_rewritten_between_the_markers(bench, tmp_path):
    # the committed results file drives the table; text around the markers is kept
    result = json.loads((SCRIPT.parent / "results" / "trainer_step_cpu.json").read_text())
    tables = tmp_path / "README.md"
    start, end = bench.TABLE_MARKERS
    tables.write_text(f"intro\n{start}\nstale table\n{end}\noutro\n")
    bench.write_table(result, tables)
    text = tables.read_text()
    assert text.startswith(f"intro\n{start}\n| shape (16 questions × G)") and text.endswith(f"{end}\noutro\n")
    assert "stale table" not in text and f"{result['threads']} threads" in text
    assert f"{result['shapes']['short']['summary']['grpo_lab']['median']:.3f}" in text
    tables.write_text("no markers\n")
    with pytest.raises(SystemExit, match="trainer-step:start"):
        bench.write_table(result, tables)


def test_benchmarks_readme_shows_the_committed_results(bench, tmp_path):
    # benchmarks/README.md's table is the one `trainer_step.py --write-table` writes from the committed JSON
    result = json.loads((SCRIPT.parent / "results" / "trainer_step_cpu.json").read_text())
    real = SCRIPT.parent / "README.md"
    assert bench.TABLES == real
    copy = tmp_path / "README.md"
    copy.write_text(real.read_text())
    bench.write_table(result, copy)
    assert copy.read_text() == real.read_text(), "run `python benchmarks/trainer_step.py --write-table`"
