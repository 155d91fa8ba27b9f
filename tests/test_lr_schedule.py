"""Tests for the policy's learning-rate schedules (:mod:`grpo_lab.training.lr_schedule`,
``TrainerConfig.lr_schedule``): against transformers' schedulers and closed forms, bit-identity of the default
with the warm-up formula used before schedules existed, the trainer's use of it, and resume."""

import math

import pytest
import torch
from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

import grpo_lab.tasks as tasks_mod
from grpo_lab.algorithms import GRPO
from grpo_lab.models import tiny_policy
from grpo_lab.trainer import Trainer, TrainerConfig
from grpo_lab.training.lr_schedule import lr_lambda, policy_lr, schedule_updates

from _toys import TINY, HalfTask


def _old_lr(lr: float, warmup: int, k: int) -> float:
    """The policy's learning rate at update k before schedules existed (grpo_lab/training/update.py, 82eb955)."""
    scale = min(1.0, (k + 1) / warmup) if warmup else 1.0
    return lr * scale if warmup else lr


@pytest.mark.parametrize("warmup", [0, 1, 3, 7])
@pytest.mark.parametrize("lr", [1e-2, 1e-6, 3.3e-4])
def test_constant_is_bit_identical_to_the_old_warm_up(lr, warmup):
    cfg = TrainerConfig(lr=lr, warmup=warmup, prompts_per_step=2, group_size=2)
    got = [policy_lr(cfg, k) for k in range(20)]
    assert got == [_old_lr(lr, warmup, k) for k in range(20)]  # == on floats: bit for bit
    # and lr_schedule_steps does not matter to the constant schedule
    assert [policy_lr(TrainerConfig(lr=lr, warmup=warmup, lr_schedule_steps=3), k) for k in range(20)] == got


def _transformers_lrs(schedule: str, lr: float, warmup: int, training_steps: int, n: int) -> list[float]:
    """The learning rates a transformers scheduler gives its steps 1..n (stepped after each optimiser step)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(()))], lr=lr)
    make = {"linear": get_linear_schedule_with_warmup, "cosine": get_cosine_schedule_with_warmup}[schedule]
    sched = make(opt, warmup, training_steps)
    out = []
    for _ in range(n):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def _closed_form(schedule: str, warmup: int, horizon: int, s: int) -> float:
    """float64 reference multiplier at position s (1-based update), horizon H, T = H + 1."""
    if s < warmup:
        return s / warmup
    t = horizon + 1
    if schedule == "linear":
        return (t - s) / (t - warmup)
    return 0.5 * (1 + math.cos(math.pi * (s - warmup) / (t - warmup)))


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 3])
@pytest.mark.parametrize("epochs, minibatches", [(1, 1), (2, 2)])
def test_decaying_schedules_follow_transformers_one_step_ahead(schedule, warmup, epochs, minibatches):
    lr, steps = 1e-3, 5
    cfg = TrainerConfig(lr=lr, warmup=warmup, lr_schedule=schedule, lr_schedule_steps=steps, epochs=epochs,
                        minibatches=minibatches, prompts_per_step=2, group_size=2)
    horizon = schedule_updates(cfg)
    assert horizon == steps * epochs * minibatches
    got = [policy_lr(cfg, k) for k in range(horizon)]
    # update k gets what transformers' scheduler of H + 1 training steps gives its step k + 1
    assert got == _transformers_lrs(schedule, lr, warmup, horizon + 1, horizon)
    assert got == pytest.approx([lr * _closed_form(schedule, warmup, horizon, k + 1) for k in range(horizon)],
                                rel=1e-12)
    assert got[0] > 0 and got[-1] > 0  # neither the first nor the last update is wasted at lr 0
    if warmup:  # the peak lr at the warmup-th update, as with the constant schedule
        assert max(got) == pytest.approx(lr) and got.index(max(got)) == warmup - 1
    else:  # no warm-up: the first update is already one position into the decay
        assert got[0] == max(got) < lr
    assert all(a >= b for a, b in zip(got[max(warmup - 1, 0):], got[max(warmup, 1):]))  # decays after the peak
    # past the horizon (a longer or continued run) the last value is kept
    assert [policy_lr(cfg, k) for k in range(horizon, horizon + 3)] == [got[-1]] * 3


def test_linear_by_hand():
    # H = 4 updates, T = 5: update k gets lr (5 - (k + 1)) / 5
    cfg = TrainerConfig(lr=1.0, lr_schedule="linear", lr_schedule_steps=2, minibatches=2, prompts_per_step=2,
                        group_size=2)
    assert [policy_lr(cfg, k) for k in range(4)] == pytest.approx([0.8, 0.6, 0.4, 0.2])


def test_bad_schedules_are_one_clear_error():
    with pytest.raises(ValueError, match="lr_schedule 'cosin'.*'cosine'"):
        TrainerConfig(lr_schedule="cosin")
    with pytest.raises(ValueError, match="lr_schedule_steps"):
        TrainerConfig(lr_schedule="linear", lr_schedule_steps=0)
    with pytest.raises(ValueError, match="needs lr_schedule_steps"):
        policy_lr(TrainerConfig(lr_schedule="cosine"), 0)
    with pytest.raises(ValueError, match="unknown lr_schedule"):
        lr_lambda("step", 0, 10)


def _trainer(tok, **kw):
    cfg = dict(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False, lr=1e-2, seed=0,
               minibatches=2)
    cfg.update(kw)
    return Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), GRPO, TrainerConfig(**cfg))


def _record_lrs(trainer) -> list:
    seen, orig = [], trainer.optimizer.step

    def step(*a, **k):
        seen.append(trainer.optimizer.param_groups[0]["lr"])
        return orig(*a, **k)

    trainer.optimizer.step = step
    return seen


def test_the_trainer_uses_the_schedule_and_a_resume_continues_it(tok, tmp_path, monkeypatch):
    monkeypatch.setitem(tasks_mod.TASKS, "half", HalfTask)
    with pytest.raises(ValueError, match="lr_schedule='cosine' needs lr_schedule_steps"):
        _trainer(tok, lr_schedule="cosine")
    kw = dict(lr_schedule="cosine", lr_schedule_steps=3, warmup=2)
    straight = _trainer(tok, **kw)
    seen = _record_lrs(straight)
    straight.train(3)
    assert seen == [policy_lr(straight.config, k) for k in range(6)]
    # the history's lr column: the rate of each step's last update (two updates per step here)
    assert straight.history["lr"].tolist() == [seen[1], seen[3], seen[5]]
    first = _trainer(tok, **kw)
    first.train(1)
    first.save(tmp_path)
    resumed = Trainer.resume(tmp_path)
    rest = _record_lrs(resumed)
    resumed.train(2)
    assert rest == seen[2:]  # the schedule's position (opt_steps) travels with the checkpoint
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)
