"""Files written before ``Algorithm.clip`` was renamed ``surrogate`` (and CISPO's surrogate ``"is_weight"``
renamed ``"cispo"``) still load, to the same Algorithm; new input with an old spelling gets an error naming
the new one.

The files in tests/data/renamed_fields/ were written by the code before the rename (commit 8e20fe7):
``python -m grpo_lab CISPO --steps 1 --seeds 0 --save-every 1 --set prompts_per_step=2 --set group_size=4
--set mask_eps_high=0.5 --no-cache --out cispo.json``; ``run.json`` and ``state.json`` are the seed's run record
and its checkpoint's state, ``results.json`` the results file, ``config.yaml`` the resolved configuration
(its ``out:`` made relative).
"""

import dataclasses
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

import grpo_lab.tasks as tasks_mod
from grpo_lab import experiments
from grpo_lab.algo.algorithms import CISPO, GRPO, Algorithm, migrate_fields
from grpo_lab.cli import main as cli
from grpo_lab.experiments import RunResult, load_results
from grpo_lab.experiments import config_files
from grpo_lab.experiments.run_dirs import _record_diffs, _saved_record
from grpo_lab.policy.models import TinyConfig, tiny_policy
from grpo_lab.training.trainer import Trainer, TrainerConfig

OLD = Path(__file__).parents[1] / "data" / "renamed_fields"
#: what the old run trained
EXPECTED = CISPO.replace(mask_eps_high=0.5)


def _old(name: str) -> dict:
    return json.loads((OLD / name).read_text())


def test_the_fixtures_use_the_old_names():
    for record in (_old("run.json")["algo"], _old("state.json")["algo"], _old("results.json")["provenance"]["algo"],
                   yaml.safe_load((OLD / "config.yaml").read_text())["algorithm"]):
        assert record["clip"] == "is_weight" and "surrogate" not in record


@pytest.mark.parametrize("name", ["run.json", "state.json"])
def test_a_stored_algorithm_loads_to_the_same_algorithm(name):
    assert Algorithm.from_dict(_old(name)["algo"]) == EXPECTED
    assert Algorithm.from_dict(EXPECTED.describe()) == EXPECTED  # today's records: unchanged


def test_migrate_fields():
    assert migrate_fields({"clip": "is_weight", "eps_low": 1.0}) == {"surrogate": "cispo", "eps_low": 1.0}
    assert migrate_fields({"clip": "gmpo"}) == {"surrogate": "gmpo"}  # only the renamed key changes its value
    new = GRPO.describe()
    assert migrate_fields(new) == new and migrate_fields(new) is not new
    with pytest.raises(ValueError, match="both 'clip'.*and 'surrogate'"):
        migrate_fields({"clip": "ppo", "surrogate": "ppo"})
    with pytest.raises(ValueError, match=r"unknown Algorithm field\(s\) \['bogus'\]"):
        Algorithm.from_dict({**GRPO.describe(), "bogus": 1})


def test_an_old_run_directory_is_the_same_run(tmp_path):
    """``--resume`` compares the run directory's record with the run requested: the old names are no difference."""
    seed = tmp_path / "seed-0"
    seed.mkdir()
    shutil.copy(OLD / "run.json", seed / "run.json")
    saved = _saved_record(seed)
    assert saved["algo"]["surrogate"] == "cispo" and "clip" not in saved["algo"]
    assert _record_diffs({"algo": saved["algo"]}, {"algo": dataclasses.asdict(EXPECTED)}) == []
    # without run.json, the latest checkpoint's state.json says what ran
    (seed / "run.json").unlink()
    ckpt = seed / "checkpoints" / "step-000001"
    ckpt.mkdir(parents=True)
    shutil.copy(OLD / "state.json", ckpt / "state.json")
    assert _saved_record(seed)["algo"] == saved["algo"]


def test_an_old_results_file_loads_with_the_new_names():
    res = load_results(OLD / "results.json")
    assert Algorithm.from_dict(res.provenance["algo"]) == EXPECTED
    assert res.provenance["config_hash"] == _old("results.json")["provenance"]["config_hash"]  # kept as written
    assert list(res.history["algo"].unique()) == ["CISPO"]


def test_an_old_resolved_configuration_repeats_the_run(monkeypatch, tmp_path):
    calls = []

    def fake(algo, **kwargs):
        calls.append(dict(kwargs, algo=algo))
        rows = [{"algo": algo.name, "seed": s, "step": 0, "test_accuracy": 0.5} for s in kwargs["seeds"]]
        return RunResult(pd.DataFrame(rows), {"steps": 0, "seeds": list(kwargs["seeds"]), "wall_seconds": 0.0})

    monkeypatch.setattr(experiments, "run", fake)
    assert cli.main(["--config", str(OLD / "config.yaml"), "--out", str(tmp_path / "again.json")]) == 0
    [call] = calls
    assert call["algo"] == EXPECTED and call["algo"].name == "CISPO"
    # the configuration the new run writes uses the new names
    written = yaml.safe_load((tmp_path / "again" / "config.yaml").read_text())["algorithm"]
    assert written["surrogate"] == "cispo" and "clip" not in written


def test_a_config_section_with_both_names_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: GRPO\nalgorithm: {clip: ppo, surrogate: ppo}\n")
    parser = cli.build_parser()
    with pytest.raises(ValueError, match=r"run.yaml: algorithm: .*both 'clip'"):
        config_files.load_run_config(config_files.read_config_file(path), path, parser, cli.settable_fields())


def test_a_checkpoint_with_the_old_names_resumes(tmp_path, monkeypatch, tok):
    @dataclasses.dataclass
    class Toy(tasks_mod.ArithmeticTask):
        name: str = "toy"

    monkeypatch.setitem(tasks_mod.TASKS, "toy", Toy)
    tiny = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1)
    cfg = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False, seed=0)
    tr = Trainer(tiny_policy(tok, tiny, seed=0), tok, Toy(test_size=5), EXPECTED.replace(dynamic_sampling=False), cfg)
    tr.train(1)
    ck = tr.save(tmp_path / "ck")
    state = json.loads((ck / "state.json").read_text())
    old = dict(_old("state.json")["algo"], dynamic_sampling=False)
    assert migrate_fields(old) == state["algo"]  # the old record of the same algorithm
    (ck / "state.json").write_text(json.dumps({**state, "algo": old}))
    assert Trainer.resume(ck).algo == EXPECTED.replace(dynamic_sampling=False)


def test_new_input_with_an_old_name_names_the_new_one():
    with pytest.raises(cli.UsageError, match=r"--set clip: renamed 'surrogate'.*--set surrogate=cispo"):
        cli.parse_set(["clip=is_weight"])
    with pytest.raises(cli.UsageError, match=r"--set surrogate=ppo"):
        cli.parse_set(["clip=ppo"])
    with pytest.raises(ValueError, match=r"clip was renamed surrogate"):
        GRPO.replace(clip="ppo")
    with pytest.raises(TypeError, match="clip"):
        Algorithm(clip="ppo")
    with pytest.raises(ValueError, match=r"unknown surrogate 'is_weight' \(the surrogate 'is_weight' was renamed "
                                         r"'cispo'\)"):
        GRPO.replace(surrogate="is_weight")
