"""Tests for the policy's learning-rate schedules (:mod:`grpo_lab.training.lr_schedule`,
``TrainerConfig.lr_schedule``): equal to transformers' schedulers bit for bit and to float64 closed forms (transformers' convention: update k gets the multiplier at k, as TRL and verl), the trainer's use of
it, and resume."""

import math

import pytest
import torch
from transformers import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                          get_linear_schedule_with_warmup)

import grpo_lab.tasks as tasks_mod
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.policy.models import tiny_policy
from grpo_lab.training.trainer import Trainer, TrainerConfig
from grpo_lab.training.lr_schedule import lr_lambda, policy_lr, schedule_updates

from _toys import TINY, HalfTask


def _transformers_lrs(schedule: str, lr: float, warmup: int, training_steps: int, n: int) -> list[float]:
    """The learning rates a transformers scheduler gives optimiser steps 0..n-1: the rate in the optimiser when
    each ``step()`` runs, the scheduler stepped after it (transformers' Trainer and TRL's GRPOTrainer)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(()))], lr=lr)
    make = {"linear": get_linear_schedule_with_warmup, "cosine": get_cosine_schedule_with_warmup,
            "constant": lambda o, w, _: get_constant_schedule_with_warmup(o, w)}[schedule]
    sched = make(opt, warmup, training_steps)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def _closed_form(schedule: str, warmup: int, horizon: int, k: int) -> float:
    """float64 reference multiplier of update k (0-based) over a horizon of H updates, written from the
    definitions (linear warm-up k / W, then linear decay to 0 at H or half a cosine)."""
    if k < warmup:
        return k / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return (horizon - k) / (horizon - warmup)
    return 0.5 * (1 + math.cos(math.pi * (k - warmup) / (horizon - warmup)))


@pytest.mark.parametrize("warmup", [0, 1, 3, 7])
@pytest.mark.parametrize("lr", [1e-2, 1e-6, 3.3e-4])
def test_constant_equals_transformers_constant_with_warmup(lr, warmup):
    cfg = TrainerConfig(lr=lr, warmup=warmup, prompts_per_step=2, group_size=2)
    got = [policy_lr(cfg, k) for k in range(20)]
    assert got == _transformers_lrs("constant", lr, warmup, None, 20)  # == on floats: bit for bit
    assert got == pytest.approx([lr * _closed_form("constant", warmup, 20, k) for k in range(20)], rel=1e-12)
    if warmup:  # transformers' (and TRL's, verl's) convention: the first update of a warm-up at 0, full lr at W
        assert got[0] == 0.0 and got[warmup] == lr and got[warmup - 1] < lr
    # and lr_schedule_steps does not matter to the constant schedule
    assert [policy_lr(TrainerConfig(lr=lr, warmup=warmup, lr_schedule_steps=3), k) for k in range(20)] == got


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 3])
@pytest.mark.parametrize("epochs, minibatches", [(1, 1), (2, 2)])
def test_decaying_schedules_equal_transformers(schedule, warmup, epochs, minibatches):
    lr, steps = 1e-3, 5
    cfg = TrainerConfig(lr=lr, warmup=warmup, lr_schedule=schedule, lr_schedule_steps=steps, epochs=epochs,
                        minibatches=minibatches, prompts_per_step=2, group_size=2)
    horizon = schedule_updates(cfg)
    assert horizon == steps * epochs * minibatches
    got = [policy_lr(cfg, k) for k in range(horizon)]
    # update k gets what transformers' scheduler of H training steps gives its step k, bit for bit
    assert got == _transformers_lrs(schedule, lr, warmup, horizon, horizon)
    assert got == pytest.approx([lr * _closed_form(schedule, warmup, horizon, k) for k in range(horizon)],
                                rel=1e-12, abs=1e-18)
    assert got[-1] > 0  # the last update is not at 0
    if warmup:  # the first update at 0, the peak lr at update W
        assert got[0] == 0.0 and max(got) == pytest.approx(lr) and got.index(max(got)) == warmup
    else:  # no warm-up: the first update at the full rate
        assert got[0] == lr
    assert all(a >= b for a, b in zip(got[warmup:], got[warmup + 1:]))  # decays after the peak
    # past the horizon (a longer or continued run) the last value is kept
    assert [policy_lr(cfg, k) for k in range(horizon, horizon + 3)] == [got[-1]] * 3


def test_linear_by_hand():
    # H = 4 updates, no warm-up: update k gets lr (4 - k) / 4
    cfg = TrainerConfig(lr=1.0, lr_schedule="linear", lr_schedule_steps=2, minibatches=2, prompts_per_step=2,
                        group_size=2)
    assert [policy_lr(cfg, k) for k in range(4)] == pytest.approx([1.0, 0.75, 0.5, 0.25])
    # with a warm-up of 2: 0, 1/2, then (4 - k) / (4 - 2)
    cfg = TrainerConfig(lr=1.0, lr_schedule="linear", lr_schedule_steps=2, minibatches=2, prompts_per_step=2,
                        group_size=2, warmup=2)
    assert [policy_lr(cfg, k) for k in range(4)] == pytest.approx([0.0, 0.5, 1.0, 0.5])


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
