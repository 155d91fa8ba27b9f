"""The GPU profile and what it needs that a CPU can check: mixed precision in the trainer
(``TrainerConfig.precision``: autocast, float16's gradient scaler, overflow skips, checkpointing),
the ``"gpu"`` profile (a hub instruct model named in one place, GSM8K in its chat template), the
chapter results files (``run_chapter_gpu`` / ``load_chapter_gpu`` / ``summarize_runs`` /
``check_gpu_results``), the expected-time estimate, the chapters' display of GPU results, and
``python -m grpo_lab.lab.book execute --param``.

The GSM8K runs here go through ``experiments.run`` with ``gpu_profile(device="cpu")`` and a tiny
Qwen2 instruct model in the hub layout (tests/_hub_fixture.py): the code path of a GPU run, on
CPU. Tests marked ``gpu`` repeat the precision checks on CUDA (``scripts/gpu_check.sh``).
"""

from grpo_lab.experiments import runs as runs_mod
import json

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("math_verify")

import _hub_fixture as H

from grpo_lab.lab import book
from grpo_lab import experiments, lab
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.policy.models import load_policy
from grpo_lab.tasks import GSM8KTask, get_task
from grpo_lab.training.trainer import PRECISIONS, Trainer, TrainerConfig, resolve_precision


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return H.write_tiny_instruct_model(tmp_path_factory.mktemp("tiny-instruct"))


def _arith_trainer(precision, **cfg):
    policy, tok = load_policy("arithmetic-base")
    settings = dict(prompts_per_step=4, group_size=4, minibatches=2, eval_every=0, seed=0, progress=False)
    config = TrainerConfig(precision=precision, **{**settings, **cfg})
    return Trainer(policy, tok, get_task("arithmetic"), GRPO, config)


# ------------------------------------------------------------------------- precision
def test_resolve_precision_by_device_and_capability(monkeypatch):
    assert resolve_precision("auto", "cpu") == "float32"
    assert resolve_precision("bfloat16", "cpu") == "bfloat16"
    assert PRECISIONS == ("float32", "bfloat16", "float16", "auto")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # T4
    assert resolve_precision("auto", "cuda") == "float16"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # A100
    assert resolve_precision("auto", "cuda:0") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # H100
    assert resolve_precision("auto", torch.device("cuda")) == "bfloat16"
    with pytest.raises(ValueError, match="precision"):
        resolve_precision("fp8", "cpu")
    with pytest.raises(ValueError, match="TrainerConfig.precision"):
        TrainerConfig(precision="half")


def test_a_low_precision_policy_is_refused_with_the_fix():
    policy, tok = load_policy("arithmetic-base", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"torch.bfloat16 parameters.*dtype=torch.float32"):
        Trainer(policy, tok, get_task("arithmetic"), GRPO, TrainerConfig(precision="bfloat16"))


