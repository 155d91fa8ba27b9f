"""Tests for grpo_lab.experiments: profiles, multi-seed runs, provenance and results files."""

from grpo_lab.experiments import runs as runs_mod
from grpo_lab.experiments import run_cache as run_cache_mod
import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from grpo_lab.algo.algorithms import GRPO
from grpo_lab.experiments import (PROFILES, Profile, RunResult, config_hash, get_profile, load_results, provenance,
                                  run, save_results)
from grpo_lab.training.trainer import TrainerConfig

from _toys import tiny_profile

TIMING = ["tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb"]


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    return tiny_profile(tmp_path_factory.mktemp("base"), steps=2, eval_every=1)


@pytest.fixture(scope="module")
def result(profile):
    return run("GRPO", profile=profile, seeds=[0, 1], progress=False)


# ------------------------------------------------------------------------------------ profiles
def test_get_profile():
    assert get_profile("cpu") is PROFILES["cpu"]
    assert get_profile("gpu").config.device == "cuda"
    assert get_profile("cpu").config.device == "cpu"
    for name in ("cpu", "gpu"):
        p = get_profile(name)
        assert p.name == name and p.steps > 0
        assert (p.config.prompts_per_step * p.config.group_size) % p.config.minibatches == 0
    with pytest.raises(ValueError, match="cpu"):
        get_profile("tpu")


# ------------------------------------------------------------------------------------ run
def test_run_long_frame(result, profile):
    h = result.history
    assert isinstance(result, RunResult)
    assert list(h.columns[:2]) == ["algo", "seed"]
    assert (h["algo"] == "GRPO").all()
    # one block per seed, in order, each with the base evaluation (step 0) and two steps
    assert h["seed"].tolist() == [0, 0, 0, 1, 1, 1]
    assert h["step"].tolist() == [0, 1, 2, 0, 1, 2]
    for c in ("test_accuracy", "reward", "loss", "ratio_mean", "kl", "grad_norm", *TIMING):
        assert c in h, c
    assert h["test_accuracy"].notna().all()  # eval_every=1: every row is evaluated
    assert h["reward"].isna().tolist() == [True, False, False, True, False, False]
    assert result.final().index.tolist() == [0, 1]
    assert result.base().index.tolist() == [0, 1]
    assert result.base().between(0, 1).all() and result.final().between(0, 1).all()
    # both seeds start from the same base checkpoint: identical step-0 (greedy) evaluation
    assert result.base().iloc[0] == result.base().iloc[1]


def test_run_provenance(result, profile):
    prov = result.provenance
    for k in ("git_sha", "grpo_lab", "torch", "transformers", "python", "device", "device_name", "threads", "algo",
              "profile", "base", "task", "config", "steps", "seeds", "config_hash", "wall_seconds", "date"):
        assert k in prov, k
    assert prov["torch"] == torch.__version__
    assert prov["git_sha"] is None or re.fullmatch(r"[0-9a-f]{40}", prov["git_sha"])
    assert prov["seeds"] == [0, 1] and prov["steps"] == 2 and prov["profile"] == "t"
    assert prov["algo"]["name"] == "GRPO" and prov["algo"] == dataclasses.asdict(GRPO)
    assert prov["config_hash"] == config_hash(GRPO, profile, 2)
    assert prov["wall_seconds"] >= 0
    assert prov["device"] == "cpu"
    assert prov["config"] == profile.config.to_dict()


def test_seed_runs_are_independent(result, profile):
    # each seed restarts from the base weights and its own seed: running seed 1 alone reproduces
    # the seed-1 block of the two-seed run
    alone = run(GRPO, profile=profile, seeds=[1], progress=False).history.drop(columns=TIMING, errors="ignore")
    block = result.history[result.history["seed"] == 1].drop(columns=TIMING, errors="ignore").reset_index(drop=True)
    pd.testing.assert_frame_equal(alone, block, check_exact=True)


