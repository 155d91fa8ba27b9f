"""Tests for the command line (``python -m grpo_lab``, :mod:`grpo_lab.cli.main`), the forwarding of
``python -m grpo_lab.experiments``, and the ``base=`` / ``task=`` arguments of ``experiments.run``.

Most tests call :func:`grpo_lab.cli.main.main` in-process with ``experiments.run`` replaced by a recorder
(no training); three start ``python -m grpo_lab`` as a subprocess (help, an unknown preset, and one
real 1-step run from the shipped checkpoint)."""

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from grpo_lab.cli import main as cli
from grpo_lab import experiments
from grpo_lab.algo.algorithms import GRPO, PRESETS, Algorithm
from grpo_lab.experiments import PROFILES, Profile, RunResult, load_results, run
from grpo_lab.policy.models import TinyConfig, build_char_tokenizer, load_policy, tiny_policy
from grpo_lab.tasks import TASKS, ArithmeticTask
from grpo_lab.training.trainer import TrainerConfig

REPO = Path(__file__).resolve().parents[2]
PROG = "python -m grpo_lab"


def _env() -> dict:
    env = dict(os.environ, GRPO_LAB_RUN_CACHE="off", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _cli(*args: str, cwd=None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_lab", *args], capture_output=True, text=True, cwd=cwd,
                          env=_env(), timeout=timeout)


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def fake_run(monkeypatch):
    """``experiments.run`` replaced by a recorder returning a two-row-per-seed result (no training);
    each call also records the loading-bar switches as they were during the call."""
    calls = []

    def fake(algo, **kwargs):
        from transformers.utils import logging as hf_logging

        calls.append(dict(kwargs, algo=algo, env_bars=os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS"),
                          hf_bars=hf_logging.is_progress_bar_enabled()))
        seeds = list(kwargs["seeds"])
        rows = [{"algo": algo.name, "seed": s, "step": k, "test_accuracy": 0.25 + 0.25 * k} for s in seeds for k in (0, 1)]
        prov = {"steps": 1, "seeds": seeds, "wall_seconds": 0.1, "cached_seeds": [], "algo": dataclasses.asdict(algo)}
        return RunResult(pd.DataFrame(rows), prov)

    monkeypatch.setattr(experiments, "run", fake)
    return calls


@pytest.fixture
def no_run(monkeypatch):
    """A user mistake must be reported before anything trains."""

    def fail(*a, **k):
        raise AssertionError("experiments.run must not be called for a mistake in the command line")

    monkeypatch.setattr(experiments, "run", fail)


# ------------------------------------------------------------------------------------ help
def test_help_lists_presets_tasks_profiles_with_defaults():
    p = _cli("--help")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out.startswith(f"usage: {PROG} [train] PRESET"), out[:200]
    assert "experiments.py" not in out and "__main__.py" not in out
    for name in [*PRESETS, *TASKS, *PROFILES, "arithmetic-base", "eps_high", "prompts_per_step"]:
        assert name in out, name
    # defaults are shown
    assert "(default: cpu)" in out and "(default: 0 1 2)" in out and "(default: 1)" in out
    for option in ("--task", "--model", "--profile", "--steps", "--seeds", "--jobs", "--set", "--out", "--progress",
                   "--debug"):
        assert option in out, option


def test_help_names_the_console_script(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/grpo-lab", "--help"])
    assert cli.main() == 0
    assert capsys.readouterr().out.startswith("usage: grpo-lab [train] PRESET")


def test_list_prints_every_choice(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in [*PRESETS, *TASKS, *PROFILES, *cli.settable_fields(), "arithmetic-moe-base"]:
        assert name in out, name
    # DAPO is described by what it changes from GRPO
    dapo = next(line for line in out.splitlines() if line.strip().startswith("DAPO"))
    assert "eps_high=0.28" in dapo and "dynamic_sampling=True" in dapo


# ------------------------------------------------------------------------------------ errors
def test_unknown_preset_is_one_line_and_status_2():
    p = _cli("NOPE", "--steps", "1")
    assert p.returncode == 2
    line = _one_error_line(p.stderr)
    assert line.startswith(f"{PROG}: error: unknown preset 'NOPE'")
    assert all(name in line for name in PRESETS)
    assert p.stdout == ""


@pytest.mark.parametrize("args, expected", [
    (["GRPO", "--task", "nope"], ["'nope'", "arithmetic"]),
    (["GRPO", "--profile", "tpu"], ["'tpu'", "cpu", "gpu"]),
    (["GRPO", "--set", "lrr=1e-4"], ["unknown key 'lrr'", "did you mean 'lr'", "eps_high", "group_size"]),
    (["GRPO", "--set", "group_size=2.5"], ["group_size", "int", "'2.5'"]),
    (["GRPO", "--set", "eps_low=2"], ["eps_low must be in [0, 1]"]),
    (["GRPO", "--set", "seed=3"], ["--seeds"]),
    (["GRPO", "--model", "arithmetic-bse"], ["arithmetic-bse", "did you mean 'arithmetic-base'"]),
    (["GRPO", "--model", "{tmp}/missing"], ["no such directory"]),
    (["GRPO", "--model", "{tmp}"], ["no config.json"]),
    (["GRPO", "--jobs", "0"], ["--jobs must be >= 1"]),
    (["GRPO", "--steps", "-1"], ["--steps must be >= 0"]),
    (["GRPO", "--out", "{tmp}"], ["is a directory"]),
    (["GRPO", "--seeds", "zero"], ["--seeds", "'zero'"]),
    (["list", "GRPO"], ["list takes no arguments"]),
    ([], ["PRESET"]),
])
def test_user_mistakes_are_one_line_and_status_2(args, expected, tmp_path, no_run, capsys):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert line.startswith(f"{PROG}: error: ")
    for text in expected:
        assert text in line, (text, line)
    assert captured.out == ""


def test_errors_from_the_run_one_line_or_traceback_with_debug(monkeypatch, tmp_path, capsys):
    def raises(exc):
        def f(*a, **k):
            raise exc
        return f

    out = str(tmp_path / "r.json")
    monkeypatch.setattr(experiments, "run", raises(ValueError("run: profile 'gpu' needs CUDA\nsecond line")))
    assert cli.main(["GRPO", "--out", out]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == f"{PROG}: error: run: profile 'gpu' needs CUDA second line (--debug shows the traceback)"

    assert cli.main(["GRPO", "--out", out, "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: run: profile 'gpu' needs CUDA" in err

    monkeypatch.setattr(experiments, "run", raises(RuntimeError("boom")))  # not a user mistake: status 1
    assert cli.main(["GRPO", "--out", out]) == 1
    assert _one_error_line(capsys.readouterr().err) == f"{PROG}: error: RuntimeError: boom (--debug shows the traceback)"

    monkeypatch.setattr(experiments, "run", raises(KeyboardInterrupt()))
    assert cli.main(["GRPO", "--out", out]) == 130
    assert not (tmp_path / "r.json").exists()


def test_warnings_print_as_one_line_and_showwarning_is_restored(fake_run, monkeypatch, tmp_path, capsys):
    import warnings

    inner = experiments.run

    def warns(algo, **kwargs):
        warnings.warn("no learning signal\nat step 3", UserWarning, stacklevel=1)
        return inner(algo, **kwargs)

    monkeypatch.setattr(experiments, "run", warns)
    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert cli.main(["GRPO", "--seeds", "0", "--out", str(tmp_path / "r.json"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"{PROG}: warning: UserWarning: no learning signal at step 3\n" in err, err
    assert "cli.py" not in err and "warnings.warn" not in err
    assert warnings.showwarning is before


def test_ctrl_c_prints_the_out_path_and_the_resume_command(monkeypatch, tmp_path, capsys):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(experiments, "run", interrupted)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["GRPO", "--steps", "3", "--seeds", "0"]) == 130
    err = capsys.readouterr().err
    out = re.search(r"results file is (\S+);", err).group(1)
    assert out.startswith("runs/GRPO-cpu-") and out.endswith(".json"), err
    assert f"{PROG} GRPO --steps 3 --seeds 0 --out {out} --resume\n" in err, err
    assert "--save-every N" in err and err.rstrip().endswith(f"{PROG}: interrupted")

    assert cli.main(["GRPO", "--out", "r.json"]) == 130  # --out given: not repeated
    assert f"{PROG} GRPO --out r.json --resume\n" in capsys.readouterr().err


def test_resume_without_a_checkpoint_says_it_trains_from_step_0(tmp_path, caplog):
    import dataclasses

    from grpo_lab.algo.algorithms import GRPO
    from grpo_lab.experiments import get_profile
    from grpo_lab.experiments.runs import _log_resume_points

    (tmp_path / "GRPO" / "seed-1").mkdir(parents=True)
    assert cli._resume_points({0: tmp_path / "GRPO" / "seed-0", 1: tmp_path / "GRPO" / "seed-1"}, steps=4) == {}
    prof = get_profile("cpu")
    prof = dataclasses.replace(prof, config=dataclasses.replace(prof.config, output_dir=str(tmp_path)))
    with caplog.at_level("INFO", logger="grpo_lab.experiments.resume"):
        _log_resume_points([(GRPO, 0, prof), (GRPO, 1, prof)], steps=4, resume=True)
    assert caplog.messages == ["seed 0: no checkpoint, training from step 0", "seed 1: no checkpoint, training from step 0"]


# ------------------------------------------------------------------------------------ --set
def test_set_keys_are_every_trainer_and_algorithm_field_but_seed_and_progress():
    fields = {f.name for f in dataclasses.fields(TrainerConfig)} | {f.name for f in dataclasses.fields(Algorithm)}
    hyper = set(cli.hyperparameter_keys())  # the functions' own hyper-parameters (SAPO's tau_pos, ...)
    assert {"tau_pos", "tau_neg", "kl_cov_ratio", "clip_cov_lb", "is_cap"} <= hyper and not hyper & fields
    assert set(cli.settable_fields()) == (fields - {"seed", "progress", "params", "report_to"}) | hyper  # report_to: --report-to
    assert cli.settable_fields()["lr"][0] == "TrainerConfig" and cli.settable_fields()["eps_high"][0] == "Algorithm"
    assert cli.settable_fields()["tau_neg"][:2] == ("Algorithm.params", float)


def test_set_reaches_a_presets_own_hyperparameter(capsys):
    cfg, algo = cli.parse_set(["tau_neg=1.2", "lr=1e-4"])
    assert cfg == {"lr": 1e-4} and algo == {"tau_neg": 1.2}
    from grpo_lab.algo.algorithms import SAPO

    assert SAPO.replace(**algo).params["tau_neg"] == 1.2
    assert cli.main(["GRPO", "--set", "tau_neg=1.2", "--steps", "1"]) == 2  # GRPO's functions declare no tau_neg
    assert "unknown key(s) ['tau_neg']" in capsys.readouterr().err


def test_set_reaches_the_mismatch_cap_and_a_tis_config_file_repeats_the_run(tmp_path):
    # is_cap is declared by the mismatch corrections (TIS / MIS), an axis of its own
    cfg, algo = cli.parse_set(["is_cap=1.05"])
    assert cfg == {} and algo == {"is_cap": 1.05} and cli.settable_fields()["is_cap"][:2] == ("Algorithm.params", float)
    from grpo_lab.algo.algorithms import MIS

    assert MIS.replace(**algo).params["is_cap"] == 1.05
    path = tmp_path / "mis.yaml"  # what a MIS run writes as runs/X/config.yaml: its algorithm holds is_cap
    path.write_text("preset: MIS\nalgorithm:\n  is_cap: 1.05\n")
    assert cli.main(["--config", str(path), "--steps", "0", "--seeds", "0", "--out", str(tmp_path / "r.json")]) == 0


def test_parse_set_types_each_value_by_its_field():
    cfg, algo = cli.parse_set(["lr=1e-4", "group_size=4", "sort_by_length=false", "max_new_tokens=none",
                               "betas=0.9, 0.95", "device=cpu", "micro_batch_size=1_000", "eps_high=0.28", "kl=None",
                               "dynamic_sampling=YES", "name=my algo", "lr=2e-4"])
    assert cfg == {"lr": 2e-4, "group_size": 4, "sort_by_length": False, "max_new_tokens": None,
                   "betas": (0.9, 0.95), "device": "cpu", "micro_batch_size": 1000}
    assert algo == {"eps_high": 0.28, "kl": None, "dynamic_sampling": True, "name": "my algo"}
    assert type(cfg["group_size"]) is int and type(cfg["lr"]) is float and type(algo["dynamic_sampling"]) is bool
    assert cli.parse_set([]) == ({}, {})


@pytest.mark.parametrize("item, expected", [
    ("lr", "KEY=VALUE"),
    ("=3", "KEY=VALUE"),
    ("group_size=four", "group_size must be int, got 'four'"),
    ("group_size=4.0", "group_size must be int"),
    ("sort_by_length=maybe", "must be bool"),
    ("eps_high=none", "eps_high must be float, got 'none'"),  # eps_high does not take None
    ("lr=", "lr must be float"),
    ("old_logp=", "old_logp must be str"),
    ("betas=0.9;0.95", "betas must be numbers"),
    ("seed=1", "--seeds"),
    ("progress=true", "--progress"),
    ("lrr=1", "unknown key 'lrr' (did you mean 'lr'?); valid keys: adv_eps, advantage,"),
])
def test_parse_set_errors_name_the_problem(item, expected):
    with pytest.raises(cli.UsageError) as info:
        cli.parse_set([item])
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_key_lists_every_valid_key():
    with pytest.raises(cli.UsageError) as info:
        cli.parse_set(["nope=1"])
    listed = str(info.value).split("valid keys: ")[1].split(", ")
    assert listed == sorted(cli.settable_fields())


def test_options_and_overrides_reach_run(fake_run, tmp_path, capsys):
    out = tmp_path / "sub" / "res.json"
    assert cli.main(["grpo", "--set", "lr=1e-4", "--set", "eps_high=0.28", "--model", "arithmetic-moe-base",
                     "--task", "arithmetic", "--jobs", "2", "--seeds", "3", "4", "--steps", "5", "--no-cache",
                     "--out", str(out)]) == 0
    [call] = fake_run
    assert call["algo"] == GRPO.replace(eps_high=0.28)  # the preset, one field changed, its name kept
    assert call["lr"] == 1e-4 and call["base"] == "arithmetic-moe-base" and call["task"] == "arithmetic"
    assert call["n_jobs"] == 2 and call["seeds"] == [3, 4] and call["steps"] == 5 and call["cache"] is False
    # the step lines replace the training bar: progress False unless --progress (or --quiet, see below)
    assert call["profile"] == "cpu" and call["progress"] is False and call["save_model"] is True
    res = load_results(out)
    assert res.history["seed"].tolist() == [3, 3, 4, 4]
    assert res.provenance["algo"]["eps_high"] == 0.28
    stdout = capsys.readouterr().out
    assert f"results: {out}" in stdout
    # hand computation: the fake run ends each seed at accuracy 0.5, starting from 0.25
    assert ("test accuracy (greedy, 198 problems): base 0.250 -> final 0.500 ± 0.000 (mean ± sd over 2 seeds), "
            "95% interval [0.500, 0.500]") in stdout
    assert "per seed: s3 0.500 (99/198), s4 0.500 (99/198) (every seed ended at the same accuracy" in stdout


def test_defaults_reach_run(fake_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "DAPO"]) == 0
    [call] = fake_run
    assert call["algo"] is PRESETS["DAPO"]
    assert call["seeds"] == [0, 1, 2] and call["steps"] is None and call["n_jobs"] == 1 and call["cache"] is True
    assert call["base"] is None and call["task"] is None and call["profile"] == "cpu"
    assert not {"lr", "eps_high"} & set(call)


# ------------------------------------------------------------------------------------ --out
def test_default_out_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    now = time.strptime("2026-01-02 03:04:05", "%Y-%m-%d %H:%M:%S")
    first = cli.default_out("GRPO", "cpu", now)
    assert first == Path("runs/GRPO-cpu-20260102-030405.json")
    first.parent.mkdir()
    first.write_text("{}")
    assert cli.default_out("GRPO", "cpu", now) == Path("runs/GRPO-cpu-20260102-030405-2.json")


def test_without_out_results_go_to_runs(fake_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["dapo", "--seeds", "0"]) == 0
    [path] = (tmp_path / "runs").glob("*.json")
    assert path.name.startswith("DAPO-cpu-") and len(path.stem) == len("DAPO-cpu-20260102-030405")
    assert f"results: {Path('runs') / path.name}" in capsys.readouterr().out
    assert load_results(path).history["seed"].tolist() == [0, 0]


# ------------------------------------------------------------------------------------ progress
@pytest.mark.parametrize("flag, progress, bars_off", [([], False, True), (["--progress"], True, False),
                                                      (["--no-progress"], False, True), (["--quiet"], None, True),
                                                      (["--quiet", "--no-progress"], False, True)])
def test_loading_bars_only_with_progress(flag, progress, bars_off, fake_run, tmp_path, monkeypatch):
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    hf_logging.enable_progress_bar()
    assert cli.main(["GRPO", "--out", str(tmp_path / "r.json"), *flag]) == 0
    [call] = fake_run
    assert call["progress"] is progress
    assert (call["env_bars"] == "1") is bars_off  # inherited by spawned workers
    assert call["hf_bars"] is not bars_off  # this process
    # both put back afterwards
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ and hf_logging.is_progress_bar_enabled()


def test_loading_bars_leave_the_users_setting_alone(fake_run, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    assert cli.main(["GRPO", "--out", str(tmp_path / "r.json")]) == 0
    assert fake_run[0]["env_bars"] == "0" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"


# ------------------------------------------------------------------------------------ python -m grpo_lab.experiments
def test_the_old_experiments_entry_point_is_gone_and_says_what_replaces_it():
    # 0.2.0 removed ``python -m grpo_lab.experiments``; ``python -m grpo_lab`` is the one command line
    p = subprocess.run([sys.executable, "-m", "grpo_lab.experiments", "GRPO"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and "use python -m grpo_lab" in p.stderr, p.stderr


@pytest.mark.parametrize("old, new", [
    ("grpo_lab.trainer", "grpo_lab.training"),
    ("grpo_lab.algorithms", "grpo_lab.algo.algorithms"),
    ("grpo_lab.experiments.rpt_gpu", "grpo_lab.lab.rpt_gpu"),
])
def test_an_import_of_a_0_1_path_names_the_new_one(old, new):
    # found by a fresh user: 0.1.0's paths failed with Python's bare "No module named" / "cannot import name"
    import importlib

    with pytest.raises(ModuleNotFoundError, match="moved in grpo_lab 0.2.0: use " + re.escape(new)):
        importlib.import_module(old)
    import grpo_lab

    with pytest.raises(ModuleNotFoundError, match="grpo_lab.algo.selection"):  # from grpo_lab import sampling
        getattr(grpo_lab, "sampling")
    assert not hasattr(grpo_lab, "no_such_name")  # other missing names stay plain AttributeErrors


# ------------------------------------------------------------------------------------ run(base=, task=)
@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny-base")
    tok = build_char_tokenizer()
    tiny_policy(tok, TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=1), seed=0).save_pretrained(base, safe_serialization=True)
    tok.save_pretrained(base)
    return base


PROFILE = Profile(name="t", base="no-such-checkpoint", task="arithmetic", steps=1,
                  config=TrainerConfig(prompts_per_step=2, group_size=2, max_new_tokens=8, eval_every=1),
                  task_kwargs=(("test_size", 5),))


def test_run_takes_base_and_task(tiny_base, monkeypatch):
    made = []

    def get_task(name, **kwargs):
        made.append((name, kwargs))
        return ArithmeticTask(**kwargs)

    monkeypatch.setattr(experiments.runs, "get_task", get_task)  # where the run looks it up
    monkeypatch.setitem(TASKS, "arith2", ArithmeticTask)
    # another task: the profile's task_kwargs (for its own task) are dropped
    res = run("GRPO", profile=PROFILE, seeds=[0], cache=False, progress=False, base=str(tiny_base), task="arith2",
              eval_every=0)
    assert made == [("arith2", {})]
    assert res.provenance["base"] == str(tiny_base) and res.provenance["task"] == "arith2"
    assert res.history["step"].tolist() == [1]
    # the profile's own task: its task_kwargs are kept
    made.clear()
    res = run("GRPO", profile=PROFILE, seeds=[0], steps=0, cache=False, progress=False, base=tiny_base,
              task="arithmetic")
    assert made == [("arithmetic", {"test_size": 5})]
    assert res.history["step"].tolist() == [0] and res.provenance["base"] == str(tiny_base)


def test_run_rejects_an_unknown_task_and_an_empty_base():
    with pytest.raises(ValueError, match="unknown task 'nope'; known tasks: \\['arithmetic', 'calculator', 'dataset', 'dialogue', 'gsm8k', 'long_chain', 'next_token'\\]"):
        run("GRPO", profile=PROFILE, seeds=[0], task="nope")
    with pytest.raises(ValueError, match="base must be a checkpoint name"):
        run("GRPO", profile=PROFILE, seeds=[0], base=" ")


# ------------------------------------------------------------------------------------ end to end
def test_a_real_run_end_to_end(tmp_path):
    p = _cli("GRPO", "--steps", "1", "--seeds", "0", "--set", "prompts_per_step=2", "--set", "group_size=2",
             cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    [path] = (tmp_path / "runs").glob("GRPO-cpu-*.json")
    assert f"results: {Path('runs') / path.name}" in p.stdout
    assert "Traceback" not in p.stderr and "Loading weights" not in p.stderr
    res = load_results(path)
    h = res.history
    assert h["seed"].tolist() == [0, 0] and h["step"].tolist() == [0, 1]
    assert h["test_accuracy"].between(0, 1).all()  # the cpu profile evaluates before the first and after the last step
    prov = res.provenance
    assert prov["steps"] == 1 and prov["seeds"] == [0] and prov["base"] == "arithmetic-base"
    assert prov["config"]["prompts_per_step"] == 2 and prov["config"]["group_size"] == 2
    assert prov["algo"] == dataclasses.asdict(GRPO)
    # what it printed (issue 36): a line per step, the labelled summary (its numbers the file's), the paths
    lines = p.stdout.splitlines()
    assert lines[0].startswith("GRPO seed 0 step 0/1 | base policy | test_accuracy ")
    assert lines[1].startswith("GRPO seed 0 step 1/1 | reward ") and "| kl " in lines[1] and "| length " in lines[1]
    final, base = res.final()[0], res.base()[0]
    assert (f"test accuracy (greedy, 198 problems): base {base:.3f} -> final {final:.3f} (1 seed: no spread over "
            "seeds, no interval)") in lines
    assert f"  per seed: s0 {final:.3f} ({round(final * 198)}/198)" in lines
    model = Path("runs") / path.stem / "GRPO" / "seed-0" / "final"
    assert f"  seed 0: {model}" in lines
    policy, _ = load_policy(tmp_path / model, progress=False)  # the trained policy, not the base
    trained = dict(policy.named_parameters())
    assert any(not torch.equal(trained[k], v) for k, v in load_policy("arithmetic-base")[0].named_parameters())
    assert f"figure: {Path('runs') / (path.stem + '.png')}" in p.stdout and path.with_suffix(".png").is_file()


# ------------------------------------------------------------------------------------ fresh-user review (issue 15)
def test_an_existing_out_is_refused_before_training(tmp_path, no_run, capsys):
    # found by a fresh user: --out README.md overwrote the tracked README with results JSON
    readme = tmp_path / "README.md"
    readme.write_text("# keep me\n")
    assert cli.main(["GRPO", "--steps", "2", "--seeds", "5", "--out", str(readme)]) == 2
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert line.startswith(f"{PROG}: error: --out {readme} exists") and "--overwrite" in line
    assert readme.read_text() == "# keep me\n" and captured.out == ""


def test_overwrite_replaces_an_existing_out(fake_run, tmp_path):
    out = tmp_path / "r.json"
    out.write_text("old\n")
    assert cli.main(["GRPO", "--seeds", "0", "--out", str(out), "--overwrite"]) == 0
    assert load_results(out).history["seed"].tolist() == [0, 0]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no file can be created")
def test_an_out_that_cannot_be_created_fails_before_training(no_run, capsys):
    # found by a fresh user: --out /proc/y.json trained first and failed afterwards ([Errno 2])
    assert cli.main(["GRPO", "--out", "/proc/grpo_lab_no_such_dir_test.json"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"{PROG}: error: --out /proc/grpo_lab_no_such_dir_test.json: cannot create a file in /proc")


def test_help_documents_import_and_overwrite(capsys):
    assert cli.main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    assert "--import MODULE" in out and "--overwrite" in out and "refused unless --overwrite" in out
    assert "register_task" in out  # the example says what the module does


def test_cuda_override_without_cuda_is_one_line_naming_the_setting(monkeypatch, tmp_path, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["GRPO", "--set", "device=cuda", "--out", str(tmp_path / "r.json")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "device='cuda'" in line and "--set device=cpu" in line and "profile='cpu'" not in line


TASK_MODULE = '''
from dataclasses import dataclass

from grpo_lab.tasks import ArithmeticTask, register_task


@register_task("{name}")
@dataclass
class UserTask(ArithmeticTask):
    name: str = "{name}"
    test_size: int = 6
'''


def test_import_a_task_file_makes_it_a_task_choice(user_modules, fake_run, tmp_path, capsys):
    # found by a fresh user: --task only accepted the shipped tasks
    mod = tmp_path / "mods" / "cli_user_sort.py"
    mod.parent.mkdir()
    mod.write_text(TASK_MODULE.format(name="sortletters"))
    assert cli.main(["list", "--import", str(mod)]) == 0
    assert any(line.split()[:1] == ["sortletters"] for line in capsys.readouterr().out.splitlines())
    assert cli.main(["GRPO", "--import", str(mod), "--help"]) == 0
    assert "sortletters" in capsys.readouterr().out
    assert cli.main(["GRPO", "--import", str(mod), "--task", "sortletters", "--out", str(tmp_path / "r.json")]) == 0
    assert fake_run[-1]["task"] == "sortletters"
    assert sys.modules["cli_user_sort"].__file__ == str(mod.resolve())
    assert str(mod.parent.resolve()) in sys.path  # where worker processes find it again


def test_import_a_module_by_name_from_the_current_directory(user_modules, fake_run, tmp_path, monkeypatch):
    (tmp_path / "cli_user_words.py").write_text(TASK_MODULE.format(name="words"))
    monkeypatch.chdir(tmp_path)
    sys.path[:] = [p for p in sys.path if p not in ("", ".", str(tmp_path))]  # as for the grpo-lab script
    assert cli.main(["GRPO", "--import=cli_user_words", "--task", "words", "--seeds", "0"]) == 0
    assert fake_run[-1]["task"] == "words"


@pytest.mark.parametrize("spec, expected", [
    ("cli_user_no_such_module", "--import cli_user_no_such_module: no module named 'cli_user_no_such_module'"),
    ("{tmp}/cli_user_missing.py", "cli_user_missing.py: no such file"),
    ("{tmp}/cli_user_boom.py", "cli_user_boom.py: importing it failed: RuntimeError: boom at import"),
    ("{tmp}/cli_user_needs.py", "importing it failed: ModuleNotFoundError: No module named 'cli_user_dependency'"),
    ("{tmp}/json.py", "the name 'json' is already taken"),
])
def test_an_import_that_fails_is_one_line_naming_it(spec, expected, user_modules, tmp_path, no_run, capsys):
    (tmp_path / "cli_user_boom.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "cli_user_needs.py").write_text("import cli_user_dependency\n")
    (tmp_path / "json.py").write_text("")
    spec = spec.replace("{tmp}", str(tmp_path))
    assert cli.main(["GRPO", "--import", spec, "--seeds", "0"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"{PROG}: error: --import ") and expected in line, line


def test_a_model_whose_tokenizer_cannot_read_the_task_warns(tiny_base, fake_run, tmp_path, capsys):
    # found by a fresh user: arithmetic through a tokenizer without digits (every prompt <unk>),
    # accuracy 0 -> 0, exit 0 and no word about it
    letters = tmp_path / "letters-base"
    tok = build_char_tokenizer("abcdefghijklmnopqrstuvwxyz+= ")
    tiny_policy(tok, TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=1), seed=0).save_pretrained(letters, safe_serialization=True)
    tok.save_pretrained(letters)
    capsys.readouterr()  # (save_pretrained's own bars)
    assert cli.main(["GRPO", "--model", str(letters), "--seeds", "0", "--out", str(tmp_path / "a.json")]) == 0
    err = capsys.readouterr().err
    warning = _one_error_line(err)
    assert warning.startswith(f"{PROG}: warning: the tokenizer of --model {letters} maps '")
    unknown = re.search(r" maps '([^']*)'", warning).group(1)
    assert unknown and unknown.isdigit()  # the prompts' digits, and nothing the tokenizer knows
    assert "'<unk>'" in warning and "task 'arithmetic'" in warning and "''" not in warning  # no 'arithmetic''s
    assert len(fake_run) == 1  # a warning, not an error: the run goes on
    # the full alphabet reads every prompt: no warning
    assert cli.main(["GRPO", "--model", str(tiny_base), "--seeds", "0", "--out", str(tmp_path / "b.json")]) == 0
    assert capsys.readouterr().err == ""


def test_cli_import_reaches_the_worker_processes(user_modules, tiny_base, tmp_path, monkeypatch, capsys):
    # a task from a .py file given by path, trained by two worker processes (--jobs 2): each imports
    # the module by its name, from the directory the command put on sys.path
    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", "off")
    mod = tmp_path / "elsewhere" / "cli_user_jobs.py"
    mod.parent.mkdir()
    mod.write_text(TASK_MODULE.format(name="jobs_task"))
    out = tmp_path / "r.json"
    try:
        assert cli.main(["GRPO", "--import", str(mod), "--task", "jobs_task", "--model", str(tiny_base), "--jobs", "2",
                         "--seeds", "0", "1", "--steps", "1", "--set", "prompts_per_step=2", "--set", "group_size=2",
                         "--set", "max_new_tokens=8", "--set", "eval_every=0", "--no-progress", "--out", str(out)]) == 0
    finally:
        experiments.shutdown_workers()
    res = load_results(out)
    assert res.provenance["task"] == "jobs_task" and sorted(set(res.history["seed"])) == [0, 1]
    assert res.history["step"].tolist() == [1, 1]
    # the step lines of both workers' seeds reach this process's output (read from their metrics.jsonl)
    stdout = capsys.readouterr().out
    assert stdout.count("GRPO seed 0 step 1/1 | reward ") == 1 and stdout.count("GRPO seed 1 step 1/1 | reward ") == 1


def test_check_config_refuses_grpo_labs_own_run_configuration(tmp_path, capsys):
    conf = tmp_path / "run.yaml"
    conf.write_text("preset: DAPO\nsteps: 4\ntrainer: {lr: 1.0e-4}\nalgorithm: {eps_high: 0.28}\n")
    assert cli.main(["check-config", str(conf)]) == 2
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert line == (f"{PROG}: error: {conf} is a grpo_lab run configuration (--config {conf}), "
                    "not a TRL/verl config"), line
    assert captured.out == ""


def test_a_missing_relative_directory_is_not_read_as_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.resolve_model("runs/nonexistent") == "runs/nonexistent"  # no runs/ here: a hub id
    (tmp_path / "runs").mkdir()
    with pytest.raises(cli.UsageError, match=r"--model runs/nonexistent: no such directory \(runs/ exists"):
        cli.resolve_model("runs/nonexistent")


def test_an_unknown_task_hints_at_import(no_run, capsys):
    assert cli.main(["GRPO", "--task", "reverse"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "invalid choice: 'reverse'" in line and "--import MODULE" in line, line


def test_the_figure_title_names_one_seed_and_counts_several():
    assert cli._figure_title("GRPO", [3]) == "GRPO: seed 3"
    assert cli._figure_title("GRPO", [0, 1]) == "GRPO: mean ± sd over 2 seeds"
