"""Chapter 7 on a hub model: NextTokenTask with a hub-layout tokenizer, its own data directory and
the chat format; build_hub_task_data; continued NTP in plain text and low precision; run_rpt_gpu
end to end on CPU with the tiny hub-layout stand-in (tests/_hub_fixture.py, random weights)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
import _hub_fixture as H  # noqa: E402

from grpo_lab.lab import book
from grpo_lab import experiments, lab  # noqa: E402
from grpo_lab.lab import rpt_gpu as rpt_gpu_mod  # noqa: E402
from grpo_lab.policy.models import load_policy  # noqa: E402
from grpo_lab.lab.pretrain import continue_ntp  # noqa: E402
from grpo_lab.tasks.next_token import (CHAT_INSTRUCTION, TEST_FILE, TRAIN_FILE, THINK_OPEN, NextTokenTask,  # noqa: E402
                                       build_hub_task_data)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The stand-in model and its next-token data (12 test positions)."""
    root = tmp_path_factory.mktemp("rpt-hub")
    model = H.write_tiny_instruct_model(root / "standin")
    summary = build_hub_task_data(model, root / "data", test_size=12)
    return model, root / "data", summary


def test_build_hub_task_data_writes_the_files_in_the_models_tokens(hub):
    model, data, summary = hub
    assert (data / TRAIN_FILE).is_file() and (data / TEST_FILE).is_file()
    on_disk = json.loads((data / "summary.json").read_text())
    assert on_disk["model"] == on_disk["proxy"] == str(model) and on_disk["test_positions"] == 12
    assert summary["train_positions"] > 1000 and "split" not in on_disk
    q = summary["train_entropy_quantiles"]
    assert all(0 <= v <= np.log(16) + 1e-6 for v in q) and q == sorted(q)
    # the shipped task's tokenizer did not cut these ids: refused by the tokenizer hash, naming the fix
    with pytest.raises(ValueError, match="tokenizer_sha256 differs.*build_hub_task_data"):
        NextTokenTask(data=str(data)).test_set()
    with pytest.raises(NotADirectoryError, match="not a directory"):
        build_hub_task_data(model, data / "summary.json")


def test_the_raw_and_chat_formats_of_the_same_position(hub):
    model, data, _ = hub
    raw = NextTokenTask(tokenizer=str(model), data=str(data))
    chat = NextTokenTask(tokenizer=str(model), data=str(data), chat=True)
    r, c = raw.test_set()[0], chat.test_set()[0]
    context = r.prompt[:-len(THINK_OPEN)]
    assert r.prompt.endswith(THINK_OPEN) and r.answer == c.answer and r.meta == c.meta
    # the ChatML template of the stand-in (Qwen2.5's form: a default system turn), then <think>
    assert c.prompt == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                        + CHAT_INSTRUCTION + context + "<|im_end|>\n<|im_start|>assistant\n" + THINK_OPEN)
    sampled = chat.sample(3, np.random.default_rng(0))
    assert all(p.prompt.endswith("<|im_start|>assistant\n" + THINK_OPEN) for p in sampled)
    # the reward reads the completion only, unchanged by the format
    assert chat.reward("</think>" + c.meta["reference_tokens"][0], c) == 1.0
    assert chat.reward(c.prompt + "</think>", c) == 0.0


def test_bad_settings_are_refused():
    for kwargs, why in (({"data": ""}, "data must be"), ({"chat": "yes"}, "chat must be a bool"),
                        ({"tokenizer": ""}, "tokenizer must be")):
        with pytest.raises(ValueError, match=why):
            NextTokenTask(**kwargs)
    with pytest.raises(ValueError, match="no chat template"):  # the shipped corpus tokenizer has none
        NextTokenTask(chat=True).format_prompt("some text")
    with pytest.raises(FileNotFoundError, match="build_hub_task_data"):
        NextTokenTask(data="/nonexistent/dir").test_set()
    with pytest.raises(FileNotFoundError, match="neither a shipped checkpoint"):
        NextTokenTask(tokenizer="./no/such/dir")._tok()