def test_bfloat16_autocast_runs_the_forward_in_bfloat16_and_keeps_float32_state():
    tr = _arith_trainer("bfloat16")
    ids = torch.tensor([[1, 2, 3]])
    with tr.amp.autocast():
        logits = tr.policy(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16
    assert tr.policy(input_ids=ids).logits.dtype == torch.float32  # outside the context: float32
    h = tr.train(2)
    assert all(p.dtype == torch.float32 for p in tr.policy.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in tr.optimizer.state.values())
    assert np.isfinite(h["grad_norm"]).all() and np.isfinite(h["clip_frac"]).all()
    assert not tr.scaler.is_enabled() and "amp_skipped_steps" not in h.columns
    # the same seed in float32 samples the same first rollout's prompts but not the same numbers
    ref = _arith_trainer("float32").train(1)
    assert ref["grad_norm"].iloc[0] != h["grad_norm"].iloc[0]
    assert abs(ref["grad_norm"].iloc[0] - h["grad_norm"].iloc[0]) < 0.2 * ref["grad_norm"].iloc[0]


def test_float16_uses_a_gradient_scaler_that_checkpoints(tmp_path):
    tr = _arith_trainer("float16")
    assert tr.scaler.is_enabled() and tr.scaler.get_scale() == 65536.0  # torch's initial scale
    h = tr.train(1)
    assert h["amp_skipped_steps"].iloc[-1] == 0 and h["amp_scale"].iloc[-1] == 65536.0
    tr.scaler.update(new_scale=1024.0)
    tr.save(tmp_path / "ck")
    state = json.loads((tmp_path / "ck" / "state.json").read_text())
    assert state["grad_scaler"]["scale"] == 1024.0
    back = Trainer.resume(tmp_path / "ck")
    assert back.scaler.is_enabled() and back.scaler.get_scale() == 1024.0
    assert back.precision == "float16"


def test_a_float16_overflow_skips_the_step_and_lowers_the_scale():
    tr = _arith_trainer("float16", minibatches=1)
    first = next(tr.policy.parameters())
    first.register_hook(lambda g: g * float("inf"))  # every backward: an overflowed gradient
    before = [p.detach().clone() for p in tr.policy.parameters()]
    h = tr.train(1)
    assert tr.amp_skipped_steps == 1 and h["amp_skipped_steps"].iloc[-1] == 1
    assert tr.scaler.get_scale() == 32768.0  # backoff factor 0.5
    assert all(torch.equal(a, b) for a, b in zip(before, tr.policy.parameters()))  # the step was not applied
    assert np.isnan(h["grad_norm"].iloc[-1])  # no applied step this row: no gradient norm to report
    # float32 has no scaler: the same overflow is an error that names the cause
    tr32 = _arith_trainer("float32", minibatches=1)
    next(tr32.policy.parameters()).register_hook(lambda g: g * float("inf"))
    with pytest.raises(FloatingPointError, match="non-finite policy gradient norm"):
        tr32.train(1)


def test_a_float16_overflow_in_the_critic_skips_both_optimisers():
    """GradScaler would skip only the optimiser whose gradients overflowed; the trainer skips the
    policy's and the critic's together, so neither moves on an overflowed step."""
    policy, tok = load_policy("arithmetic-base")
    cfg = TrainerConfig(prompts_per_step=4, group_size=1, minibatches=1, eval_every=0, seed=0, progress=False,
                        precision="float16")
    tr = Trainer(policy, tok, get_task("arithmetic"), "PPO", cfg)
    assert tr.value_model is not None and tr.scaler.is_enabled()
    next(tr.value_model.parameters()).register_hook(lambda g: g * float("inf"))
    pol0 = [p.detach().clone() for p in tr.policy.parameters()]
    val0 = [p.detach().clone() for p in tr.value_model.parameters()]
    tr.train(1)
    assert tr.amp_skipped_steps == 1 and tr.scaler.get_scale() == 32768.0
    assert all(torch.equal(a, b) for a, b in zip(pol0, tr.policy.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(val0, tr.value_model.parameters()))
    tr.pretrain_value(1)  # value pretraining under float16: the same overflow is skipped and counted
    assert tr.amp_skipped_steps == 2 and all(torch.equal(a, b) for a, b in zip(val0, tr.value_model.parameters()))


# ------------------------------------------------------------------------- the profile
def test_the_gpu_profile_names_its_model_in_one_place(monkeypatch):
    for var in ("GRPO_LAB_GPU_MODEL", "GRPO_LAB_GSM8K_SOURCE", "GRPO_LAB_GPU_DEVICE", "GRPO_LAB_GPU_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    prof = experiments.get_profile("gpu")
    assert experiments.GPU_MODEL == "Qwen/Qwen2.5-0.5B-Instruct"
    assert prof.base == experiments.GPU_MODEL and prof.task == "gsm8k"
    kw = dict(prof.task_kwargs)
    assert kw == {"source": "hub", "tokenizer_name": experiments.GPU_MODEL, "max_new_tokens": 512, "test_size": 500}
    c = prof.config
    assert (c.device, c.precision, c.group_size, c.prompts_per_step, c.lr) == ("cuda", "auto", 8, 16, 1e-6)
    assert c.minibatches == 2 and prof.steps == 60
    monkeypatch.setenv("GRPO_LAB_GPU_MODEL", "/models/tiny")
    monkeypatch.setenv("GRPO_LAB_GSM8K_SOURCE", "fixture")
    prof = experiments.get_profile("gpu")  # read at call time, not at import
    assert prof.base == "/models/tiny" and dict(prof.task_kwargs)["tokenizer_name"] == "/models/tiny"
    assert dict(prof.task_kwargs)["source"] == "fixture" and dict(prof.task_kwargs)["test_size"] is None
    assert experiments.gpu_profile("org/other", device="cpu").config.device == "cpu"
    monkeypatch.setenv("GRPO_LAB_GPU_DEVICE", "cpu")  # a dry run of the GPU code path
    assert experiments.get_profile("gpu").config.device == "cpu"
    monkeypatch.setenv("GRPO_LAB_GPU_CONFIG", '{"micro_batch_size": 2, "precision": "float16"}')
    c = experiments.get_profile("gpu").config
    assert (c.micro_batch_size, c.precision, c.group_size) == (2, "float16", 8)
    assert experiments.gpu_profile(micro_batch_size=1).config.micro_batch_size == 1  # keywords win
    for bad, why in (("{micro_batch_size: 2}", "not JSON"), ('{"mb": 2}', "unknown: \\['mb'\\]"),
                     ("[2]", "JSON object")):
        monkeypatch.setenv("GRPO_LAB_GPU_CONFIG", bad)
        with pytest.raises(ValueError, match=why):
            experiments.get_profile("gpu")
    monkeypatch.setenv("GRPO_LAB_GPU_CONFIG", '{"micro_batch_size": 0}')
    with pytest.raises(ValueError, match="micro_batch_size.*GRPO_LAB_GPU_CONFIG"):  # names where the value came from
        experiments.get_profile("gpu")
    # a bad variable breaks the GPU profile only: the CPU profile and a fresh import still work
    monkeypatch.setenv("GRPO_LAB_GPU_CONFIG", "not json")
    import subprocess
    import sys

    assert experiments.get_profile("cpu").name == "cpu"
    assert experiments.gpu_profile(environ={}).config.micro_batch_size == 4
    code = "import grpo_lab.experiments as e; print(e.PROFILES['gpu'].config.micro_batch_size)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "4", done.stderr
    with pytest.raises(ValueError, match="non-empty"):
        experiments.gpu_profile(" ")


def test_expected_gpu_minutes_by_hand():
    prof = experiments.Profile(name="t", base="x", task="gsm8k", steps=10,
                               config=TrainerConfig(prompts_per_step=2, group_size=2, eval_every=5, max_new_tokens=100),
                               task_kwargs={"test_size": 256})
    # H100: per step 100 * 0.020 + 2*2*(150+250)/60000 = 2.0266667 s; evaluations at 0, 5, 10: 3 x one
    # batch of 100 steps = 6 s; total 20.266667 + 6 = 26.266667 s = 0.43777778 min (hand arithmetic)
    assert experiments.expected_gpu_minutes(prof, 1, "H100") == pytest.approx(0.43777778, rel=1e-6)
    assert experiments.expected_gpu_minutes(prof, 3, "H100") == pytest.approx(3 * 0.43777778, rel=1e-6)
    # T4, twice the training compute: per step 100*0.045 + 2*1600/4000 = 5.3 s; 3 evals x 4.5 s
    assert experiments.expected_gpu_minutes(prof, 1, "T4", train_factor=2.0) == pytest.approx((53 + 13.5) / 60)
    with pytest.raises(ValueError, match="unknown GPU class"):
        experiments.expected_gpu_minutes(prof, 1, "A100")
    with pytest.raises(ValueError, match="runs"):
        experiments.expected_gpu_minutes(prof, 0, "T4")
    for steps in (0, -1, 2.5):
        with pytest.raises(ValueError, match="steps"):
            experiments.expected_gpu_minutes(prof, 1, "T4", steps=steps)


def test_a_misspelled_chapter_profile_is_refused():
    book.setup_notebook(seed=0, profile="gpu")
    for bad in ("GPU", "cuda", ""):
        with pytest.raises(ValueError, match="PROFILE must be one of"):
            book.setup_notebook(seed=0, profile=bad)


def test_a_gpu_model_that_cannot_be_loaded_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: the hub id cannot be found offline
    prof = experiments.gpu_profile("grpo-lab-tests/not-a-model", source="fixture", device="cpu", steps=1)
    with pytest.raises(OSError, match="GRPO_LAB_GPU_MODEL"):
        runs_mod._train_one(GRPO, prof, 1, 0, False)


# ------------------------------------------------------------------------- end to end on CPU
@pytest.fixture(scope="module")
def chapter_run(tiny_dir, tmp_path_factory):
    """GRPO, Dr.GRPO and DAPO (shaped rewards, dynamic sampling), two seeds, two steps, through
    run_chapter_gpu with the gpu profile on CPU."""
    out = tmp_path_factory.mktemp("results")
    prof = experiments.gpu_profile(tiny_dir, source="fixture", device="cpu", steps=2, prompts_per_step=2,
                                   group_size=2, micro_batch_size=2, eval_every=1, max_new_tokens=12,
                                   precision="bfloat16")
    grid = lab.run_chapter_gpu("99_test", ["GRPO", "DR_GRPO", "DAPO"], seeds=(0, 1), profile=prof,
                                       out=out / "99_test.json")
    return grid, out


def test_the_gsm8k_fixture_trains_end_to_end_through_the_gpu_code_path(chapter_run, tiny_dir):
    grid, out = chapter_run
    assert list(grid) == ["GRPO", "DR_GRPO", "DAPO"]
    for r in grid.values():
        h = r.history
        assert sorted(h["seed"].unique()) == [0, 1] and h["step"].max() == 2
        assert h["test_accuracy"].notna().sum() == 2 * 3  # steps 0, 1, 2 for each seed
        assert (h.loc[h["step"] > 0, "length"] <= 12).all()
    results, prov = lab.load_chapter_gpu("99_test", out)
    assert set(results) == set(grid)
    assert prov["chapter"] == "99_test" and prov["device"] == "cpu" and prov["precision"] == "bfloat16"
    assert prov["base"] == str(tiny_dir) and prov["seeds"] == [0, 1] and prov["steps"] == 2
    assert prov["task_kwargs"]["source"] == "fixture" and prov["wall_seconds"] > 0 and prov["complete"] is True
    assert all(r["seeds"] == [0, 1] and r["cached_seeds"] == [] for r in prov["runs"].values())
    for key in ("git_sha", "torch", "transformers", "device_name", "date"):
        assert key in prov
    for name, r in results.items():
        pd.testing.assert_frame_equal(r.history.reset_index(drop=True)[["seed", "step", "reward"]],
                                      grid[name].history.reset_index(drop=True)[["seed", "step", "reward"]])
    assert lab.load_chapter_gpu("no_such_chapter", out) is None
    with pytest.raises(ValueError, match="chapter must be"):
        lab.load_chapter_gpu("../etc", out)


def test_check_gpu_results_names_the_fact_that_fails(chapter_run):
    _, out = chapter_run
    results, prov = lab.load_chapter_gpu("99_test", out)
    assert prov["dry_run"] is True  # a CPU run of the GPU profile is marked as a dry run of the code path
    lab.check_gpu_results(results, prov)
    with pytest.raises(AssertionError, match="device 'cpu' is not CUDA"):
        lab.check_gpu_results(results, {**prov, "dry_run": False})
    on_gpu = {**prov, "device": "cuda", "dry_run": False}
    lab.check_gpu_results(results, on_gpu)  # every other fact holds
    with pytest.raises(AssertionError, match="lacks seeds"):
        lab.check_gpu_results(results, {**on_gpu, "seeds": [0, 1, 2]})
    with pytest.raises(AssertionError, match="stopped before step 5"):
        lab.check_gpu_results(results, {**on_gpu, "steps": 5})
    with pytest.raises(AssertionError, match="incomplete"):
        lab.check_gpu_results(results, {**on_gpu, "complete": False})
    name = next(iter(results))
    bad = results[name].history.copy()
    bad.loc[bad["step"] == 2, "test_accuracy"] = 1.5
    with pytest.raises(AssertionError, match="outside"):
        lab.check_gpu_results({**results, name: experiments.RunResult(bad, {})}, on_gpu)
    with pytest.raises(AssertionError, match="solves only"):  # the default model must solve > 10%
        lab.check_gpu_results(results, {**on_gpu, "base": experiments.GPU_MODEL})


def test_summarize_runs_pairs_by_seed(chapter_run):
    _, out = chapter_run
    results, _ = lab.load_chapter_gpu("99_test", out)
    names = list(results)
    table = experiments.summarize_runs(results, baseline=names[0])
    assert table["algorithm"].tolist() == names and table["seeds"].tolist() == [2, 2, 2]
    assert table.loc[0, f"vs {names[0]}"] == "" and table.loc[1, f"vs {names[0]}"].count("[") == 1
    lengths = experiments.summarize_runs(results, column="length_incorrect")
    assert (lengths["base"] == "not measured").all() and (lengths["final - base"] == "n/a").all()
    with pytest.raises(ValueError, match="baseline"):
        experiments.summarize_runs(results, baseline="PPO")


def test_a_summary_by_hand():
    # two seeds: final 0.5 / 0.7, base 0.3 / 0.3 -> change 0.2 / 0.4, mean 0.3, t(0.975, 1) = 12.706,
    # sd of the changes 0.141421 -> half width 12.706 * 0.141421 / sqrt(2) = 1.2706 (hand arithmetic)
    h = pd.DataFrame({"algo": "A", "seed": [0, 0, 1, 1], "step": [0, 5, 0, 5], "test_accuracy": [0.3, 0.5, 0.3, 0.7]})
    t = experiments.summarize_runs({"A": experiments.RunResult(h, {})})
    assert t.loc[0, "final - base"] == "0.300 [-0.971, 1.571]"
    assert t.loc[0, "base"] == "0.300 [0.300, 0.300]"


def test_the_chapter_cell_shows_results_or_what_a_run_would_cost(chapter_run, tmp_path, capsys, monkeypatch):
    for var in ("GRPO_LAB_GPU_MODEL", "GRPO_LAB_GSM8K_SOURCE", "GRPO_LAB_GPU_DEVICE", "GRPO_LAB_GPU_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    assert book.show_gpu_results("99_test", ["GRPO", "DAPO"], directory=tmp_path, too_small=("T4",)) is None
    text = capsys.readouterr().out
    assert "99_test.json is absent" in text and "GRPO, DAPO" in text and experiments.GPU_MODEL in text
    assert "does not fit" in text and "5 seeds each" in text
    _, out = chapter_run
    results, prov = lab.load_chapter_gpu("99_test", out)
    whole = experiments.load_results(out / "99_test.json")
    shown = book.show_gpu_results("99_test", list(results), directory=out)
    assert "DRY RUN of the GPU code path on cpu" in capsys.readouterr().out
    whole.provenance.update(device="cuda", dry_run=False)  # as if it had run on a GPU
    experiments.save_results(whole, tmp_path / "99_test.json")
    shown = book.show_gpu_results("99_test", list(results), baseline=next(iter(results)), directory=tmp_path,
                                  columns=("test_accuracy", "length"))
    text = capsys.readouterr().out
    assert set(shown) == {"test_accuracy", "length"} and "GPU results:" in text and "bfloat16" in text
    assert "DRY RUN" not in text
    assert "the run's regime" in text and "tokens clipped (fraction)" in text and "tied groups (fraction)" in text
    # in a notebook the regime table is HTML: the paper's sentences are shown whole (pandas cuts cells at 50 chars)
    import IPython.display

    shown_html = []
    monkeypatch.setattr(book, "_ipython_shell", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda value: shown_html.append(
        value._repr_html_() if hasattr(value, "_repr_html_") else repr(value)))
    sentence = "a sentence of the paper that is longer than the fifty characters pandas keeps"
    book.show_gpu_results("99_test", list(results), directory=tmp_path,
                          paper_regime={"The paper (its model, its data, its minibatches)": {"tokens clipped (fraction)": sentence}})
    assert any(sentence in h and "The paper (its model, its data, its minibatches)" in h for h in shown_html)


def test_gpu_regime_by_hand():
    """book.gpu_regime: per algorithm, each seed's mean over its RL steps (step 0, the base evaluation,
    left out), then mean and 95% t interval over seeds (a fraction's clipped to [0, 1]). By hand: seed means 0.1 and 0.3 -> 0.2, sd
    0.1414, t(0.975, 1) = 12.706, half-width 12.706 * 0.1414 / sqrt(2) = 1.2706."""
    import pandas as pd

    h = pd.DataFrame({"seed": [0, 0, 0, 1, 1, 1], "step": [0, 1, 2, 0, 1, 2],
                      "clip_frac": [9.0, 0.0, 0.2, 9.0, 0.2, 0.4], "length": [None, 4.0, 6.0, None, 5.0, 5.0]})
    ntp = pd.DataFrame({"seed": [0, 1], "step": [0, 2], "test_accuracy": [0.1, 0.2]})
    reg = book.gpu_regime({"GRPO": experiments.RunResult(h, {}), "continued NTP": experiments.RunResult(ntp, {})})
    assert list(reg.index) == ["GRPO"]  # a baseline without those columns has no row
    assert reg.loc["GRPO", "tokens clipped (fraction)"] == "0.200 [0.000, 1.000]"  # [-1.071, 1.471] clipped to [0, 1]
    assert reg.loc["GRPO", "response length (tokens)"] == "5.000 [5.000, 5.000]"
    assert "tied groups (fraction)" not in reg.columns
    with pytest.raises(TypeError, match=r"results\['x'\] is a int, not a RunResult"):
        book.gpu_regime({"x": 1})
    with pytest.raises(TypeError, match="algorithm name: RunResult"):
        book.gpu_regime([experiments.RunResult(h, {})])


def test_gpu_regime_sets_the_papers_values_beside_the_runs():
    """book.gpu_regime(paper=...): the paper's rows after the runs', its text as given, "not reported" for a
    measure it does not give, a measure only the paper gives added as a column; no paper rows without a run row;
    malformed input refused by name (also by show_gpu_results before it looks for results)."""
    import pandas as pd

    h = pd.DataFrame({"seed": [0, 0, 1, 1], "step": [0, 1, 0, 1], "clip_frac": [0.0, 0.1, 0.0, 0.3]})
    paper = {"GSPO paper (Fig. 2)": {"tokens clipped (fraction)": "about 100x GRPO's",
                                     "response length (tokens)": "long CoT"}}
    reg = book.gpu_regime({"GRPO": experiments.RunResult(h, {})}, paper)
    assert list(reg.index) == ["GRPO", "GSPO paper (Fig. 2)"]
    assert list(reg.columns) == ["seeds", "tokens clipped (fraction)", "response length (tokens)"]
    assert reg.loc["GSPO paper (Fig. 2)", "tokens clipped (fraction)"] == "about 100x GRPO's"
    assert reg.loc["GRPO", "tokens clipped (fraction)"].startswith("0.200 [")  # seed means 0.1, 0.3
    assert reg.loc["GRPO", "response length (tokens)"] == "not measured"  # the run has no length column
    assert reg.loc["GRPO", "seeds"] == 2 and reg.loc["GSPO paper (Fig. 2)", "seeds"] == "not reported"
    reg2 = book.gpu_regime({"GRPO": experiments.RunResult(h, {})}, {"p": {"tied groups (fraction)": "none"},
                                                                    "q": {"tokens clipped (fraction)": "1%"}})
    assert reg2.loc["p", "tokens clipped (fraction)"] == "not reported" and reg2.loc["q", "tied groups (fraction)"] == "not reported"
    ntp = pd.DataFrame({"seed": [0], "step": [1], "test_accuracy": [0.1]})
    assert book.gpu_regime({"NTP": experiments.RunResult(ntp, {})}, paper).empty  # nothing of ours to compare
    with pytest.raises(ValueError, match="measure 'clip share'; the measures are"):
        book.gpu_regime({"GRPO": experiments.RunResult(h, {})}, {"p": {"clip share": "1%"}})
    with pytest.raises(ValueError, match="paper row 'GRPO' has an algorithm's name"):
        book.gpu_regime({"GRPO": experiments.RunResult(h, {})}, {"GRPO": {}})
    with pytest.raises(TypeError, match=r"paper\['p'\]\['tokens clipped \(fraction\)'\] must be text"):
        book.gpu_regime({"GRPO": experiments.RunResult(h, {})}, {"p": {"tokens clipped (fraction)": 0.01}})
    with pytest.raises(TypeError, match="row labels must be str, got 1"):
        book.gpu_regime({"GRPO": experiments.RunResult(h, {})}, {1: {}})
    with pytest.raises(TypeError, match="measure label that is not str: 1"):
        book.gpu_regime({"GRPO": experiments.RunResult(h, {})}, {"p": {1: "x"}})
    with pytest.raises(TypeError, match="paper must be"):
        book.gpu_regime({"GRPO": experiments.RunResult(h, {})}, [("p", {})])
    with pytest.raises(ValueError, match="measure 'x'"):
        book.show_gpu_results("04_gspo", ["GRPO"], paper_regime={"p": {"x": "1"}})


def test_gpu_regime_shows_seed_counts_and_refuses_impossible_values():
    """book.gpu_regime: a measure one run lacks reads "not measured" (not NaN); one seed reads as a bare
    mean with its seed count, never a zero-width interval; a measure fewer seeds measured names how many;
    an inf value or a fraction outside [0, 1] at an RL step is refused naming the algorithm, the measure,
    the seed and the step (step 0, the base evaluation, is not read)."""
    import pandas as pd

    R = experiments.RunResult
    two = pd.DataFrame({"seed": [0, 0, 1, 1], "step": [0, 1, 0, 1], "clip_frac": [0.0, 0.1, 0.0, 0.3],
                        "zero_adv_group_frac": [None, 0.5, None, None]})  # seed 1 never measured tied groups
    one = pd.DataFrame({"seed": [0, 0, 0], "step": [0, 1, 2], "clip_frac": [0.0, 0.1, 0.3],
                        "length": [None, 4.0, 6.0]})
    reg = book.gpu_regime({"GRPO": R(two, {}), "dry run": R(one, {})})
    assert list(reg.columns) == ["seeds", "tokens clipped (fraction)", "tied groups (fraction)",
                                 "response length (tokens)"]
    assert reg["seeds"].tolist() == [2, 1]
    assert reg.loc["dry run", "tokens clipped (fraction)"] == "0.200 (1 seed: no interval)"
    assert reg.loc["dry run", "response length (tokens)"] == "5.000 (1 seed: no interval)"
    assert reg.loc["dry run", "tied groups (fraction)"] == "not measured"
    assert reg.loc["GRPO", "response length (tokens)"] == "not measured"
    assert reg.loc["GRPO", "tied groups (fraction)"] == "0.500 (1 of 2 seeds: no interval)"
    assert reg.loc["GRPO", "tokens clipped (fraction)"].startswith("0.200 [") and "seed" not in reg.loc["GRPO", "tokens clipped (fraction)"]
    three = pd.DataFrame({"seed": [0, 1, 2], "step": [1, 1, 1], "clip_frac": [0.1, 0.3, None]})
    assert book.gpu_regime({"A": R(three, {})}).loc["A", "tokens clipped (fraction)"].endswith("] (2 of 3 seeds)")
    assert book.gpu_regime({"A": R(two.assign(clip_frac=[9.0, 1.0 + 1e-9, -1.0, 0.0]), {})}).loc[
        "A", "tokens clipped (fraction)"] == "0.500 [0.000, 1.000]"  # step 0 not read; rounding above 1 kept
    for col, value, label, why in (
            ("clip_frac", float("inf"), "tokens clipped \\(fraction\\)", "inf at seed 1, step 1 is not finite"),
            ("length", float("-inf"), "response length \\(tokens\\)", "-inf at seed 1, step 1 is not finite"),
            ("clip_frac", 1.5, "tokens clipped \\(fraction\\)", "1.5 at seed 1, step 1 is outside \\[0, 1\\]"),
            ("zero_adv_group_frac", -0.25, "tied groups \\(fraction\\)", "-0.25 at seed 1, step 1 is outside")):
        bad = two.assign(length=[None, 3.0, None, 4.0])
        bad.loc[3, col] = value
        with pytest.raises(ValueError, match=f"algorithm 'DAPO', measure '{label}'.*{why}"):
            book.gpu_regime({"GRPO": R(two, {}), "DAPO": R(bad, {})})
    both = two.assign(clip_frac=[0.0, float("inf"), 0.0, float("-inf")])  # once a NaN mean, silently dropped
    with pytest.raises(ValueError, match="'tokens clipped.*inf at seed 0, step 1 is not finite \\(2 such"):
        book.gpu_regime({"GRPO": R(both, {})})


def test_gpu_time_table_by_hand(monkeypatch):
    monkeypatch.delenv("GRPO_LAB_GSM8K_SOURCE", raising=False)
    # the gpu profile on an H100, by hand: per step 512 * 0.020 = 10.24 s decoding + 16*8*400/60000 =
    # 0.8533 s training = 11.0933 s, x 60 = 665.6 s; 7 evaluations (steps 0, 10, ..., 60) x 2 batches of
    # 500 problems x 512 * 0.020 s = 143.36 s; 808.96 s per run, 5 runs = 4044.8 s = 1.12 h
    t = book.gpu_time_table(5, too_small=("T4",))
    assert t.loc[0, "H100-class GPU (hours, estimated)"] == 1.1
    assert t.loc[0, "T4-class GPU (hours, estimated)"] == "does not fit"
    assert experiments.expected_gpu_minutes(experiments.gpu_profile(), 5, "H100") == pytest.approx(4044.8 / 60)


# ------------------------------------------------------------------------- executing a chapter with parameters
def test_parameters_are_injected_after_the_parameters_cell():
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import os"),
        nbformat.v4.new_code_cell('PROFILE = "cpu"\nGPU_STEPS = None', metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("print(PROFILE)")])
    book._inject_parameters(nb, {"PROFILE": "gpu", "GPU_STEPS": 3})
    assert nb.cells[2].source == "PROFILE = 'gpu'\nGPU_STEPS = 3"
    assert nb.cells[2].metadata["tags"] == ["injected-parameters"] and nb.cells[3].source == "print(PROFILE)"
    with pytest.raises(ValueError, match="not assigned in the parameters cell"):
        book._inject_parameters(nb, {"SEEDS": (0,)})
    with pytest.raises(ValueError, match="tagged 'parameters'"):
        book._inject_parameters(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), {"x": 2})


def test_execute_command_line_refuses_a_non_literal_value(tmp_path, capsys):
    with pytest.raises(SystemExit):
        book._main(["execute", str(tmp_path / "x.ipynb"), "--param", "PROFILE=gpu"])
    assert "Python literal" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        book._main(["execute", "a.ipynb", "b.ipynb", "--out", str(tmp_path / "o.ipynb")])
    nb = tmp_path / "x.ipynb"
    nb.write_text("{}")
    with pytest.raises(SystemExit):  # refused before executing anything
        book._main(["execute", str(nb), "--out", str(tmp_path / "no" / "such" / "o.ipynb")])
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        book._main(["execute", str(tmp_path / "missing.ipynb")])
    assert "no such notebook" in capsys.readouterr().err


def test_every_chapter_with_a_hub_model_run_declares_the_gpu_parameters():
    import ast
    from pathlib import Path

    import nbformat

    root = Path(__file__).resolve().parents[2] / "book"
    for name in ("01_grpo", "02_dapo", "03_dr_grpo", "04_gspo", "05_cispo", "06_vapo", "07_rpt"):
        nb = nbformat.read(root / f"{name}.ipynb", as_version=4)
        params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        assigned = {t.id for n in ast.parse(params.source).body if isinstance(n, ast.Assign) for t in n.targets}
        assert {"PROFILE", "GPU_SEEDS", "GPU_STEPS", "GPU_N_JOBS"} <= assigned, name
        run = "run_rpt_gpu(" if name == "07_rpt" else f'run_chapter_gpu("{name}"'
        calls = [c.source for c in nb.cells if c.cell_type == "code" and run in c.source]
        assert len(calls) == 1 and f'show_gpu_results("{name}"' in calls[0], name
        # the toy experiments never read PROFILE (they are the CPU profile on every machine); the set-up
        # cell checks its value, the hub-model cell reads it
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code" and c is not params)
        gpu_if = 'if PROFILE == "gpu":' if name == "07_rpt" else 'if PROFILE in ("gpu", "colab"):'
        assert code.count("PROFILE") == 3 and gpu_if in code, name
        assert 'if PROFILE == "colab":' in code, name  # the T4 variant (or, chapter 7, why there is none)
        assert "book.setup_notebook(seed=0, profile=PROFILE)" in code, name


# ------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_precision_trains_the_hub_layout_model_on_cuda(tiny_dir):
    want = "bfloat16" if torch.cuda.get_device_capability() >= (8, 0) else "float16"
    assert resolve_precision("auto", "cuda") == want
    policy, tok = load_policy(tiny_dir, dtype=torch.float32)
    task = GSM8KTask(source="fixture", tokenizer_name=str(tiny_dir), max_new_tokens=16)
    tr = Trainer(policy, tok, task, GRPO, TrainerConfig(prompts_per_step=2, group_size=4, minibatches=2,
                                                        eval_every=1, device="cuda", precision="auto", progress=False))
    assert tr.precision == want and tr.scaler.is_enabled() == (want == "float16")
    h = tr.train(2)
    assert h["step"].max() == 2 and h["peak_mem_mb"].dropna().gt(0).all()
    assert all(p.dtype == torch.float32 and p.is_cuda for p in tr.policy.parameters())
    with tr.amp.autocast():
        logits = tr.policy(input_ids=torch.tensor([[1, 2, 3]], device="cuda")).logits
    assert logits.dtype == getattr(torch, want)


def test_the_gpu_time_table_is_the_estimate():
    """benchmarks/README.md's table of expected GPU times (between the gpu-times markers) equals what
    expected_gpu_minutes gives for each chapter's GSM8K cell: its GPU_ALGOS x GPU_SEEDS runs and the
    factors its show_gpu_results call passes, read from the chapter's twin."""
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    tables = (root / "benchmarks" / "README.md").read_text()
    block = tables.split("<!-- gpu-times:start -->")[1].split("<!-- gpu-times:end -->")[0]
    rows = {m[0]: (int(m[1]), m[2], m[3]) for m in re.findall(r"\| `(\w+)` \| (\d+) \| ([^|]+) \| ([^|]+) \|", block)}
    seen = set()
    for twin in sorted((root / "book" / "_py").glob("0*.py")):
        tree = ast.parse(twin.read_text())
        algos = seeds = call = None
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id == "GPU_ALGOS":
                    algos = len(node.value.elts)
                elif node.targets[0].id == "GPU_SEEDS":
                    seeds = len(node.value.elts)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "show_gpu_results":
                call = {k.arg: ast.literal_eval(k.value) for k in node.keywords
                        if k.arg in ("generation_factor", "train_factor", "too_small")}
        if call is None:
            continue
        seen.add(twin.stem)
        prof = lab.rpt_gpu_profile() if twin.stem == "07_rpt" else experiments.gpu_profile()
        runs = algos * seeds
        assert rows[twin.stem][0] == runs, twin.stem
        for gpu, shown in (("T4", rows[twin.stem][1]), ("H100", rows[twin.stem][2])):
            if gpu in call.get("too_small", ()):
                assert "does not fit" in shown, twin.stem
                continue
            hours = experiments.expected_gpu_minutes(prof, runs, gpu, generation_factor=call.get("generation_factor", 1.0),
                                                     train_factor=call.get("train_factor", 1.0)) / 60
            assert shown.strip() == f"{hours:.1f} h", (twin.stem, gpu)
    assert seen == set(rows) == {"01_grpo", "02_dapo", "03_dr_grpo", "04_gspo", "05_cispo", "06_vapo", "07_rpt",
                                 "08_choosing"}


def test_a_reward_signal_flows_through_the_gpu_profile_on_the_fixture(tiny_dir, tmp_path):
    """The random stand-in never answers, so its groups are all 0 and carry no gradient. Fine-tune
    a copy to answer ``\\boxed{10}`` or ``\\boxed{2}`` (the golds of fixture train rows 5 and 7, read
    by hand) at random: every batch of all 16 train questions then has mixed groups on those two,
    and GRPO through the gpu profile gets rewards, non-zero advantages and a gradient."""
    import shutil

    sft = tmp_path / "sft"
    shutil.copytree(tiny_dir, sft)
    model, tok = load_policy(sft)
    task = GSM8KTask(source="fixture", tokenizer_name=str(sft), max_new_tokens=12)
    prompts = [task.format_prompt(row["question"]) for row in task.rows()["train"]]
    answers = ["\\boxed{10}<|im_end|>", "\\boxed{2}<|im_end|>"]
    torch.manual_seed(0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    n_answer = [len(tok(a, add_special_tokens=False)["input_ids"]) for a in answers]
    for step in range(60):
        which = [(step + i) % 2 for i in range(8)]
        texts = [p + answers[k] for p, k in zip(prompts[:8], which)]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)  # padded on the left
        labels = torch.full_like(enc["input_ids"], -100)
        for row, k in enumerate(which):  # the loss on the answer only (the text's last tokens)
            labels[row, -n_answer[k]:] = enc["input_ids"][row, -n_answer[k]:]
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(sft)
    prof = experiments.gpu_profile(sft, source="fixture", device="cpu", steps=2, prompts_per_step=16,
                                   group_size=4, micro_batch_size=16, eval_every=0, max_new_tokens=12)
    h = experiments.run("GRPO", profile=prof, seeds=(0,), cache=False).history
    trained = h[h["step"] > 0]
    assert (trained["reward"] > 0).all(), trained["reward"].tolist()  # some \boxed{10} / \boxed{2} were right
    assert (trained["zero_adv_group_frac"] < 1).all()  # so some groups were mixed
    assert (trained["grad_norm"] > 0).all() and np.isfinite(trained["grad_norm"]).all()


def test_results_files_are_replaced_whole_and_a_broken_one_is_named(tmp_path, monkeypatch):
    """The GPU runs rewrite their file after every seed: a write that dies half-way must leave the
    previous file as it was (written beside, renamed over); a truncated or binary file is refused
    naming it, not with a bare JSONDecodeError."""
    path = tmp_path / "01_grpo.json"
    first = experiments.RunResult(pd.DataFrame([{"step": 0, "seed": 0, "test_accuracy": 0.25}]), {"seeds": [0]})
    experiments.save_results(first, path)
    before = path.read_text()

    def dies(*args, **kwargs):
        raise OSError("disk full")

    import grpo_lab.paths

    monkeypatch.setattr(grpo_lab.paths.os, "replace", dies)  # save_results writes through files.write_text_atomically
    second = experiments.RunResult(pd.DataFrame([{"step": 1, "seed": 0, "test_accuracy": 0.5}]), {"seeds": [0]})
    with pytest.raises(OSError, match="disk full"):
        experiments.save_results(second, path)
    monkeypatch.undo()
    assert path.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["01_grpo.json"]
    assert experiments.load_results(path).history["test_accuracy"].tolist() == [0.25]
    path.write_text(before[: len(before) // 2])
    with pytest.raises(ValueError, match="01_grpo.json is not a grpo_lab results file .not valid JSON"):
        experiments.load_results(path)
    path.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(ValueError, match="01_grpo.json is not a grpo_lab results file"):
        lab.load_chapter_gpu("01_grpo", tmp_path)


def test_run_chapter_gpu_refuses_a_run_without_steps_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="01_grpo: steps must be a positive int or None, got 0"):
        lab.run_chapter_gpu("01_grpo", ["GRPO"], seeds=(0,), steps=0, profile="cpu", out=tmp_path / "x.json")
    with pytest.raises(ValueError, match="is a directory"):
        lab.run_chapter_gpu("01_grpo", ["GRPO"], seeds=(0,), steps=1, profile="cpu", out=tmp_path)
    assert list(tmp_path.iterdir()) == []
