"""The command line's hints for TRL names, misspelt flags and a task the model cannot read (issues 54 D10/D11, 58).

The expected fixes are the grpo_lab options that mean what the TRL name means (TRL 1.16's GRPOConfig /
TrainingArguments, ModelConfig and ScriptArguments, read from its source), written out by hand here.
"""

from __future__ import annotations

import pytest

from grpo_lab import experiments
from grpo_lab.cli import main as cli
from grpo_lab.export.lint import check_config

PROG = "python -m grpo_lab"


@pytest.fixture
def no_run(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("experiments.run must not be called for a mistake in the command line")

    monkeypatch.setattr(experiments, "run", fail)


def _error(args, capsys) -> str:
    assert cli.main(list(args)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line
    assert err[0].startswith(f"{PROG}: error: ")
    return err[0]


@pytest.mark.parametrize("args, expected, absent", [
    # TRL flag names: the fix --set gives
    (["--num_generations", "8"], ["--num_generations 8", "--set group_size=8"], []),
    (["--learning_rate=1e-5"], ["--set lr=1e-5"], []),
    (["--per_device_train_batch_size", "4"], ["per_device_train_batch_size", "prompts_per_step"], []),
    (["--max_steps", "10"], ["--steps 10"], []),
    (["--model_name_or_path", "Qwen/Qwen2.5-0.5B"], ["--model Qwen/Qwen2.5-0.5B"], []),
    # a grpo_lab field given as a flag, a misspelt flag, a misspelt field, a flag with _ for -
    (["--lr", "1e-4"], ["--set lr=1e-4"], []),
    (["--stpes", "3"], ["did you mean --steps?"], []),
    (["--gruop_size", "4"], ["did you mean --set group_size=4?"], []),
    (["--lora_r", "8"], ["did you mean --lora-r?"], []),
    (["--frobnicate"], ["unrecognized arguments: --frobnicate"], ["did you mean"]),
])
def test_flags_get_the_set_hints(args, expected, absent, no_run, capsys):
    line = _error(["GRPO", *args], capsys)
    for text in expected:
        assert text in line, (text, line)
    for text in absent:
        assert text not in line, (text, line)


@pytest.mark.parametrize("item, expected, wrong", [
    ("save_steps=5", "--set save_every=5", "adv_eps"),       # was: did you mean 'adv_eps'
    ("max_steps=10", "--steps 10", "calls it lr_schedule_steps"),  # TRL's max_steps is the run's length
    ("num_train_epochs=1", "--steps N", "unknown key"),
    ("model_name_or_path=x", "--model x", "unknown key"),
    ("dataset_name=gsm8k", "--task gsm8k", "unknown key"),
])
def test_set_hints_for_trl_run_names(item, expected, wrong):
    with pytest.raises(cli.UsageError) as info:
        cli.parse_set([item])
    assert expected in str(info.value) and wrong not in str(info.value), str(info.value)


def test_no_far_fetched_did_you_mean():
    with pytest.raises(cli.UsageError, match="unknown key 'frobnicate_steps'; valid keys"):
        cli.parse_set(["frobnicate_steps=1"])
    with pytest.raises(cli.UsageError, match=r"did you mean 'lr'\?"):  # a near slip still gets one
        cli.parse_set(["lrr=1"])


def test_check_config_knows_the_trl_scripts_model_and_data_keys(tmp_path):
    # an open-r1-style `trl grpo --config recipe.yaml`: ModelConfig + ScriptArguments + GRPOConfig keys
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct\ndtype: bfloat16\n"
                      "attn_implementation: flash_attention_2\ndataset_name: open-r1/OpenR1-Math-220k\n"
                      "dataset_train_split: train\nuse_peft: true\nlora_r: 16\ntorch_dtype: bfloat16\n"
                      "learning_rate: 3.0e-6\nnum_generations: 16\nbeta: 0.0\n")
    reading = check_config(str(recipe), "trl")
    # torch_dtype alone: TRL 1.16's ModelConfig has dtype and its parser refuses torch_dtype
    assert len(reading.unknown) == 1 and reading.unknown[0].startswith("torch_dtype (TRL 1.16's ModelConfig calls "
                                                                       "it dtype"), reading.unknown
    assert "torch_compile" not in reading.unknown[0]


def test_verl_hydra_defaults_list_is_not_an_unknown_key(tmp_path):
    conf = tmp_path / "ppo.yaml"
    conf.write_text("defaults:\n  - actor@actor_rollout_ref.actor: dp_actor\n  - _self_\n"
                    "algorithm:\n  adv_estimator: grpo\n")
    reading = check_config(str(conf), "verl")
    assert not any(u.startswith("defaults") for u in reading.unknown), reading.unknown


def test_gsm8k_on_the_cpu_profile_says_so_before_training(capsys):
    # the cpu profile's tiny arithmetic model cannot read word problems, and the task reads the 24-problem
    # fixture: two warnings, before anything trains (the run goes on: a pipeline check is a legitimate use)
    warnings = cli.task_warnings(experiments.get_profile("cpu"), "gsm8k", None, PROG)
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(f"{PROG}: warning: the tokenizer of the cpu profile's model arithmetic-base maps")
    assert "24-problem fixture" in warnings[1] and "arithmetic-base is a tiny model" in warnings[1]
    assert all("\n" not in w for w in warnings)
    # the profile's own task, and the default: nothing to say
    assert cli.task_warnings(experiments.get_profile("cpu"), None, None, PROG) == []
    assert cli.task_warnings(experiments.get_profile("cpu"), "arithmetic", "arithmetic-base", PROG) == []


def test_an_unknown_preset_name_gets_a_did_you_mean():
    # D13: Trainer(policy, tok, task, "GPRO") said only "unknown algorithm 'GPRO'" (the CLI had a did-you-mean)
    from grpo_lab.algo.algorithms import get_algorithm

    with pytest.raises(ValueError, match=r"unknown algorithm 'GPRO' \(did you mean 'GRPO'\?\); known presets: "):
        get_algorithm("GPRO")
    with pytest.raises(ValueError, match=r"unknown algorithm 'banana'; known presets: "):
        get_algorithm("banana")
    assert cli.main(["GPRO", "--steps", "1"]) == 2  # the command line says the same


def test_closest_preset():
    from grpo_lab.algo.algorithms import closest_preset

    assert closest_preset("GPRO") == "GRPO" and closest_preset("gspo") == "GSPO"  # a transposition; any case
    assert closest_preset("DAP0") == "DAPO" and closest_preset("CISP") == "CISPO"  # difflib, ratio >= 0.75
    assert closest_preset("banana") is None


def test_two_misplaced_keys_are_numbered(tmp_path, no_run, capsys):
    # D13: two misplaced keys of one file ran together on the error's one line
    conf = tmp_path / "two.yaml"
    conf.write_text("trainer:\n  eps_high: 0.3\nalgorithm:\n  lr: 0.001\n")
    line = _error(["GRPO", "--config", str(conf)], capsys)
    assert "(1) --config " in line and "algorithm: section (2) --config " in line, line