def test_continued_ntp_in_plain_text_and_bfloat16(hub):
    model, _, _ = hub
    policy, tok = load_policy(model)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    log = continue_ntp(policy, tok, steps=2, batch_size=3, lr=1e-3, p_format=0.0, precision="bfloat16")
    assert log["tokens"] == [3 * 64, 3 * 64]  # plain windows only, all full (no format rows, no padding)
    assert all(np.isfinite(log["loss"]))
    assert all(p.dtype == torch.float32 for p in policy.parameters())  # autocast, float32 weights
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())
    with pytest.raises(ValueError, match="p_format"):
        continue_ntp(policy, tok, steps=1, p_format=1.5)


def test_rl_compute_units_by_hand():
    h = pd.DataFrame({"seed": [0, 0, 0, 1, 1, 1], "step": [0, 1, 2, 0, 1, 2],
                      "length": [np.nan, 3.0, 5.0, np.nan, 4.0, 4.0]})
    # seed 0: 4 * 2 * 2 * ((10 + 3) + (10 + 5)) = 448; seed 1: 4 * 4 * (14 + 14) = 448 (hand arithmetic)
    units = lab.rl_compute_units(h, 10.0, 2, 2)
    assert units.to_dict() == {0: 448.0, 1: 448.0}


def test_rl_compute_units_charges_dynamic_samplings_refills():
    """Hand-computed golden (P = 2, G = 2, prompt 10 tokens): a unit per generated token, three per trained one."""
    h = pd.DataFrame({"seed": [0, 0, 0, 1, 1], "step": [0, 1, 2, 0, 1],
                      "length": [np.nan, 3.0, 5.0, np.nan, 6.0],
                      "generated_groups": [np.nan, 5, 2, np.nan, 6], "trained_groups": [np.nan, 2, 1, np.nan, 0]})
    # hand work, per step (generated * G + 3 * trained * G) * (10 + length):
    #   seed 0, step 1: (5*2 + 3*2*2) * 13 = (10 + 12) * 13 = 286   (three refill groups charged)
    #   seed 0, step 2: (2*2 + 3*1*2) * 15 = (4 + 6) * 15   = 150   (a short step: one group trained)
    #   seed 1, step 1: (6*2 + 3*0*2) * 16 = 12 * 16        = 192   (no group trained: generation only)
    # seed 0: 286 + 150 = 436; seed 1: 192. The old formula 4 * P * G * (10 + length) gave 448 and 256.
    units = lab.rl_compute_units(h, 10.0, 2, 2)
    assert units.to_dict() == {0: 436.0, 1: 192.0}


def test_rl_compute_units_without_refills_is_the_plain_formula():
    """generated_groups == trained_groups == P (a run without dynamic sampling): 4 * P * G * (prompt + length),
    as a history without those columns; a NaN count reads as P."""
    rng = np.random.default_rng(0)
    P, G, prompt = 16, 8, 37.5
    h = pd.DataFrame({"seed": np.repeat([0, 1, 2], 6), "step": np.tile(np.arange(6), 3),
                      "length": rng.uniform(1, 256, 18)})
    plain = lab.rl_compute_units(h, prompt, P, G)
    expected = (4 * P * G * (prompt + h["length"]))[h["step"] > 0].groupby(h["seed"][h["step"] > 0]).sum()
    pd.testing.assert_series_equal(plain, expected.rename("rl_units"))
    counted = h.assign(generated_groups=P, trained_groups=P)
    counted.loc[counted["step"] == 0, ["generated_groups", "trained_groups"]] = np.nan
    counted.loc[4, "trained_groups"] = np.nan
    pd.testing.assert_series_equal(lab.rl_compute_units(counted, prompt, P, G), plain)


