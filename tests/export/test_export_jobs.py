"""grpo_lab.export.trl_job / verl_job: the files a job writes, read back (no trl / verl needed).

The reward files are imported as the targets import them (a module loaded from its path) and score a
right and a wrong completion of the task; the settings and overrides written are read back with
``ast.literal_eval`` / line by line and compared with ``to_trl`` / ``to_verl`` of the same budget. The
end-to-end runs (TRL trains the job for 2 steps; verl's own config code loads the overrides) are in
``tests/export/xcheck/test_xcheck_trl_job.py`` and ``tests/export/xcheck/test_xcheck_verl.py``.
"""

import ast
import importlib.util
import json
import re
import warnings

import pandas as pd
import pytest

from grpo_lab import export as E
from grpo_lab.algo.algorithms import DAPO, GRPO, Algorithm
from grpo_lab.tasks import ArithmeticTask, GSM8KTask
from grpo_lab.training.config import TrainerConfig

BUDGET = dict(group_size=4, prompts_per_step=2)


def load(path, name):
    """Import the python file ``path`` as module ``name`` (how TRL's script and verl's loader import them)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def literal(path, name):
    """The value of the module-level assignment ``name = <literal>`` in the python file ``path``."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not assigned in {path}")


@pytest.fixture(scope="module")
def trl_dir(tmp_path_factory):
    config = TrainerConfig(lr=3e-4, betas=(0.9, 0.95), seed=7)
    return E.trl_job(GRPO, "arithmetic", "arithmetic-base", tmp_path_factory.mktemp("trl") / "job", config=config,
                     steps=3, **BUDGET)


