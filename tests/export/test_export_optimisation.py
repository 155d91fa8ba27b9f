"""grpo_lab.export's optimisation half (schedule, AdamW, precision, budget_from_config) and version awareness;
no trl / verl needed (tests/export/xcheck/test_xcheck_optimisation.py builds the libraries' own optimiser and scheduler)."""

import warnings
from importlib import metadata

import pytest
import torch

from grpo_lab import export as E
from grpo_lab.algo.algorithms import CISPO, GRPO, GSPO
from grpo_lab.export import versions as V
from grpo_lab.training.trainer import TrainerConfig

A = "actor_rollout_ref.actor."
VERL_GRPO = GRPO.replace(adv_eps=1e-6)  # verl's hard-coded epsilon: the loss is exact, only the optimisation is tested


def verl_dict(algo=VERL_GRPO, strict=True, **budget):
    return dict(line.split("=", 1) for line in E.to_verl(algo, strict=strict, **budget))


def test_budget_from_config_carries_schedule_and_precision():
    cfg = TrainerConfig(lr=3e-6, warmup=4, lr_schedule="cosine", lr_schedule_steps=50, minibatches=2, epochs=3,
                        prompts_per_step=4, group_size=4, weight_decay=0.1, betas=(0.9, 0.95), precision="bfloat16")
    b = E.budget_from_config(cfg)
    assert {k: b[k] for k in ("lr_schedule", "lr_schedule_steps", "precision", "warmup")} == {
        "lr_schedule": "cosine", "lr_schedule_steps": 50, "precision": "bfloat16", "warmup": 4}
    kw = E.to_trl(GRPO, **b)
    # H = 50 RL steps x 3 epochs x 2 minibatches = 300 optimiser updates
    assert {k: kw[k] for k in ("lr_scheduler_type", "warmup_steps", "max_steps", "learning_rate", "adam_beta1",
                               "adam_beta2", "weight_decay", "bf16", "fp16", "max_grad_norm")} == {
        "lr_scheduler_type": "cosine", "warmup_steps": 4, "max_steps": 300, "learning_rate": 3e-6, "adam_beta1": 0.9,
        "adam_beta2": 0.95, "weight_decay": 0.1, "bf16": True, "fp16": False, "max_grad_norm": 1.0}
    assert E.horizon(E.translate(GRPO, "trl", **b).budget) == 300
    assert E.budget_from_config(TrainerConfig(precision="auto", device="cpu"))["precision"] == "float32"


@pytest.mark.parametrize("schedule,trl_name", [("constant", "constant_with_warmup"), ("linear", "linear"),
                                               ("cosine", "cosine")])
def test_trl_always_names_the_schedule(schedule, trl_name):
    assert E.to_trl(GRPO, lr_schedule=schedule, lr_schedule_steps=10)["lr_scheduler_type"] == trl_name
    assert E.to_trl(GRPO)["lr_scheduler_type"] == "constant_with_warmup"  # TRL's own default 'linear' decays to 0


def test_verl_optimisation_overrides_by_hand():
    ov = verl_dict(lr=1e-6, warmup=3, lr_schedule="cosine", lr_schedule_steps=20, betas=(0.9, 0.95), grad_clip=0.5,
                   precision="bfloat16")
    assert {k: ov[k] for k in (A + "optim.lr", A + "optim.lr_scheduler_type", A + "optim.lr_warmup_steps",
                               A + "optim.lr_warmup_steps_ratio", A + "optim.min_lr_ratio", A + "optim.num_cycles",
                               A + "optim.zero_indexed_step", A + "optim.betas", A + "optim.weight_decay",
                               A + "optim.clip_grad", "trainer.total_training_steps",
                               "++" + A + "fsdp_config.mixed_precision.param_dtype", A + "fsdp_config.model_dtype",
                               "++actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype")} == {
        A + "optim.lr": "1e-06", A + "optim.lr_scheduler_type": "cosine", A + "optim.lr_warmup_steps": "3",
        A + "optim.lr_warmup_steps_ratio": "0.0", A + "optim.min_lr_ratio": "0.0", A + "optim.num_cycles": "0.5",
        A + "optim.zero_indexed_step": "True", A + "optim.betas": "[0.9,0.95]", A + "optim.weight_decay": "0.0",
        A + "optim.clip_grad": "0.5", "trainer.total_training_steps": "20",
        "++" + A + "fsdp_config.mixed_precision.param_dtype": "bf16", A + "fsdp_config.model_dtype": "fp32",
        "++actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype": "bf16"}
    assert "warmup_style" not in " ".join(ov)  # verl's deprecated name