def test_rl_compute_units_refuses_what_it_cannot_count():
    h = pd.DataFrame({"seed": [0, 0], "step": [0, 1], "length": [np.nan, 3.0]})
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['length'\]"):
        lab.rl_compute_units(h.drop(columns="length"), 10.0, 2, 2)
    with pytest.raises(ValueError, match="'generated_groups' without 'trained_groups'"):
        lab.rl_compute_units(h.assign(generated_groups=2), 10.0, 2, 2)
    with pytest.raises(ValueError, match="group_size must be a positive int, got 0"):
        lab.rl_compute_units(h, 10.0, 2, 0)


def test_run_rpt_gpu_refuses_an_algorithm_that_is_not_one(tmp_path):
    """Checked first, before the profile is built or any model loaded."""
    from grpo_lab.algo.algorithms import RPT
    from grpo_lab.lab import rpt_gpu

    for bad, why in (("RPT", "got str 'RPT'.*pass the preset"), ({"name": "RPT"}, "got dict"), (type(RPT), "got type")):
        with pytest.raises(TypeError, match=f"run_rpt_gpu: algorithm must be a grpo_lab.algo.algorithms.Algorithm.*{why}"):
            lab.run_rpt_gpu(algorithm=bad, out=tmp_path / "r.json")
    with pytest.raises(ValueError, match="'continued NTP' is the baseline's"):
        lab.run_rpt_gpu(algorithm=RPT.replace(name="continued NTP"), out=tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()
    default = rpt_gpu._rpt_algorithm(None)
    assert default.name == "RPT + dynamic sampling" and default.dynamic_sampling
    assert default == RPT.replace(name="RPT + dynamic sampling", dynamic_sampling=True)  # the chapter's RPT_DS
    assert rpt_gpu._rpt_algorithm(RPT) is RPT


def test_the_rpt_gpu_profile(monkeypatch):
    for var in ("GRPO_LAB_GPU_MODEL", "GRPO_LAB_GPU_CONFIG", "GRPO_LAB_RPT_DATA", "GRPO_LAB_RESULTS_DIR"):
        monkeypatch.delenv(var, raising=False)
    prof = lab.rpt_gpu_profile()
    kw = dict(prof.task_kwargs)
    assert prof.base == experiments.GPU_MODEL and prof.task == "next_token" and prof.steps == 60
    assert kw["tokenizer"] == experiments.GPU_MODEL and kw["chat"] is True and kw["max_new_tokens"] == 256 and kw["eval_held_out_loss"] is True
    assert Path(kw["data"]) == lab.results_dir() / "next_token" / "Qwen--Qwen2.5-0.5B-Instruct"
    c = prof.config
    assert (c.group_size, c.temperature, c.lr, c.minibatches, c.eval_sampled) == (8, 0.8, 1e-6, 1, True)
    monkeypatch.setenv("GRPO_LAB_GPU_CONFIG", '{"group_size": 4}')  # the environment beats the defaults ...
    assert lab.rpt_gpu_profile().config.group_size == 4
    assert lab.rpt_gpu_profile(group_size=2).config.group_size == 2  # ... and keywords beat both
    monkeypatch.setenv("GRPO_LAB_RPT_DATA", "/data/rpt")
    assert dict(lab.rpt_gpu_profile().task_kwargs)["data"] == "/data/rpt"
    # the estimate counts the sampled evaluation twice: one more evaluation pass per evaluation
    prof = lab.rpt_gpu_profile(eval_every=60)
    plain = lab.rpt_gpu_profile(eval_every=60, eval_sampled=False)
    # 2 evaluations (steps 0 and 60) x ceil(500 / 256) = 2 batches x 256 decoding steps x 0.020 s (H100)
    extra = experiments.expected_gpu_minutes(prof, 1, "H100") - experiments.expected_gpu_minutes(plain, 1, "H100")
    assert extra == pytest.approx(2 * 2 * 256 * 0.020 / 60)


# the random stand-in never predicts a token, so dynamic sampling finds no mixed group and says so (tested in
# tests/papers/test_dapo.py and tests/training/test_learning_signal.py); here the refills are what the compute must charge
@pytest.mark.filterwarnings("ignore::grpo_lab.training.learning_signal.DynamicSamplingShortfallWarning")
def test_run_rpt_gpu_end_to_end_on_cpu(hub, tmp_path):
    model, data, _ = hub
    prof = lab.rpt_gpu_profile(model, data=data, device="cpu", steps=2, prompts_per_step=2, group_size=2,
                                       max_new_tokens=8, eval_every=1, precision="bfloat16", environ={})
    with pytest.warns(RuntimeWarning, match="hold 12 test positions, not 500"):
        grid = lab.run_rpt_gpu(seeds=(0, 1), profile=prof, ntp_batch_size=2, out=tmp_path / "07_rpt.json")
    assert set(grid) == {"RPT + dynamic sampling", "continued NTP"}  # the default: RPT with dynamic sampling
    loaded = lab.load_chapter_gpu("07_rpt", tmp_path)
    assert loaded is not None
    results, prov = loaded
    lab.check_gpu_results(results, prov)  # the baseline is held to the facts on accuracies only
    assert prov["complete"] and prov["dry_run"] and prov["task"] == "next_token"
    assert prov["task_data"]["test_positions"] == 12
    ntp, rpt = results["continued NTP"], results["RPT + dynamic sampling"]
    assert ntp.provenance["baseline"] is True and ntp.provenance["matched_to"] == "RPT + dynamic sampling"
    assert rpt.provenance["algo"]["dynamic_sampling"] is True
    # the refills are charged: the units are rl_compute_units of the stored history (generated >= trained groups)
    trained = rpt.history.query("step > 0")
    assert (trained["generated_groups"] >= trained["trained_groups"]).all()
    units = lab.rl_compute_units(rpt.history, ntp.provenance["prompt_tokens_mean"], 2, 2)
    assert units.to_dict() == pytest.approx({int(k): v for k, v in ntp.provenance["rl_units"].items()}, rel=1e-4)
    # its base is the RPT run's base evaluation of the same seed; its final row sits at the last RL step
    assert ntp.base().equals(rpt.base())
    assert ntp.history.groupby("seed")["step"].max().tolist() == [2, 2]
    assert ntp.history.query("step == 2")["test_length"].between(1, 8).all()  # its own evaluation, not the base's
    assert prov["max_new_tokens"] == 8  # the budget the runs used (the config's, not the task's 256)
    # the held-out loss beside every accuracy: RPT's at every evaluation, the baseline's after its training
    assert rpt.history.dropna(subset=["test_accuracy"])["test_held_out_loss"].notna().all()
    assert ntp.history["test_held_out_loss"].notna().all()
    assert (ntp.history.query("step == 2")["test_held_out_loss"].to_numpy()
            != ntp.history.query("step == 0")["test_held_out_loss"].to_numpy()).all()
    # matched compute: 3 units per NTP token against the RPT run's units, within one NTP step
    for seed in (0, 1):
        units = ntp.provenance["rl_units"][str(seed)]
        tokens = ntp.history.query("seed == @seed and step == 2")["ntp_tokens"].iloc[0]
        assert abs(3 * tokens - units) <= 3 * 2 * 64 / 2 + 1e-6
    summary = experiments.summarize_runs(results, baseline="continued NTP", column="test_accuracy_sampled")
    assert list(summary["algorithm"]) == ["RPT + dynamic sampling", "continued NTP"]
    # a baseline row without rewards or gradients would fail the RL facts if it were not marked
    prov2 = json.loads(json.dumps(prov))
    prov2["runs"]["continued NTP"].pop("baseline")
    with pytest.raises(AssertionError, match="continued NTP"):
        lab.check_gpu_results(results, prov2)


def test_the_chapter_cell_describes_the_hub_run_when_absent(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GRPO_LAB_GPU_CONFIG", raising=False)
    from grpo_lab.algo.algorithms import RPT

    assert book.show_gpu_results("07_rpt", [RPT], directory=tmp_path) is None  # the chapter's profile by default
    text = " ".join(capsys.readouterr().out.split())
    assert "trains RPT on next-token reasoning" in text and "continued next-token prediction" in text
    assert "500 held-out positions" in text and "with the held-out loss" in text and "GSM8K" not in text


# ------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_run_rpt_gpu_on_cuda_builds_its_data_and_trains_in_auto_precision(hub, tmp_path):
    model, _, _ = hub
    prof = lab.rpt_gpu_profile(model, data=tmp_path / "data", device="cuda", steps=1, prompts_per_step=2,
                                       group_size=2, max_new_tokens=8, eval_every=1, environ={})
    lab.run_rpt_gpu(seeds=(0, 1), profile=prof, ntp_batch_size=2, out=tmp_path / "07_rpt.json")
    results, prov = lab.load_chapter_gpu("07_rpt", tmp_path)
    lab.check_gpu_results(results, prov)
    assert prov["dry_run"] is False and prov["precision"] in ("bfloat16", "float16")
    assert prov["task_data"]["test_positions"] == lab.RPT_GPU_TEST_SIZE  # built on the GPU, here


def test_run_rpt_gpu_refuses_bad_arguments_before_any_work(hub, tmp_path, monkeypatch):
    model, data, _ = hub
    fresh = tmp_path / "fresh"
    prof = lab.rpt_gpu_profile(model, data=fresh, device="cpu", steps=1, environ={})
    with pytest.raises(ValueError, match="ntp_batch_size"):
        lab.run_rpt_gpu(seeds=(0,), profile=prof, ntp_batch_size=0, out=tmp_path / "r.json")
    with pytest.raises(ValueError, match="run_rpt_gpu: .*seed"):
        lab.run_rpt_gpu(seeds=(), profile=prof, out=tmp_path / "r.json")
    with pytest.raises(ValueError, match="'next_token'"):
        lab.run_rpt_gpu(profile=experiments.gpu_profile(model, device="cpu", environ={}))
    for bad in ("0", "ten", "-3"):  # the dry run's test size: a positive integer, checked before any work
        monkeypatch.setenv("GRPO_LAB_RPT_TEST_SIZE", bad)
        with pytest.raises(ValueError, match=r"\$GRPO_LAB_RPT_TEST_SIZE must be a positive integer.*500"):
            lab.run_rpt_gpu(seeds=(0,), profile=prof, out=tmp_path / "r.json")
    monkeypatch.delenv("GRPO_LAB_RPT_TEST_SIZE")
    assert not fresh.exists()  # no data was built for a call that could not run
    # data files of another model (a shared $GRPO_LAB_RPT_DATA): refused, naming the variable
    other = H.write_tiny_instruct_model(tmp_path / "other", seed=1)
    prof = lab.rpt_gpu_profile(other, data=data, device="cpu", steps=1, environ={})
    with pytest.raises(ValueError, match="built for .*GRPO_LAB_RPT_DATA"):
        lab.run_rpt_gpu(seeds=(0,), profile=prof, out=tmp_path / "r.json")
    # a hub id that cannot be loaded (offline, not cached): the error names the variable for another model
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    prof = lab.rpt_gpu_profile("grpo-lab-tests/not-a-model", data=tmp_path / "d2", device="cpu", environ={})
    with pytest.raises(OSError, match="GRPO_LAB_GPU_MODEL"):
        lab.run_rpt_gpu(seeds=(0,), profile=prof, out=tmp_path / "r.json")


def test_a_bad_gpu_device_names_the_variable(monkeypatch):
    monkeypatch.delenv("GRPO_LAB_GPU_CONFIG", raising=False)
    monkeypatch.setenv("GRPO_LAB_GPU_DEVICE", "gpu")
    with pytest.raises(ValueError, match="device.*GRPO_LAB_GPU_DEVICE='gpu'"):
        lab.rpt_gpu_profile()


def test_the_chapter_profile_follows_the_chapter(monkeypatch):
    monkeypatch.delenv("GRPO_LAB_GPU_CONFIG", raising=False)
    assert lab.chapter_gpu_profile("07_rpt").task == "next_token"
    assert lab.chapter_gpu_profile("02_dapo").task == "gsm8k"


def test_run_rpt_gpu_refuses_what_would_fail_after_training(hub, tmp_path, monkeypatch):
    """Found by a fresh-user run: steps=0 crashed after the RPT runs and left an incomplete results
    file; n_jobs=0 failed inside range(); a results path under a file failed after the first seed;
    a data directory that is a file was blamed on the model."""
    model, data, _ = hub
    prof = lab.rpt_gpu_profile(model, data=data, device="cpu", steps=1, environ={})
    out = tmp_path / "07_rpt.json"
    with pytest.raises(ValueError, match="07_rpt: steps must be a positive int or None, got 0"):
        lab.run_rpt_gpu(seeds=(0,), steps=0, profile=prof, out=out)
    with pytest.raises(ValueError, match="07_rpt: n_jobs must be a positive int, got 0"):
        lab.run_rpt_gpu(seeds=(0,), n_jobs=0, profile=prof, out=out)
    with pytest.raises(ValueError, match="seeds must be integers.*0.5"):
        lab.run_rpt_gpu(seeds=(0.5,), profile=prof, out=out)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="a-file is a file, not a directory"):
        lab.run_rpt_gpu(seeds=(0,), profile=prof, out=blocker / "07_rpt.json")
    monkeypatch.setenv("GRPO_LAB_RPT_DATA", str(blocker))
    prof = lab.rpt_gpu_profile(model, device="cpu", steps=1, environ={})
    with pytest.raises(ValueError, match=r"data directory .*a-file \(\$GRPO_LAB_RPT_DATA\) is a file"):
        lab.run_rpt_gpu(seeds=(0,), profile=prof, out=out)
    assert not out.exists()


def test_one_model_directory_however_it_is_written(hub, tmp_path, monkeypatch):
    model, _, _ = hub
    monkeypatch.delenv("GRPO_LAB_RPT_DATA", raising=False)
    monkeypatch.setenv("GRPO_LAB_RESULTS_DIR", str(tmp_path))
    monkeypatch.chdir(Path(model).parent)
    names = [str(model), str(model) + "/", "./" + Path(model).name, Path(model).name]
    assert all(rpt_gpu_mod._same_model(n, model) for n in names)
    assert not rpt_gpu_mod._same_model(str(model), "Qwen/Qwen2.5-0.5B-Instruct")
    assert not rpt_gpu_mod._same_model(None, model)
    dirs = {lab.rpt_data_dir(n) for n in names}
    assert len(dirs) == 1 and not dirs.pop().name.startswith(".")  # one directory, not a hidden one


def test_the_dry_run_test_size_is_the_size_the_data_files_are_held_to(hub, tmp_path, monkeypatch):
    """$GRPO_LAB_RPT_TEST_SIZE (scripts/gpu_dryrun.sh: 16) sets the held-out positions the data files are
    built with, and data files of that size are then accepted without the by-hand warning."""
    import warnings

    from grpo_lab.lab import rpt_gpu

    model, data, _ = hub
    monkeypatch.setenv("GRPO_LAB_RPT_TEST_SIZE", "12")
    assert rpt_gpu._rpt_test_size() == 12
    prof = lab.rpt_gpu_profile(model, data=data, device="cpu", steps=1, environ={})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 12 positions, as asked: no "built by hand" warning
        assert rpt_gpu._rpt_task_data(prof, rpt_gpu._rpt_test_size())["test_positions"] == 12
    with pytest.warns(RuntimeWarning, match="hold 12 test positions, not 500"):
        rpt_gpu._rpt_task_data(prof)
    monkeypatch.delenv("GRPO_LAB_RPT_TEST_SIZE")
    assert rpt_gpu._rpt_test_size() == lab.RPT_GPU_TEST_SIZE