def test_trl_job_writes_its_files_and_to_trls_settings(trl_dir):
    assert sorted(p.name for p in trl_dir.iterdir()) == ["README.md", "dataset.jsonl", "rewards.py", "train.py"]
    config = TrainerConfig(lr=3e-4, betas=(0.9, 0.95), seed=7)
    want = E.to_trl(GRPO, **{**E.budget_from_config(config), **BUDGET, "max_new_tokens": 32})
    assert literal(trl_dir / "train.py", "SETTINGS") == want
    run = literal(trl_dir / "train.py", "RUN")
    assert run["max_steps"] == 3 and run["seed"] == 7
    # a shipped checkpoint by its name: load_policy finds it wherever grpo_lab is installed (no absolute path)
    assert literal(trl_dir / "train.py", "MODEL") == "arithmetic-base" and run["output_dir"] == "output"
    rows = [json.loads(line) for line in (trl_dir / "dataset.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 2 and set(rows[0]) == {"prompt", "answer", "meta"}
    assert all(str(sum(json.loads(r["meta"])["terms"])) == r["answer"] for r in rows)
    readme = (trl_dir / "README.md").read_text()
    assert "exactly" in readme and "python train.py" in readme and "accelerate" in readme
    assert sum(line.startswith("- note:") for line in readme.splitlines()) == len(E.translate(GRPO, "trl", **BUDGET).notes)


def test_the_trl_reward_adapter_scores_with_the_tasks_own_scorer(trl_dir):
    rewards = load(trl_dir / "rewards.py", "job_rewards_trl")
    row = json.loads((trl_dir / "dataset.jsonl").read_text().splitlines()[0])
    right, wrong = f"#{row['answer']}", f"#{int(row['answer']) + 1}"
    cols = dict(prompts=[row["prompt"]] * 3, answer=[row["answer"]] * 3, meta=[row["meta"]] * 3)
    assert rewards.reward([right, wrong, "#0" + row["answer"]], **cols, trainer_state=None) == [1.0, 0.0, 0.0]
    conversational = [[{"role": "assistant", "content": c}] for c in (wrong, right, right)]
    assert rewards.reward(conversational, **cols) == [0.0, 1.0, 1.0]
    assert rewards.reward_funcs() == [rewards.reward]  # GRPO shapes nothing: TRL is not imported
    assert Algorithm(**rewards.ALGORITHM) == GRPO


def test_a_dapo_job_carries_the_algorithm_for_its_overlong_punishment(tmp_path):
    algo = DAPO.replace(aggregation="token_mean", dynamic_sampling=False)
    out = E.trl_job(algo, ArithmeticTask(max_new_tokens=24), "arithmetic-base", tmp_path / "dapo", steps=1, **BUDGET)
    assert Algorithm(**literal(out / "rewards.py", "ALGORITHM")) == algo
    assert literal(out / "rewards.py", "MAX_NEW_TOKENS") == 24 == literal(out / "train.py", "SETTINGS")[
        "max_completion_length"]
    with pytest.raises(E.ExportError, match="dynamic_sampling"):
        E.trl_job(DAPO, "arithmetic", "arithmetic-base", tmp_path / "strict", steps=1, **BUDGET)


@pytest.fixture(scope="module")
def verl_dir(tmp_path_factory):
    return E.verl_job(GRPO.replace(adv_eps=1e-6), "gsm8k", "arithmetic-base", tmp_path_factory.mktemp("verl") / "job",
                      steps=2, n_gpus_per_node=2, **BUDGET)


def test_verl_job_writes_parquet_in_verls_schema(verl_dir):
    train, test = pd.read_parquet(verl_dir / "train.parquet"), pd.read_parquet(verl_dir / "test.parquet")
    assert list(train.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert len(train) == 2 * 2 and len(test) == len(GSM8KTask().test_set())
    row = test.iloc[0]
    task = GSM8KTask()
    problem = task.test_set()[0]
    assert row["data_source"] == "grpo_lab/gsm8k" and row["ability"] == "math"
    assert [dict(m) for m in row["prompt"]] == [{"role": "user",
                                                  "content": f"{problem.meta['question']}\n{task.instruction}"}]
    assert dict(row["reward_model"]) == {"style": "rule", "ground_truth": problem.answer}
    assert row["extra_info"]["split"] == "test" and row["extra_info"]["prompt"] == problem.prompt


def test_verl_overrides_are_to_verls_plus_the_jobs_files(verl_dir):
    lines = (verl_dir / "overrides.txt").read_text().splitlines()
    exported = E.to_verl(GRPO.replace(adv_eps=1e-6), **{**E.budget_from_config(TrainerConfig()), **BUDGET,
                                                        "max_new_tokens": 512, "nnodes": 1, "n_gpus_per_node": 2})
    assert lines[:len(exported)] == exported
    extra = dict(line.split("=", 1) for line in lines[len(exported):])
    assert extra["reward.custom_reward_function.path"] == str(verl_dir / "reward.py")
    assert extra["data.train_files"] == str(verl_dir / "train.parquet")
    assert extra["trainer.total_training_steps"] == "2"
    run = (verl_dir / "run.sh").read_text()
    assert "python3 -m verl.trainer.main_ppo" in run and all(line.split("=")[0] in run for line in lines)


def test_the_verl_reward_function_scores_boxed_answers(verl_dir):
    reward = load(verl_dir / "reward.py", "job_reward_verl")
    row = pd.read_parquet(verl_dir / "test.parquet").iloc[0]
    gold, info = row["reward_model"]["ground_truth"], dict(row["extra_info"])
    right = reward.compute_score("grpo_lab/gsm8k", f"So the answer is \\boxed{{{gold}}}.", gold, info)
    wrong = reward.compute_score("grpo_lab/gsm8k", f"So the answer is \\boxed{{{gold}1}}.", gold, info)
    assert right == {"score": 1.0, "acc": 1.0} and wrong == {"score": 0.0, "acc": 0.0}


def test_bad_arguments_get_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="did you mean 'arithmetic'"):
        E.trl_job(GRPO, "arithmetik", "arithmetic-base", tmp_path, **BUDGET)
    with pytest.raises(FileNotFoundError, match="did you mean 'arithmetic-base'"):
        E.trl_job(GRPO, "arithmetic", "arithmetic-bas", tmp_path, **BUDGET)
    with pytest.raises(ValueError, match="steps must be an int"):
        E.trl_job(GRPO, "arithmetic", "arithmetic-base", tmp_path, steps=0, **BUDGET)
    with pytest.raises(ValueError, match="task_spec"):
        E.trl_job(GRPO, object(), "arithmetic-base", tmp_path, **BUDGET)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(E.ExportError, match="adv_eps"):
            E.verl_job(GRPO, "arithmetic", "arithmetic-base", tmp_path, **BUDGET)


def test_the_command_line_writes_a_job(tmp_path, capsys):
    from grpo_lab.cli.main import main

    out = tmp_path / "cli"
    assert main(["export", "grpo", "--to", "trl", "--model", "arithmetic-base", "--out", str(out), "--steps", "2",
                 "--set", "lr=3e-4", "--set", "group_size=4", "--set", "prompts_per_step=2", "--set", "beta=0.01"]) == 0
    settings = literal(out / "train.py", "SETTINGS")
    assert (settings["learning_rate"], settings["num_generations"], settings["beta"]) == (3e-4, 4, 0.01)
    assert str(out) in capsys.readouterr().out
    assert main(["export", "DAPPO", "--to", "verl", "--model", "arithmetic-base", "--out", str(tmp_path / "v")]) == 2
    assert "did you mean 'DAPO'" in capsys.readouterr().err
    assert main(["export", "DAPO", "--to", "verl", "--model", "arithmetic-base", "--out", str(tmp_path / "v")]) == 2
    assert "Exact alternative" in capsys.readouterr().err and not (tmp_path / "v" / "run.sh").exists()


def test_a_jobs_length_is_its_schedules_horizon_and_trl_counts_updates(tmp_path):
    # TRL's max_steps counts optimiser updates: 3 RL steps x 2 epochs x 2 minibatches = 12 (hand count)
    config = TrainerConfig(epochs=2, minibatches=2, prompts_per_step=4, group_size=2, lr_schedule="linear")
    job = E.trl_job(GRPO, "arithmetic", "arithmetic-base", tmp_path / "trl", config=config, steps=3)
    assert literal(job / "train.py", "RUN")["max_steps"] == 12
    assert literal(job / "train.py", "SETTINGS")["max_steps"] == 12  # the decay's horizon: the same updates
    with pytest.raises(ValueError, match="steps=200 but lr_schedule_steps=50"):
        E.trl_job(GRPO, "arithmetic", "arithmetic-base", tmp_path / "x",
                  config=TrainerConfig(lr_schedule="cosine", lr_schedule_steps=50), steps=200)
    with pytest.raises(ValueError, match="MAX_JOB_PROMPTS"):
        E.trl_job(GRPO, "arithmetic", "arithmetic-base", tmp_path / "y", steps=10**8)
    verl = E.verl_job(GRPO.replace(adv_eps=1e-6), "arithmetic", "arithmetic-base", tmp_path / "verl",
                      config=TrainerConfig(lr_schedule="cosine", prompts_per_step=4, group_size=2), steps=3,
                      n_gpus_per_node=1)
    lines = (verl / "overrides.txt").read_text().split()
    assert [line for line in lines if line.startswith("trainer.total_training_steps=")] == [
        "trainer.total_training_steps=3"]


def test_the_command_line_names_its_own_options_in_an_export_error(tmp_path, capsys):
    from grpo_lab.cli import main as cli

    argv = ["export", "GRPO", "--to", "verl", "--task", "arithmetic", "--model", "arithmetic-base", "--out",
            str(tmp_path / "job")]
    assert cli.main(argv, prog="grpo") == 2
    err = capsys.readouterr().err
    assert "On the command line: --set adv_eps=1e-06." in err and "Pass --approximate" in err
    assert "strict=False" not in err
    assert cli.main([*argv, "--set", "adv_eps=1e-06"], prog="grpo") == 0


def test_the_command_line_exports_gsm8k_itself_unless_the_fixture_is_asked_for(tmp_path, capsys, monkeypatch):
    # `--task gsm8k` used to export the 24-problem fixture silently (a fresh user's trial); it now reads
    # the source as the GPU profile does, and the fixture only when named, with a note saying what it is
    from grpo_lab.cli import main as cli

    argv = ["export", "GRPO", "--to", "trl", "--task", "gsm8k", "--model", "arithmetic-base", "--steps", "2"]
    from grpo_lab.tasks.gsm8k import fixture_path

    monkeypatch.setenv("GRPO_LAB_GSM8K_SOURCE", str(fixture_path()))
    assert cli.task_from_arguments("gsm8k", []).source == str(fixture_path())
    monkeypatch.setenv("GRPO_LAB_GSM8K_SOURCE", str(tmp_path / "no-such-gsm8k.jsonl"))
    assert cli.main([*argv, "--out", str(tmp_path / "a")], prog="grpo") == 2
    err = capsys.readouterr().err
    assert "--task gsm8k with source=" in err and "no-such-gsm8k.jsonl" in err
    assert not (tmp_path / "a" / "train.py").exists()
    monkeypatch.delenv("GRPO_LAB_GSM8K_SOURCE")
    assert cli.task_from_arguments("gsm8k", []).source == "hub"

    def offline(self, path_or_id, split):  # what datasets raises offline, without its 23 s of retries
        raise ConnectionError(f"Couldn't reach {path_or_id!r} on the Hub")

    monkeypatch.setattr(GSM8KTask, "_load_split", offline)
    assert cli.main([*argv, "--out", str(tmp_path / "c")], prog="grpo") == 2
    err = capsys.readouterr().err
    assert "from source 'hub'" in err and "Couldn't reach" in err and "--task-arg source=PATH" in err
    with warnings.catch_warnings():  # pyproject ignores this caveat for the other job tests
        warnings.simplefilter("always", E.JobCaveatWarning)
        assert cli.main([*argv, "--task-arg", "source=fixture", "--out", str(tmp_path / "b")], prog="grpo") == 0
    captured = capsys.readouterr()
    assert "(source 'fixture')" in captured.out and "JobCaveatWarning: The problems are the small sample" in captured.err
    assert literal(tmp_path / "b" / "rewards.py", "TASK_SPEC")["params"]["source"] == "fixture"


def test_the_command_line_types_task_arguments_and_names_bad_ones(capsys):
    from grpo_lab.cli import main as cli

    task = cli.task_from_arguments("arithmetic", ["max_terms=3"])
    assert isinstance(task, ArithmeticTask) and task.max_terms == 3
    for items, expected in ((["max_terms"], "expects KEY=VALUE"), (["max_trms=3"], "not a field of task"),
                            (["max_terms=three"], "--task-arg max_terms=three")):
        with pytest.raises(cli.UsageError, match=expected):
            cli.task_from_arguments("arithmetic", items)
    with pytest.raises(cli.UsageError, match="did you mean 'arithmetic'"):
        cli.task_from_arguments("arithmetc", [])


def test_the_command_line_refuses_a_job_directory_with_files_and_imports_an_own_task(tmp_path, capsys, user_modules):
    from pathlib import Path

    from grpo_lab.cli import main as cli

    example = Path(__file__).resolve().parents[2] / "book" / "examples" / "reverse_task.py"
    out = tmp_path / "job"
    argv = ["export", "GRPO", "--to", "trl", "--import", str(example), "--task", "reverse", "--model",
            "arithmetic-base", "--out", str(out), "--steps", "2"]
    assert cli.main(argv, prog="grpo") == 0
    assert literal(out / "rewards.py", "TASK_SPEC")["name"] == "reverse"
    (out / "train.py").write_text("# edited by hand\n")
    assert cli.main(argv, prog="grpo") == 2
    assert "--overwrite" in capsys.readouterr().err and (out / "train.py").read_text() == "# edited by hand\n"
    assert cli.main([*argv, "--overwrite"], prog="grpo") == 0
    assert "SETTINGS" in (out / "train.py").read_text()


def test_a_job_says_what_it_will_not_do_and_carries_an_own_task_module(tmp_path, user_modules, monkeypatch):
    import subprocess
    import sys
    from pathlib import Path

    from grpo_lab.cli.main import load_user_module
    from grpo_lab.tasks import get_task
    from grpo_lab.tasks.gsm8k import fixture_path, load_fixture

    # an own task from one file: the file is copied into the job, and the reward file imports it from any directory
    load_user_module(str(Path(__file__).resolve().parents[2] / "book" / "examples" / "reverse_task.py"))
    with pytest.warns(E.JobCaveatWarning, match="has no chat template"):  # verl cannot prompt arithmetic-base
        job = E.verl_job(GRPO.replace(adv_eps=1e-6), get_task("reverse"), "arithmetic-base", tmp_path / "v",
                         steps=2, n_gpus_per_node=1, **BUDGET)
    assert (job / "reverse_task.py").is_file() and "copied here as `reverse_task.py`" in (job / "README.md").read_text()
    code = ("import importlib.util as u; s = u.spec_from_file_location('reward', 'REWARD'); m = u.module_from_spec(s); "
            "s.loader.exec_module(m); print(type(m.TASK).__name__)").replace("REWARD", str(job / "reward.py"))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ReverseTask", r.stderr[-2000:]
    # the shipped fixture is said, as a warning and in the README
    with pytest.warns(E.JobCaveatWarning, match="small sample shipped"):
        job = E.trl_job(GRPO, GSM8KTask(source="fixture"), "arithmetic-base", tmp_path / "t", steps=2, **BUDGET)
    readme = (job / "README.md").read_text()
    assert "small sample shipped" in readme and "without a chat template" in readme
    # a single file's last third is the test split, not trained on: said with its count (hand count: 24 // 3 = 8)
    rows = load_fixture()
    copy = tmp_path / "gsm8k.jsonl"
    copy.write_text(fixture_path().read_text())
    job = E.trl_job(GRPO, GSM8KTask(source=str(copy)), "arithmetic-base", tmp_path / "f", steps=2, **BUDGET)
    assert f"{len(rows) // 3} problems of {copy}" in (job / "README.md").read_text()


def test_check_config_reads_a_verl_jobs_overrides_file_back(tmp_path):
    # the round trip a fresh user tried: the job's overrides.txt (one Hydra override a line) through the linter
    job = E.verl_job(GRPO.replace(adv_eps=1e-6), "arithmetic", "arithmetic-base", tmp_path / "v", steps=2,
                     n_gpus_per_node=1, **BUDGET)
    reading = E.from_verl(str(job / "overrides.txt"))
    assert reading.algorithm.replace(name="GRPO") == GRPO.replace(adv_eps=1e-6)  # the reading is named after its source
    assert E.from_verl([line for line in (job / "overrides.txt").read_text().splitlines() if line]).algorithm == \
        reading.algorithm


# ------------------------------------------------------------------------------------------------ multi-turn tasks
# issue 56: a multi-turn task is refused with the reason (its text tool protocol against each library's tool
# contract) and the way forward (grpo_lab's own trainer, or what to change for the library).
@pytest.mark.parametrize("target, reason, forward", [
    ("trl", [r"GRPOTrainer\(tools=\.\.\., environment_factory=\.\.\.\)", "max_tool_calling_iterations",
             "JSON tool-call format", "no chat template", "type-hinted arguments", "per-turn reward"],
     ["python -m grpo_lab train PRESET --task calculator", "tools=[calc]", "chat model whose template supports"]),
    ("verl", [r"multi_turn\.enable=True", "tool_config_path", "sglang or vLLM", "BaseTool", "no chat template"],
     ["python -m grpo_lab train PRESET --task calculator", "verl BaseTool with its function schema"]),
])
def test_a_multi_turn_task_is_refused_with_the_reason_and_the_way_forward(tmp_path, target, reason, forward):
    job = E.trl_job if target == "trl" else E.verl_job
    with pytest.raises(ValueError) as info:
        job("DAPO", "calculator", "calculator-base", tmp_path / "job", config=TrainerConfig(**BUDGET))
    message = str(info.value)
    assert message.startswith("task 'calculator' is multi-turn: its environment reads the model's tool calls as "
                              "plain text (a model turn ends at one of its stop strings [')']")
    assert "at most 3 model turns" in message  # the calculator environment's max_turns
    for part in reason:
        assert re.search(part, message), (part, message)
    for part in forward:
        assert part in message, (part, message)
    other = "verl" if target == "trl" else "TRL's"
    assert other not in message  # each library's message speaks of that library only
    assert not (tmp_path / "job").exists()  # refused before anything is written