@pytest.mark.parametrize("kwargs", [
    dict(seeds=[]),
    dict(algo="not-an-algorithm"),
    dict(group_size=0),  # an invalid override value
    dict(profile="tpu"),
])
def test_run_errors(profile, kwargs):
    kwargs = {"algo": "GRPO", "profile": profile, "seeds": [0], **kwargs}
    with pytest.raises(ValueError):
        run(kwargs.pop("algo"), **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_run_gpu_profile_without_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        run("GRPO", profile="gpu", seeds=[0])


def test_run_unknown_override_is_value_error(profile):
    with pytest.raises(ValueError):
        run("GRPO", profile=profile, seeds=[0], not_a_field=1)


# ------------------------------------------------------------------------------------ results files
def _handmade_result():
    h = pd.DataFrame({
        "algo": ["GRPO"] * 4, "seed": [0, 0, 1, 1], "step": [0, 1, 0, 1],
        "test_accuracy": [0.25, float("nan"), 0.25, 1 / 3],
        "reward": [float("nan"), 0.1 + 0.2, float("nan"), 0.5],
    })
    return RunResult(h, {"config_hash": "abc", "seeds": [0, 1], "wall_seconds": 1.5})


def test_save_load_round_trip(tmp_path):
    res = _handmade_result()
    path = save_results(res, tmp_path / "gpu" / "grpo.json")
    assert path.is_file()
    back = load_results(path)
    assert back.provenance == res.provenance
    pd.testing.assert_frame_equal(back.history, res.history, check_exact=False, rtol=1e-9)
    assert back.final().tolist() == pytest.approx([0.25, 1 / 3])


def test_save_load_round_trip_of_a_run(result, tmp_path):
    back = load_results(save_results(result, tmp_path / "r.json"))
    assert back.provenance == result.provenance
    assert back.history.columns.tolist() == result.history.columns.tolist()
    for c in result.history.columns:
        a, b = result.history[c], back.history[c]
        if a.dtype.kind == "f":
            assert np.allclose(a.to_numpy(float), pd.to_numeric(b).to_numpy(float), rtol=1e-9, equal_nan=True), c
        else:
            assert a.tolist() == b.tolist(), c


def test_all_nan_column_stays_float(tmp_path):
    res = RunResult(pd.DataFrame({"step": [1, 2], "length_correct": [float("nan")] * 2}), {})
    back = load_results(save_results(res, tmp_path / "r.json"))
    assert back.history["length_correct"].dtype == np.float64
    pd.testing.assert_frame_equal(back.history, res.history)


@pytest.mark.parametrize("text", ['{"history": []}', '{"provenance": {}}', "[1, 2]", '"results"', "{}"])
def test_load_results_rejects_non_results(tmp_path, text):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="results"):
        load_results(path)


@pytest.mark.parametrize("text", ["3", "null"])
def test_load_results_rejects_json_scalars(tmp_path, text):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(ValueError):
        load_results(path)


