"""The ``"colab"`` profile (a free T4): the memory model predicts that every chapter's variant fits 16 GB in
float16 with headroom, the speed model that each chapter's GPU cell takes at most 30 minutes set-up included;
a chapter asks for Drive before writing to the VM's disk; results and checkpoints written to a directory
standing in for Drive survive the VM and resume there."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from grpo_lab import experiments, lab
from grpo_lab.algo.algorithms import CISPO, DAPO, DR_GRPO, GRPO, GSPO, VAPO
from grpo_lab.experiments.memory_fit import _shape
from grpo_lab.experiments.memory_model import QWEN25_05B_CONFIG, fit_batch_sizes, predict_memory
from grpo_lab.algo.advantages import VALUE_BASELINE_ESTIMATORS
from grpo_lab.training.trainer import MEASURED_COLUMNS, Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _toys import tiny_profile  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::grpo_lab.training.learning_signal.NoLearningSignalWarning",
                                        "ignore::RuntimeWarning")

# (chapter, algorithms, colab_profile kwargs, steps, generation_factor, train_factor): the colab branch of each
# chapter's GPU cell (book/_py/*.py) and the factors its show_gpu_results call prices it with
CHAPTERS = [
    ("01_grpo", [GRPO], {}, None, 1.0, 1.0),
    ("02_dapo", [GRPO, DAPO], {}, None, 1.0, 1.0),
    ("03_dr_grpo", [GRPO, DR_GRPO], {}, None, 1.0, 1.0),
    ("04_gspo", [GRPO.replace(name="GRPO-noKL", beta=0.0, kl=None), GSPO], {"minibatches": 4}, None, 1.0, 1.0),
    ("05_cispo", [DAPO, CISPO], {"minibatches": 8}, None, 1.3, 1.0),
    ("06_vapo", [DAPO, VAPO, VAPO.replace(name="VAPO-G", advantage="group")], {"minibatches": 8}, 15, 1.3, 2.0),
    ("08_choosing", [GRPO, DAPO, VAPO], {}, 15, 1.3, 1.5),
]


@pytest.mark.parametrize("chapter, algos, kwargs, steps, gen, train", CHAPTERS, ids=[c[0] for c in CHAPTERS])
def test_each_chapters_colab_variant_fits_a_t4_in_float16_and_30_minutes(chapter, algos, kwargs, steps, gen, train):
    prof = experiments.colab_profile(**kwargs)
    assert prof.name == "colab" and prof.lora is not None and experiments.COLAB_SEEDS == (0,)
    config = dataclasses.replace(prof.config, precision="float16")  # "auto" on a T4 (compute capability 7.5)
    for algo in algos:
        critic = algo.advantage in VALUE_BASELINE_ESTIMATORS
        shape = _shape(config, 256, kl_reference=False, critic=critic, lora=prof.lora)  # LoRA: the base is the reference
        micro, ev = fit_batch_sizes(QWEN25_05B_CONFIG, shape, experiments.COLAB_T4_MEMORY, max_micro=shape.rows)
        peak = predict_memory(QWEN25_05B_CONFIG, dataclasses.replace(shape, micro_batch_size=micro,
                                                                     eval_batch_size=ev)).peak
        # headroom: at most 80% of the card (fit_batch_sizes keeps 1 GiB + 10% for CUDA's context and fragments)
        assert peak <= 0.8 * experiments.COLAB_T4_MEMORY, (chapter, algo.name, peak / 2**30)
    minutes = experiments.colab_minutes(prof, len(algos) * len(experiments.COLAB_SEEDS), steps=steps,
                                        generation_factor=gen, train_factor=train)
    assert experiments.COLAB_SETUP_MINUTES < minutes <= 30, (chapter, minutes)


def test_the_announcement_gives_the_predicted_time_and_a_look_not_a_claim(capsys):
    prof = experiments.colab_profile()
    line = lab.announce_gpu_runs("02_dapo", prof, 2, 1, None)
    want = experiments.colab_minutes(prof, 2)
    assert f"about {want:.0f} min on Colab's T4" in line and "a look, not a claim" in line
    assert capsys.readouterr().out.strip() == line
    five = lab.announce_gpu_runs("02_dapo", experiments.PROFILES["gpu"], 2, 5, None)
    assert "a look, not a claim" not in five and "on an H100" in five


def test_on_colab_the_vm_disk_is_refused_until_results_dir_is_set(tmp_path):
    vm = Path("/content/grpo_lab/data/results/gpu/01_grpo.json")
    with pytest.raises(RuntimeError, match=r"drive\.mount.*GRPO_LAB_RESULTS_DIR"):
        lab.check_results_location(vm, environ={}, on_colab=True)
    lab.check_results_location(vm, environ={"GRPO_LAB_RESULTS_DIR": "/content/x"}, on_colab=True)  # chosen
    lab.check_results_location(Path("/content/drive/MyDrive/r/01.json"), environ={}, on_colab=True)
    lab.check_results_location(vm, environ={}, on_colab=False)  # not Colab: nothing to ask


class _Recycled(Exception):
    """The VM going away right after a checkpoint."""


def test_results_and_checkpoints_on_drive_survive_a_recycled_vm(tmp_path, monkeypatch):
    drive, vm = tmp_path / "drive", tmp_path / "content"
    vm.mkdir()
    monkeypatch.chdir(vm)
    monkeypatch.setenv("GRPO_LAB_RESULTS_DIR", str(drive / "results"))
    monkeypatch.setenv("GRPO_LAB_RUN_CACHE", "off")
    prof = tiny_profile(vm / "base", steps=4, eval_every=2)  # the base lives on the VM: downloaded again
    reference = lab.run_chapter_gpu("99_colab", ["GRPO"], seeds=(0,), profile=prof, out=tmp_path / "ref.json",
                                    progress=False)["GRPO"].history
    save = Trainer._periodic_save

    def save_then_die(self, final=False):
        out = save(self, final)
        if self.step == 2:
            raise _Recycled
        return out

    monkeypatch.setattr(Trainer, "_periodic_save", save_then_die)
    with pytest.raises(_Recycled):
        lab.run_chapter_gpu("99_colab", ["GRPO"], seeds=(0,), profile=prof, save_every=1, progress=False)
    monkeypatch.setattr(Trainer, "_periodic_save", save)
    assert list((drive / "results").rglob("step-000002/state.json")), "no checkpoint on Drive"
    shutil.rmtree(vm)  # Colab recycles the VM: /content is gone, Drive is not
    prof = tiny_profile(_mkdir(vm) / "base", steps=4, eval_every=2)  # the same base, downloaded again
    resumed = lab.run_chapter_gpu("99_colab", ["GRPO"], seeds=(0,), profile=prof, save_every=1,
                                  progress=False)["GRPO"].history
    results, prov = lab.load_chapter_gpu("99_colab", drive / "results")
    assert prov["complete"] is True and prov["seeds"] == [0]
    keep = [c for c in reference if c not in MEASURED_COLUMNS]
    pd.testing.assert_frame_equal(resumed[keep].reset_index(drop=True), reference[keep].reset_index(drop=True))


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _first_steps_module():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_first_steps.py"
    spec = importlib.util.spec_from_file_location("gpu_first_steps", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_first_steps_table_is_the_results_files(tmp_path):
    fs = _first_steps_module()
    results = json.loads(fs.RESULTS.read_text()) if fs.RESULTS.is_file() else None
    text = fs.README.read_text(encoding="utf-8")
    block = text.split("<!-- gpu-first-steps:start -->\n")[1].split("\n<!-- gpu-first-steps:end -->")[0]
    assert block == fs.table(results), "run `python benchmarks/gpu_first_steps.py --write-table`"
    if results is None:
        assert "predicted, not measured" in block
    fake = {"provenance": {"device_name": "Tesla T4", "date": "2027-01-01T00:00:00", "git_sha": "abc", "torch": "2.x",
                           "transformers": "5.x"},
            "runs": [{"profile": "colab", "precision": "float16", "predicted": {"peak_mib": 9000.0},
                      "steps": [{"step_seconds": 10.0, "generation_tokens_per_s": 900.0, "peak_mem_mib": 8000.0,
                                 "amp_skipped_steps": 0},
                                {"step_seconds": 20.0, "generation_tokens_per_s": 1100.0, "peak_mem_mib": 8500.0,
                                 "amp_skipped_steps": 1}]}]}
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- gpu-first-steps:start -->\nold\n<!-- gpu-first-steps:end -->\nb\n")
    (tmp_path / "r.json").write_text(json.dumps(fake))
    fs.write_table(tmp_path / "r.json", readme)
    assert "| `colab` | float16 | 15.0 | 1000 | 8500 | 9000 | 1 |" in readme.read_text()  # means by hand
    assert "Tesla T4" in readme.read_text() and "old" not in readme.read_text()