def test_verl_has_no_linear_schedule_and_steps_per_rl_step():
    with pytest.raises(E.ExportError, match=r"no 'linear' schedule.*\n.*Exact alternative: budget lr_schedule='cosine'"):
        E.to_verl(VERL_GRPO, lr_schedule="linear", lr_schedule_steps=10)
    with pytest.warns(E.ApproximateExportWarning, match="no 'linear' schedule"):
        assert verl_dict(strict=False, lr_schedule="linear", lr_schedule_steps=10)[A + "optim.lr_scheduler_type"] == "cosine"
    sizes = dict(prompts_per_step=4, group_size=4, minibatches=2)
    with pytest.raises(E.ExportError, match="once per RL step"):
        E.to_verl(VERL_GRPO, warmup=2, **sizes)
    assert E.translate(VERL_GRPO, "verl", **sizes).exact  # constant without warm-up: one rate, nothing to step
    assert E.translate(VERL_GRPO, "verl", warmup=2, lr_schedule="cosine", lr_schedule_steps=5).exact  # 1 update/step
    assert E.translate(GRPO, "trl", warmup=2, lr_schedule="linear", lr_schedule_steps=5, **sizes).exact


def test_weight_decay_is_exact_in_trl_and_approximate_in_verl():
    assert E.translate(GRPO, "trl", weight_decay=0.1).exact
    with pytest.raises(E.ExportError, match="decays every parameter"):
        E.to_verl(VERL_GRPO, weight_decay=0.1)


def test_precision_resolution_is_half_the_machine_epsilon():
    assert E.precision_resolution("bfloat16") == 2.0 ** -8
    assert E.precision_resolution("float16") == 2.0 ** -11
    assert E.precision_resolution("float32") == torch.finfo(torch.float32).eps / 2


@pytest.mark.parametrize("target", ["trl", "verl"])
def test_16_bit_precision_under_a_finer_clip_range_is_approximate(target):
    gspo = GSPO if target == "trl" else GSPO.replace(adv_eps=1e-6)
    with pytest.raises(E.ExportError, match=r"(?s)precision: precision='bfloat16'.*eps_low=0.0003, eps_high=0.0004"
                                            r".*Exact alternative: budget precision='float32'"):
        E.translate(gspo, target, precision="bfloat16")
    with pytest.raises(E.ExportError, match="eps_low=0.0003, eps_high=0.0004"):  # 2^-11 ~ 4.9e-4 > both
        E.translate(gspo, target, precision="float16")
    assert E.translate(gspo, target, precision="float32").exact
    grpo = GRPO if target == "trl" else VERL_GRPO
    assert E.translate(grpo, target, precision="bfloat16").exact  # 0.2 >> 2^-8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", E.ApproximateExportWarning)
        cispo = E.translate(CISPO.replace(eps_low=1.0, eps_high=0.002, adv_eps=1e-6), target, strict=False,
                            precision="bfloat16", max_new_tokens=8)
    assert [i.axis for i in cispo.issues if i.axis == "precision"] == ["precision"]


@pytest.mark.parametrize("budget,match", [
    (dict(lr_schedule="cosin"), r"lr_schedule.*cosine"),
    (dict(lr_schedule="linear"), "lr_schedule='linear' decays over a horizon: pass lr_schedule_steps"),
    (dict(lr_schedule_steps=0), "lr_schedule_steps"),
    (dict(precision="auto"), "precision='auto' depends on the device"),
    (dict(precision="fp16"), r"precision.*float16"),
])
def test_invalid_optimisation_budgets_raise(budget, match):
    for target in E.TARGETS:
        with pytest.raises(ValueError, match=match):
            E.translate(VERL_GRPO, target, **budget)


# --- versions ----------------------------------------------------------------------------------------
@pytest.fixture
def installed(monkeypatch):
    """Pretend ``{distribution: version}`` is installed (None: not installed); clears the warned-once memory."""
    versions = {}

    def fake_version(name):
        if versions.get(name) is None:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(V.metadata, "version", fake_version)
    monkeypatch.setattr(V, "_warned", set())
    return versions


def test_another_installed_version_warns_once_naming_both(installed):
    installed["trl"] = "9.9.9"
    with pytest.warns(E.LibraryVersionWarning, match=r"trl 1\.16\.0.*trl 9\.9\.9 is installed"):
        E.to_trl(GRPO)
    with warnings.catch_warnings():
        warnings.simplefilter("error", E.LibraryVersionWarning)
        E.to_trl(GRPO)  # once
        E.to_verl(VERL_GRPO)  # verl is not installed: silent
    installed["verl"] = "0.10.0"
    with pytest.warns(E.LibraryVersionWarning, match=r"verl 0\.9\.1.*verl 0\.10\.0 is installed"):
        E.to_verl(VERL_GRPO)


def test_the_verified_versions_are_silent(installed):
    installed.update(trl=E.TRL_VERSION, verl=E.VERL_VERSION)
    with warnings.catch_warnings():
        warnings.simplefilter("error", E.LibraryVersionWarning)
        E.to_trl(GRPO)
        E.to_verl(VERL_GRPO)
    assert E.check_installed("trl") == E.TRL_VERSION
    with pytest.raises(ValueError, match="unknown export target"):
        E.check_installed("deepspeed")