def test_load_results_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_results(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("not json")
    with pytest.raises(ValueError):
        load_results(tmp_path / "bad.json")


# ------------------------------------------------------------------------------------ hashes
def test_config_hash(profile):
    h = config_hash(GRPO, profile, 2)
    assert re.fullmatch(r"[0-9a-f]{12}", h)
    assert config_hash(GRPO, dataclasses.replace(profile), 2) == h  # equal inputs, equal hash
    changed = [
        config_hash(GRPO, profile, 3),
        config_hash(GRPO.replace(beta=0.0), profile, 2),
        config_hash(GRPO, dataclasses.replace(profile, config=dataclasses.replace(profile.config, lr=2e-4)), 2),
        config_hash(GRPO, dataclasses.replace(profile, config=dataclasses.replace(profile.config, seed=1)), 2),
        config_hash(GRPO, dataclasses.replace(profile, task_kwargs=(("test_size", 6),)), 2),
        config_hash(GRPO, dataclasses.replace(profile, base="other"), 2),
        config_hash(GRPO, dataclasses.replace(profile, name="u"), 2),
    ]
    assert h not in changed and len(set(changed)) == len(changed)


def test_provenance_direct(profile):
    p = provenance(GRPO, profile, 5, [3, 4], wall_seconds=12.345)
    assert p["wall_seconds"] == 12.3 and p["seeds"] == [3, 4] and p["steps"] == 5
    assert p["config_hash"] == config_hash(GRPO, profile, 5)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", p["date"])
    assert math.isfinite(p["threads"])


# ------------------------------------------------------------------------------------ parallel runs
def test_run_grid_parallel_equals_serial(profile, result):
    # Two worker processes (spawned) must give exactly the numbers of the serial run: every run
    # is seeded and independent. The grid keeps the order of the algorithms and their names.
    from grpo_lab.experiments import run_grid

    other = GRPO.replace(name="GRPO eps 0.1", eps_low=0.1, eps_high=0.1)
    grid = run_grid([GRPO, other], profile=profile, seeds=[0, 1], n_jobs=2)
    assert list(grid) == ["GRPO", "GRPO eps 0.1"]
    a = grid["GRPO"].history.drop(columns=TIMING, errors="ignore")
    b = result.history.drop(columns=TIMING, errors="ignore")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert (grid["GRPO eps 0.1"].history["algo"] == "GRPO eps 0.1").all()
    with pytest.raises(ValueError, match="unique"):
        run_grid([GRPO, GRPO], profile=profile, seeds=[0])
    with pytest.raises(ValueError, match="n_jobs"):
        run("GRPO", profile=profile, seeds=[0], n_jobs=0)


def test_unregistered_choice_in_a_worker_names_the_cause(monkeypatch):
    from grpo_lab import experiments

    # found by a fresh user: a surrogate registered in the parent process only gave a bare KeyError
    # in the spawned workers; _train_one validates first and says why
    from grpo_lab.algo.algorithms import GRPO
    from grpo_lab.algo.objectives import SURROGATES

    monkeypatch.setitem(SURROGATES, "toy", SURROGATES["ppo"])
    algo = GRPO.replace(surrogate="toy")
    monkeypatch.delitem(SURROGATES, "toy")  # what a fresh worker sees
    with pytest.raises(ValueError, match="unknown surrogate 'toy'.*n_jobs=1"):
        runs_mod._train_one(algo, experiments.get_profile("cpu"), 1, 0, False)


# ------------------------------------------------------------------------------------ run cache
def test_run_cache_returns_the_identical_history_without_training(profile, tmp_path, monkeypatch):
    import grpo_lab.experiments as ex

    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", str(tmp_path / "cache"))
    fresh = run("GRPO", profile=profile, seeds=[0, 1], progress=False)
    assert fresh.provenance["cached_seeds"] == []
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2

    def no_training(*a, **k):
        raise AssertionError("a cached run was trained again")

    monkeypatch.setattr(ex.runs, "_train_one", no_training)  # where run looks it up
    again = run("GRPO", profile=profile, seeds=[1, 0], progress=False)
    assert again.provenance["cached_seeds"] == [1, 0]
    # bit for bit, dtypes included, in the order asked for
    pd.testing.assert_frame_equal(
        again.history.sort_values(["seed", "step"], kind="stable").reset_index(drop=True),
        fresh.history.sort_values(["seed", "step"], kind="stable").reset_index(drop=True), check_exact=True)
    # the name is a label: the same configuration under another name is the same run, relabelled
    renamed = run(GRPO.replace(name="GRPO (beta=0.04)"), profile=profile, seeds=[0], progress=False)
    assert (renamed.history["algo"] == "GRPO (beta=0.04)").all() and renamed.provenance["cached_seeds"] == [0]
    # any change of algorithm, steps, seed or configuration is a different run
    for kw in (dict(algo=GRPO.replace(beta=0.0)), dict(steps=1), dict(seeds=[2]), dict(lr=1e-3)):
        args = dict(algo="GRPO", profile=profile, seeds=[0], progress=False)
        args.update(kw)
        with pytest.raises(AssertionError, match="trained again"):
            run(args.pop("algo"), **args)


def test_a_chapters_run_time_says_whether_its_runs_came_from_the_run_cache(profile, tmp_path, monkeypatch):
    """book.run_time and book.cache_note (a chapter's Run time line and its "trained ... in N s" lines)
    follow what run() did: trained from an empty cache, or read from it (experiments.run_tally)."""
    import time

    import grpo_lab.experiments as ex
    from grpo_lab.lab import book

    monkeypatch.setattr(ex.runs, "_TALLY", {"trained": 0, "loaded": 0})  # as a fresh kernel
    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GRPO_LAB_CHAPTERS_AT_ONCE", raising=False)
    start = time.perf_counter()
    assert book.run_time(start).endswith(" seconds, with no training run")  # nothing trained or read yet
    fresh = run("GRPO", profile=profile, seeds=[0, 1], progress=False)
    assert ex.run_tally() == {"trained": 2, "loaded": 0}
    assert book.run_time(start).endswith(" minutes from an empty run cache") and book.cache_note(fresh) == ""
    again = run("GRPO", profile=profile, seeds=[0, 1, 2], progress=False)  # two hits, one new run
    assert ex.run_tally() == {"trained": 3, "loaded": 2}
    assert book.run_time(start).endswith(" minutes, 2 of 5 runs read from the run cache")
    assert book.cache_note(again) == " (2 of 3 seeded runs read from the run cache)"
    assert book.cache_note({"a": again, "b": fresh}) == " (2 of 5 seeded runs read from the run cache)"
    # make book's side-by-side execution (scripts/execute_cache.py) is said beside every stated time
    monkeypatch.setenv("GRPO_LAB_CHAPTERS_AT_ONCE", "2")
    beside = "while make book executed up to one other chapter on the same cores"
    assert book.run_time(start).endswith(" minutes, 2 of 5 runs read from the run cache, " + beside
                                         + " (alone it takes less)")
    assert book.cache_note(fresh) == f" ({beside}; alone it takes less)"
    assert book.cache_note(again) == f" (2 of 3 seeded runs read from the run cache; {beside}; alone it takes less)"
    monkeypatch.setenv("GRPO_LAB_CHAPTERS_AT_ONCE", "3")
    assert book.run_time(start).endswith("executed up to 2 other chapters on the same cores (alone it takes less)")
    for unset in ("1", "", "two", "\u00b2", "-2", "2.0"):  # "²" is a digit to str.isdigit, not to int()  # one chapter at a time (or not a count): nothing added
        monkeypatch.setenv("GRPO_LAB_CHAPTERS_AT_ONCE", unset)
        assert book.cache_note(fresh) == "" and book.run_time(start).endswith("run cache")
    with pytest.raises(TypeError, match="RunResult"):
        book.cache_note([again.history])
    with pytest.raises(TypeError, match="expected RunResult.*NoneType"):  # not iterated: named
        book.cache_note(None)
    with pytest.raises(ValueError, match="later than"):
        book.run_time(time.perf_counter() + 100)
    with pytest.raises(ValueError, match="finite"):
        book.run_time(float("nan"))


def test_run_cache_key_changes_with_the_package_source(profile, tmp_path, monkeypatch):
    import grpo_lab.experiments as ex

    a = ex.run_fingerprint(profile)
    assert a == ex.run_fingerprint(profile)
    real = ex.run_cache._hash_files

    def edited(h, root, pattern):  # as if one byte of the package changed
        real(h, root, pattern)
        h.update(b"#")

    monkeypatch.setattr(ex.run_cache, "_hash_files", edited)
    assert ex.run_fingerprint(profile) != a
    monkeypatch.setattr(ex.run_cache, "_hash_files", real)
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")  # a kernel choice that changes the numbers
    assert ex.run_fingerprint(profile) != a


@pytest.mark.parametrize("value", ["off", "0", "", " ", "none", "disabled", "False"])
def test_run_cache_can_be_turned_off(value, monkeypatch):
    import grpo_lab.experiments as ex

    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", value)
    assert ex.run_cache_dir() is None
    monkeypatch.delenv("GRPO_LAB_RUN_CACHE")
    assert ex.run_cache_dir().parts[-2:] == ("_build", "run_cache")  # a source checkout: the default
    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", "on")
    assert ex.run_cache_dir().parts[-2:] == ("_build", "run_cache")
    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", "~/runs")
    assert ex.run_cache_dir() == (Path.home() / "runs").resolve()


def test_run_cache_default_is_off_outside_a_source_checkout(monkeypatch, tmp_path):
    # an installed package (no pyproject.toml next to it) must not write _build/ into site-packages
    import grpo_lab.experiments as ex

    monkeypatch.delenv("GRPO_LAB_RUN_CACHE", raising=False)
    monkeypatch.setattr(ex.run_cache, "REPO_ROOT", tmp_path / "site-packages")
    assert ex.run_cache_dir() is None


def test_run_cache_skips_code_outside_the_package(profile, tmp_path, monkeypatch):
    # a registered surrogate is keyed only by its name, and its source is not in the fingerprint:
    # such runs are never cached (a stale result would be silent)
    import grpo_lab.experiments as ex
    from grpo_lab.algo.objectives import SURROGATES

    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", str(tmp_path))
    ppo = SURROGATES["ppo"]
    monkeypatch.setitem(SURROGATES, "mine", lambda ctx: ppo(ctx))
    algo = GRPO.replace(name="mine", surrogate="mine")
    assert run_cache_mod._uncacheable(algo, profile) == [f"SURROGATES['mine'] from {__name__}"]
    r = run(algo, profile=profile, seeds=[0], progress=False)
    assert r.provenance["run_cache"].startswith("off: code outside grpo_lab, SURROGATES['mine']")
    assert not list(tmp_path.glob("*.json"))
    # a monkeypatched built-in entry counts as outside code too
    monkeypatch.setitem(SURROGATES, "ppo", SURROGATES["mine"])
    assert run_cache_mod._uncacheable(GRPO, profile)
    assert run(GRPO, profile=profile, seeds=[0], progress=False).provenance["run_cache"].startswith("off")


def test_run_cache_key_covers_the_thread_count(profile):
    # TrainerConfig.threads=None runs with torch's current setting, which changes the numbers
    import grpo_lab.experiments as ex

    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ex.run_fingerprint(profile)
        torch.set_num_threads(2)
        assert ex.run_fingerprint(profile) != one
        fixed = dataclasses.replace(profile, config=dataclasses.replace(profile.config, threads=1))
        assert ex.run_fingerprint(fixed) == one  # an explicit count is what the run uses
    finally:
        torch.set_num_threads(n)


def test_run_cache_write_failure_keeps_the_run(profile, tmp_path, monkeypatch):
    afile = tmp_path / "not_a_dir"
    afile.write_text("x")
    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", str(afile))
    r = run("GRPO", profile=profile, seeds=[0], progress=False)  # cannot create the directory: no cache
    assert r.provenance["run_cache"].startswith("off:") and len(r.history) == 3
    import grpo_lab.experiments as ex

    target = tmp_path / "cache" / "entry.json"
    target.mkdir(parents=True)  # a directory where the file should go: the write fails late
    with pytest.warns(RuntimeWarning, match="could not store the run"):
        run_cache_mod._cache_store(target, [{"step": 0}])


@pytest.mark.parametrize("content", ['{"rows": []}', '{"rows": {}}', '{"rows": null}', '{"rows": [1, 2]}',
                                     '{"rows": [{"step": 0}, {"step": 1}]}'])
def test_run_cache_rejects_entries_that_are_not_a_finished_run(profile, tmp_path, monkeypatch, content):
    import grpo_lab.experiments as ex

    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", str(tmp_path))
    run("GRPO", profile=profile, seeds=[0], progress=False)
    (entry,) = tmp_path.glob("*.json")
    assert run_cache_mod._cache_load(entry, steps=2) is not None
    entry.write_text(content)  # well-formed JSON, but not the rows of a 2-step run
    assert run_cache_mod._cache_load(entry, steps=2) is None
    assert run("GRPO", profile=profile, seeds=[0], progress=False).provenance["cached_seeds"] == []


def test_run_grid_trains_one_configuration_once(profile, monkeypatch):
    import grpo_lab.experiments as ex

    calls = []
    real = runs_mod._train_one

    def counting(*a, **k):
        calls.append(a[0].name)
        return real(*a, **k)

    monkeypatch.setattr(ex.runs, "_train_one", counting)
    grid = ex.run_grid([GRPO, GRPO.replace(name="GRPO copy")], profile=profile, seeds=[0], cache=False)
    assert calls == ["GRPO"]
    assert (grid["GRPO copy"].history["algo"] == "GRPO copy").all()
    pd.testing.assert_frame_equal(grid["GRPO"].history.drop(columns="algo"),
                                  grid["GRPO copy"].history.drop(columns="algo"))


def test_run_grid_per_setting_overrides_equal_separate_runs(profile, monkeypatch):
    # A setting that differs only in the trainer (here: two minibatches) gives exactly the run that
    # run() with the same override gives; the other setting keeps the shared profile.
    import grpo_lab.experiments as ex

    mb2 = GRPO.replace(name="two minibatches")
    grid = ex.run_grid([GRPO, mb2], profile=profile, seeds=[0], cache=False, overrides={"two minibatches":
                                                                                          {"minibatches": 2}})
    alone = run(GRPO, profile=profile, seeds=[0], cache=False, minibatches=2, progress=False)
    pd.testing.assert_frame_equal(grid["two minibatches"].history.drop(columns=TIMING + ["algo"], errors="ignore"),
                                  alone.history.drop(columns=TIMING + ["algo"], errors="ignore"), check_exact=True)
    assert grid["two minibatches"].provenance["config"]["minibatches"] == 2
    assert grid["GRPO"].provenance["config"]["minibatches"] == profile.config.minibatches != 2
    # the override reached the trainer: each optimiser step sees half the rollout's 2 x 4 rows
    one, two = (grid[n].history.dropna(subset=["num_sequences"]) for n in ("GRPO", "two minibatches"))
    assert (one["num_sequences"] == 8).all() and (two["num_sequences"] == 4).all()
    with pytest.raises(ValueError, match="not among the algorithms"):
        ex.run_grid([GRPO], profile=profile, seeds=[0], overrides={"GRPO2": {"minibatches": 2}})
    with pytest.raises(ValueError, match="unknown TrainerConfig"):
        ex.run_grid([GRPO], profile=profile, seeds=[0], overrides={"GRPO": {"minibatchez": 2}})


def test_run_rejects_a_seed_override(profile):
    with pytest.raises(ValueError, match="seeds="):
        run("GRPO", profile=profile, seeds=[0], seed=7)


def test_damaged_cache_entry_is_trained_again(profile, tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", str(tmp_path))
    first = run("GRPO", profile=profile, seeds=[0], progress=False)
    (entry,) = tmp_path.glob("*.json")
    entry.write_text("{not json")
    again = run("GRPO", profile=profile, seeds=[0], progress=False)
    assert again.provenance["cached_seeds"] == []
    pd.testing.assert_frame_equal(again.history.drop(columns=TIMING, errors="ignore"), first.history.drop(columns=TIMING, errors="ignore"),
                                  check_exact=True)


# ------------------------------------------------------------------------------------ fresh-user review (issue 15)
def _tiny_profile(**kwargs):
    return Profile(**{"name": "t", "base": "no-such-checkpoint", "task": "arithmetic", "steps": 1,
                      "config": TrainerConfig(prompts_per_step=2, group_size=2), **kwargs})


def test_profile_task_must_be_a_name_and_the_error_says_how():
    # found by a fresh user: Profile(task=SortTask(max_len=4)) was accepted, and run() then said
    # "task SortTask(...) is not registered" although the class was registered
    from grpo_lab.tasks import ArithmeticTask

    with pytest.raises(TypeError) as info:
        _tiny_profile(task=ArithmeticTask(test_size=5))
    msg = str(info.value)
    assert "task must be the name (str) of a registered task" in msg
    # the fix, with the instance's own name and the arguments that differ from the defaults
    assert "register_task('arithmetic', ArithmeticTask)" in msg
    assert "task='arithmetic', task_kwargs={'test_size': 5}" in msg
    with pytest.raises(TypeError, match="registered task"):
        _tiny_profile(task=ArithmeticTask)  # the class is no name either
    with pytest.raises(ValueError, match="empty"):
        _tiny_profile(task=" ")
    # run(task=...) says the same instead of "unhashable type"
    with pytest.raises(TypeError, match="task must be the name \\(str\\).*task='arithmetic'"):
        run("GRPO", profile=_tiny_profile(), seeds=[0], task=ArithmeticTask())


def test_profile_task_kwargs_dict_or_pairs_are_one_sorted_tuple(profile):
    as_dict = _tiny_profile(task_kwargs={"test_size": 5, "digits": 1})
    as_pairs = _tiny_profile(task_kwargs=(("test_size", 5), ("digits", 1)))
    as_lists = _tiny_profile(task_kwargs=[["digits", 1], ["test_size", 5]])
    assert as_dict.task_kwargs == as_pairs.task_kwargs == as_lists.task_kwargs == (("digits", 1), ("test_size", 5))
    assert as_dict == as_pairs and hash(as_dict) == hash(as_pairs)  # a dict was kept before: unhashable
    assert config_hash(GRPO, as_dict, 3) == config_hash(GRPO, as_pairs, 3)
    assert _tiny_profile().task_kwargs == () and profile.task_kwargs == (("test_size", 5),)  # unchanged
    for bad, err in [(["test_size"], TypeError), ("test_size", TypeError), ({1: 2}, TypeError), (5, TypeError),
                     ((("a", 1), ("a", 2)), ValueError)]:
        with pytest.raises(err, match="task_kwargs"):
            _tiny_profile(task_kwargs=bad)


def test_cuda_device_without_cuda_names_the_setting_and_the_fix(profile, monkeypatch):
    # found by a fresh user: --set device=cuda with profile cpu said "profile 'cpu' needs CUDA ...;
    # use profile='cpu'", which contradicts itself
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as info:
        run("GRPO", profile=profile, seeds=[0], device="cuda")
    msg = str(info.value)
    assert "device='cuda'" in msg and "overrides" in msg and "--set device=cpu" in msg and "CUDA" in msg
    assert "profile='cpu'" not in msg and "profile 't'" not in msg
    with pytest.raises(ValueError) as info:
        run("GRPO", profile="gpu", seeds=[0])
    msg = str(info.value)
    assert "device='cuda'" in msg and "profile 'gpu'" in msg and "--set device=cpu" in msg and "profile='cpu'" in msg
