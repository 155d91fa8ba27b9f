"""Issue 54, Deliver 3: ``export`` writes the job of the run you did (``--profile`` / ``--config`` / ``--run-dir``
and ``config=`` of the Python API), a DatasetTask's job is self-contained, and PPO / VAPO go to verl with a critic."""

from __future__ import annotations

import ast
import dataclasses
import json
import warnings

import pytest

from grpo_lab import export as E
from grpo_lab.algo.algorithms import GRPO, PPO, VAPO
from grpo_lab.cli.main import main
from grpo_lab.experiments import get_profile
from grpo_lab.experiments import config_files as run_config


def settings(job) -> dict:
    """GRPOConfig keywords of a TRL job's train.py: SETTINGS and RUN, read back as literals."""
    tree = ast.parse((job / "train.py").read_text())
    found = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name) and t.id in ("SETTINGS", "RUN")}
    return {**found["SETTINGS"], **found["RUN"]}


def overrides(job) -> dict:
    return dict(line.split("=", 1) for line in (job / "overrides.txt").read_text().splitlines())


def expect_cpu_run(trl: dict, verl: dict, steps: int) -> None:
    """The cpu profile's own values (read from the profile, not typed here) in both targets."""
    c = get_profile("cpu").config
    assert trl["learning_rate"] == c.lr and trl["warmup_steps"] == c.warmup and trl["num_generations"] == c.group_size
    assert trl["max_steps"] == steps * c.minibatches * c.epochs
    assert trl["steps_per_generation"] * trl["per_device_train_batch_size"] == c.prompts_per_step * c.group_size
    assert float(verl["actor_rollout_ref.actor.optim.lr"]) == c.lr
    assert int(verl["actor_rollout_ref.actor.optim.lr_warmup_steps"]) == c.warmup
    assert int(verl["actor_rollout_ref.actor.ppo_mini_batch_size"]) == c.prompts_per_step // c.minibatches
    assert int(verl["data.train_batch_size"]) == c.prompts_per_step and int(verl["trainer.total_training_steps"]) == steps


def export_both(tmp_path, *args) -> tuple[dict, dict]:
    for to in ("trl", "verl"):
        code = main(["export", *args, "--to", to, "--out", str(tmp_path / to), "--approximate", "--gpus-per-node", "1"])
        assert code == 0
    return settings(tmp_path / "trl"), overrides(tmp_path / "verl")


