"""Tests for configuration files (:mod:`grpo_lab.experiments.config_files`): ``python -m grpo_lab --config run.yaml`` (options,
sections, flags on top, errors), the resolved configuration written to ``<out>/config.yaml`` and read back, and
``$GRPO_LAB_GPU_CONFIG`` naming a file. The command line runs in-process with ``experiments.run`` replaced by a
recorder (no training), as in tests/cli/test_cli.py."""

import dataclasses
import textwrap

import pandas as pd
import pytest
import yaml

from grpo_lab.cli import main as cli
from grpo_lab import experiments
from grpo_lab.experiments import config_files as run_config
from grpo_lab.algo.algorithms import DAPO, GRPO, PRESETS, SAPO
from grpo_lab.experiments import PROFILES, RunResult

PROG = "python -m grpo_lab"


@pytest.fixture
def fake_run(monkeypatch):
    """``experiments.run`` replaced by a recorder returning one row per seed (no training)."""
    calls = []

    def fake(algo, **kwargs):
        calls.append(dict(kwargs, algo=algo))
        rows = [{"algo": algo.name, "seed": s, "step": 0, "test_accuracy": 0.5} for s in kwargs["seeds"]]
        return RunResult(pd.DataFrame(rows), {"steps": 0, "seeds": list(kwargs["seeds"]), "wall_seconds": 0.0})

    monkeypatch.setattr(experiments, "run", fake)
    return calls


def _write(path, text: str):
    path.write_text(textwrap.dedent(text))
    return str(path)


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"{PROG}: error: ")
    return lines[0]


def _effective(call) -> dict:
    """The TrainerConfig a recorded run would train with (the cpu profile's, the overrides applied)."""
    keys = {f.name for f in dataclasses.fields(PROFILES["cpu"].config)}
    over = {k: v for k, v in call.items() if k in keys}
    return dataclasses.replace(PROFILES["cpu"].config, **over).to_dict()


RUN_YAML = """\
    preset: DAPO
    seeds: [3, 4]
    steps: 7
    jobs: 2
    cache: false
    lora-r: null
    trainer:
      lr: 1e-4            # YAML 1.1 reads this as a string: a float field takes it
      lr_schedule: cosine
      warmup: 2
      minibatches: 2
    algorithm:
      eps_high: 0.3
"""


def test_a_config_file_reaches_the_run(fake_run, tmp_path, capsys):
    conf = _write(tmp_path / "run.yaml", RUN_YAML)
    out = tmp_path / "res.json"
    assert cli.main(["--config", conf, "--out", str(out)]) == 0, capsys.readouterr().err
    [call] = fake_run
    assert call["algo"] == DAPO.replace(eps_high=0.3) and call["algo"].name == "DAPO"
    assert call["seeds"] == [3, 4] and call["steps"] == 7 and call["n_jobs"] == 2 and call["cache"] is False
    assert call["lr"] == 1e-4 and call["lr_schedule"] == "cosine" and call["warmup"] == 2 and call["minibatches"] == 2
    assert call["profile"] == "cpu" and call["base"] is None  # options the file does not give keep their defaults
    assert f"configuration: {tmp_path / 'res' / 'config.yaml'}" in capsys.readouterr().out


def test_flags_and_set_win_over_the_file(fake_run, tmp_path):
    conf = _write(tmp_path / "run.yaml", RUN_YAML)
    assert cli.main(["GRPO", "--config", conf, "--steps", "5", "--seeds", "0", "--set", "lr=3e-4",
                     "--set", "eps_high=0.25", "--out", str(tmp_path / "r.json")]) == 0
    [call] = fake_run
    assert call["algo"] == GRPO.replace(eps_high=0.25)  # the positional preset wins over preset:
    assert call["steps"] == 5 and call["seeds"] == [0] and call["lr"] == 3e-4
    assert call["n_jobs"] == 2 and call["warmup"] == 2  # what no flag overrides still comes from the file