def test_profile_export_is_the_profiles_run_not_the_defaults(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trl, verl = export_both(tmp_path, "GRPO", "--profile", "cpu")
    expect_cpu_run(trl, verl, get_profile("cpu").steps)
    from grpo_lab.training.config import TrainerConfig

    assert get_profile("cpu").config.lr != TrainerConfig().lr  # the defaults would fail expect_cpu_run


def resolved_file(tmp_path, steps=3):
    """The config.yaml that ``python -m grpo_lab GRPO --steps 3 --out OUT`` writes (same function)."""
    prof = get_profile("cpu")
    options = {"preset": "GRPO", "profile": "cpu", "task": prof.task, "model": prof.base, "steps": steps,
               "seeds": [0], "out": str(tmp_path / "run.json")}
    return run_config.write_config(tmp_path / "run" / "config.yaml", run_config.resolved_config(options, prof.config,
                                                                                               GRPO.replace(beta=0.01)))


@pytest.mark.parametrize("how", ["--config", "--run-dir"])
def test_config_file_and_run_directory_give_the_runs_settings(tmp_path, how):
    path = resolved_file(tmp_path)
    source = [how, str(path if how == "--config" else tmp_path / "run.json")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trl, verl = export_both(tmp_path, *source)
    expect_cpu_run(trl, verl, 3)
    assert trl["beta"] == 0.01 and float(verl["actor_rollout_ref.actor.kl_loss_coef"]) == 0.01  # the algorithm section


def test_seed_directory_run_json_gives_the_runs_settings(tmp_path):
    from grpo_lab.experiments.run_dirs import _run_record

    seed = tmp_path / "GRPO" / "seed-0"
    seed.mkdir(parents=True)
    (seed / "run.json").write_text(json.dumps(_run_record(GRPO, get_profile("cpu"), 0)))
    (seed / "result.json").write_text(json.dumps({"steps": 4, "rows": []}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trl, verl = export_both(tmp_path, "--run-dir", str(seed))
    expect_cpu_run(trl, verl, 4)


def test_a_preset_other_than_the_runs_is_refused(tmp_path, capsys):
    path = resolved_file(tmp_path)
    assert main(["export", "DAPO", "--config", str(path), "--to", "trl", "--out", str(tmp_path / "j")]) == 2
    assert "trained GRPO, not DAPO" in capsys.readouterr().err


def test_a_bare_preset_exports_the_defaults_and_says_so_on_one_stderr_line(tmp_path, capsys):
    from grpo_lab.training.config import TrainerConfig

    common = ["--to", "verl", "--approximate", "--gpus-per-node", "1"]
    assert main(["export", "GRPO", "--model", "arithmetic-base", "--out", str(tmp_path / "bare"), *common]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "TrainerConfig() defaults" in line]
    assert len(err) == 1 and "--profile cpu" in err[0] and "--run-dir" in err[0], err
    assert float(overrides(tmp_path / "bare")["actor_rollout_ref.actor.optim.lr"]) == TrainerConfig().lr
    assert main(["export", "GRPO", "--profile", "cpu", "--out", str(tmp_path / "cpu"), *common]) == 0
    assert "TrainerConfig() defaults" not in capsys.readouterr().err  # a run's settings: nothing to say


def test_python_api_takes_the_runs_trainer_config(tmp_path):
    c = dataclasses.replace(get_profile("cpu").config, lr=2e-4, warmup=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job = E.trl_job(GRPO, "arithmetic", "arithmetic-base", tmp_path, config=c, steps=5, strict=False)
    s = settings(job)
    assert (s["learning_rate"], s["warmup_steps"], s["max_steps"]) == (2e-4, 3, 5 * c.minibatches)


def test_ppo_goes_to_verl_with_its_critic_and_trl_refuses_naming_why():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ov = dict(o.split("=", 1) for o in E.to_verl(PPO, strict=False, lr=1e-6, value_lr=2e-6, group_size=4,
                                                     prompts_per_step=8))
    assert (ov["algorithm.adv_estimator"], ov["algorithm.lam"], ov["algorithm.gamma"]) == ("gae", "0.95", "1.0")
    assert (ov["critic.optim.lr"], ov["critic.cliprange_value"], ov["critic.enable"]) == ("2e-06", "0.2", "True")
    assert ov["critic.optim.lr_warmup_steps"] == "0" and ov["critic.loss_agg_mode"] == "token-mean"
    with pytest.raises(E.ExportError, match="whitens the GAE advantages"):
        E.to_verl(PPO)  # strict: verl's batch whitening is a difference, named
    with pytest.raises(E.ExportError, match="GRPOTrainer has no critic"):
        E.to_trl(PPO, strict=False)
    with pytest.raises(E.ExportError, match="nll_coef"):
        E.to_verl(VAPO, strict=False)  # verl has no positive-example LM loss
    with pytest.warns(E.ApproximateExportWarning, match="critic_lam"):
        E.to_verl(VAPO.replace(nll_coef=0.0), strict=False)


def test_dataset_task_job_is_self_contained(tmp_path, monkeypatch):
    from grpo_lab.tasks import DatasetTask

    src = tmp_path / "src"
    src.mkdir()
    (src / "rw54.py").write_text("def acc(prompts, completions, solution, **kw):\n"
                                 "    return [float(c.strip() == s) for c, s in zip(completions, solution)]\n"
                                 "def short(completions, **kw):\n    return [-0.01 * len(c) for c in completions]\n")
    (src / "d.jsonl").write_text("".join(json.dumps({"q": f"{a}+1=", "solution": str(a + 1)}) + "\n"
                                         for a in range(30)))
    monkeypatch.syspath_prepend(str(src))
    task = DatasetTask(data=str(src / "d.jsonl"), reward_funcs=("rw54:acc", "rw54:short"), prompt_column="q",
                       answer_column="solution", reward_weights=(1.0, 0.5), test_size=5, max_new_tokens=4)
    job = E.trl_job(GRPO, task, "arithmetic-base", tmp_path / "job", steps=2, group_size=2, prompts_per_step=2,
                    strict=False)
    assert (job / "rw54.py").is_file() and (job / "data" / "d.jsonl").read_bytes() == (src / "d.jsonl").read_bytes()
    text = (job / "rewards.py").read_text()
    assert str(src) not in text and "FUNCTIONS = [['acc', 1.0], ['short', 0.5]]" in text