@pytest.mark.parametrize("text, expected", [
    ("preset: GRPO\nstepz: 3\n", ["unknown key 'stepz'", "did you mean 'steps'", "seeds", "trainer", "algorithm"]),
    ("preset: GRPO\ntrainer: {lrr: 1.0e-4}\n", ["trainer: unknown key 'lrr'", "did you mean 'lr'",
                                                "known keys: betas", "warmup"]),
    ("preset: GRPO\nalgorithm: {eps_hihg: 0.3}\n", ["algorithm: unknown key 'eps_hihg'", "did you mean 'eps_high'"]),
    ("preset: GRPO\nlr: 1.0e-4\n", ["'lr' is not a top-level key", "put it under trainer:"]),
    ("preset: GRPO\ntrainer: {eps_high: 0.3}\n", ["it belongs in the algorithm: section"]),
    ("preset: GRPO\ntrainer: {seed: 1}\n", ["'seed' does not belong here", "seeds:"]),
    ("preset: GRPO\ntrainer: {group_size: 2.5}\n", ["trainer: group_size must be int", "2.5"]),
    ("preset: GRPO\ntrainer: {sort_by_length: 1}\n", ["sort_by_length must be bool", "got 1"]),
    ("preset: GRPO\nsteps: five\n", ["steps must be int or null", "'five'"]),
    ("preset: GRPO\nseeds: [0, x]\n", ["seeds[1] must be int", "'x'"]),
    ("preset: GRPO\nprofile: gpuu\n", ["profile: 'gpuu' is not a choice", "did you mean 'gpu'", "cpu"]),
    ("preset: GRPO\ntrainer: [1, 2]\n", ["trainer must be a mapping"]),
    ("preset: GRPO\ntrainer: {lr: -1}\n", ["TrainerConfig.lr must be finite and > 0"]),
    ("preset: GRPO\nalgorithm: {eps_low: 2}\n", ["eps_low must be in [0, 1]"]),
    ("- GRPO\n", ["must be a mapping of names to values"]),
    ("preset: [GRPO\n", ["not valid YAML", "line 1"]),
    ("steps: 2\n", ["give a PRESET"]),
])
def test_bad_config_files_are_one_line_naming_the_file(text, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(experiments, "run", lambda *a, **k: pytest.fail("a bad file must fail before training"))
    conf = _write(tmp_path / "bad.yaml", text)
    assert cli.main(["--config", conf, "--out", str(tmp_path / "r.json")]) == 2
    line = _error(capsys)
    assert f"--config {conf}" in line or "PRESET" in line, line
    for piece in expected:
        assert piece in line, (piece, line)


def test_unknown_and_foreign_keys_of_both_sections_are_one_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(experiments, "run", lambda *a, **k: pytest.fail("a bad file must fail before training"))
    conf = _write(tmp_path / "bad.yaml", "preset: GRPO\ntrainer: {num_generations: 8, lrr: 1.0e-4}\n"
                                         "algorithm: {clip_ratio_high: 0.28, eps_hihg: 0.3}\n")
    assert cli.main(["--config", conf, "--out", str(tmp_path / "r.json")]) == 2
    line = _error(capsys)
    for piece in ("trainer: unknown key 'lrr'", "algorithm: unknown key 'eps_hihg'", "group_size: 8 under trainer:",
                  "eps_high: 0.28 under algorithm:", "2 keys here are TRL / verl names"):
        assert piece in line, (piece, line)


def test_a_missing_config_file(tmp_path, capsys):
    assert cli.main(["--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: no such file" in _error(capsys)


def test_the_resolved_configuration_round_trips(fake_run, tmp_path, capsys):
    conf = _write(tmp_path / "run.yaml", RUN_YAML)
    first = tmp_path / "a" / "first.json"
    assert cli.main(["SAPO", "--config", conf, "--set", "tau_neg=1.2", "--out", str(first)]) == 0
    written = run_config.config_path(first)
    assert written == tmp_path / "a" / "first" / "config.yaml"
    resolved = yaml.safe_load(written.read_text())
    assert written.read_text().startswith("# The resolved configuration")
    assert resolved["preset"] == "SAPO" and resolved["steps"] == 7 and resolved["seeds"] == [3, 4]
    assert resolved["task"] == "arithmetic" and resolved["model"] == "arithmetic-base" and resolved["profile"] == "cpu"
    assert resolved["out"] == str(first) and resolved["cache"] is False
    assert not {"seed", "progress", "output_dir"} & set(resolved["trainer"])
    assert resolved["trainer"]["lr_schedule_steps"] is None  # not given: the run's steps (experiments.run fills it)
    assert resolved["trainer"]["prompts_per_step"] == PROFILES["cpu"].config.prompts_per_step
    assert resolved["algorithm"]["tau_neg"] == 1.2 and resolved["algorithm"]["eps_high"] == 0.3

    second = tmp_path / "b.json"
    assert cli.main(["--config", str(written), "--out", str(second)]) == 0
    again = yaml.safe_load(run_config.config_path(second).read_text())
    assert {**again, "out": None} == {**resolved, "out": None}
    one, two = fake_run
    assert two["algo"] == one["algo"] == SAPO.replace(eps_high=0.3, tau_neg=1.2)
    # the same configuration; each run writes into the directory of its own results file
    assert {**_effective(two), "output_dir": None} == {**_effective(one), "output_dir": None}
    assert (one["output_dir"], two["output_dir"]) == (str(tmp_path / "a" / "first"), str(tmp_path / "b"))
    assert (two["seeds"], two["steps"], two["n_jobs"], two["cache"]) == (one["seeds"], one["steps"], 2, False)
    # reused with another --steps, the decaying schedule spans the new steps (run() fills the null horizon)
    assert cli.main(["--config", str(written), "--out", str(tmp_path / "c.json"), "--steps", "4"]) == 0
    three = fake_run[-1]
    assert three["steps"] == 4 and _effective(three)["lr_schedule_steps"] is None
    cosine = dataclasses.replace(PROFILES["cpu"], config=dataclasses.replace(PROFILES["cpu"].config, lr_schedule="cosine"))
    assert experiments.runs._lr_horizon(cosine, 4).config.lr_schedule_steps == 4


def test_a_config_file_imports_a_users_module(fake_run, tmp_path, monkeypatch):
    mod = tmp_path / "conf_user_task.py"
    mod.write_text("from grpo_lab.tasks import ArithmeticTask, register_task\n"
                   "class T(ArithmeticTask):\n    name = 'conftask'\n"
                   "register_task('conftask', T)\n")
    from grpo_lab import tasks

    monkeypatch.setattr(tasks, "TASKS", dict(tasks.TASKS))
    conf = _write(tmp_path / "run.yaml", f"preset: GRPO\nimport: {mod}\ntask: conftask\n")
    assert cli.main(["--config", conf, "--out", str(tmp_path / "r.json")]) == 0
    assert fake_run[0]["task"] == "conftask"


def test_check_value_types():
    assert run_config.check_value("x", "1e-4", float) == 1e-4
    assert run_config.check_value("x", 2, float) == 2.0 and isinstance(run_config.check_value("x", 2, float), float)
    assert run_config.check_value("x", [0.9, 0.95], tuple) == (0.9, 0.95)
    assert run_config.check_value("x", None, int | None) is None
    for value, hint in ((True, int), (1, bool), ("a", int), (None, float), ([1], str), ("x", float)):
        with pytest.raises(ValueError, match="x must be"):
            run_config.check_value("x", value, hint)


def test_gpu_config_names_a_file(tmp_path, monkeypatch):
    good = _write(tmp_path / "gpu.yaml", "micro_batch_size: 2\nprecision: float16\nlr: 2e-6\n")
    c = experiments.gpu_profile(environ={"GRPO_LAB_GPU_CONFIG": good}, gpu_memory=False).config
    assert (c.micro_batch_size, c.precision, c.lr, c.group_size) == (2, "float16", 2e-6, 8)
    js = _write(tmp_path / "gpu.json", '{"micro_batch_size": 1}')  # JSON is YAML
    assert experiments.gpu_profile(environ={"GRPO_LAB_GPU_CONFIG": js}, gpu_memory=False).config.micro_batch_size == 1
    inline = experiments.gpu_profile(environ={"GRPO_LAB_GPU_CONFIG": '{"micro_batch_size": 8}'}, gpu_memory=False)
    assert inline.config.micro_batch_size == 8  # the inline JSON object of before still works
    bad = _write(tmp_path / "bad.yaml", "micro_bach_size: 2\n")
    for value, why in ((bad, f"file {bad}: unknown key 'micro_bach_size' \\(did you mean 'micro_batch_size'\\?\\)"),
                       (str(tmp_path / "none.yaml"), "none.yaml: no such file"),
                       (_write(tmp_path / "t.yaml", "group_size: two\n"), "t.yaml: group_size must be int")):
        with pytest.raises(ValueError, match=why):
            experiments.gpu_profile(environ={"GRPO_LAB_GPU_CONFIG": value}, gpu_memory=False)


def test_every_preset_round_trips_through_resolved_config():
    # the algorithm section of the resolved configuration rebuilds each preset exactly
    for name, algo in PRESETS.items():
        section = run_config.resolved_config({}, PROFILES["cpu"].config, algo)["algorithm"]
        assert algo.replace(**yaml.safe_load(yaml.safe_dump(section))) == algo, name
