"""The float16 + GradScaler path a T4 takes (``precision="float16"``), on CPU: a step whose scaled gradients
overflow is skipped (weights and AdamW state untouched, ``amp.skipped_steps`` + 1), the scale halves
(``torch.amp.GradScaler``'s backoff_factor 0.5), and the next finite step trains (goldens: GradScaler's documented
defaults, init_scale 2**16, backoff 0.5, growth every 2000 steps)."""

from types import SimpleNamespace

import torch

from grpo_lab.training.precision import Precision
from grpo_lab.training.trainer import TrainerConfig
from grpo_lab.training.update import optimizer_step


def _learner():
    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 1)
    config = TrainerConfig(prompts_per_step=2, group_size=2, lr=1e-2, warmup=0, precision="float16", device="cpu")
    return SimpleNamespace(config=config, amp=Precision("float16", "cpu"), policy=policy, value_optimizer=None,
                           optimizer=torch.optim.AdamW(policy.parameters(), lr=1e-2), algo=None, step=0)


def _backward(learner):
    x = torch.ones(3, 4)
    with learner.amp.autocast():
        loss = learner.policy(x).float().pow(2).mean()
    learner.amp.backward(loss)


def test_an_overflowing_float16_step_is_skipped_the_scale_halves_and_training_continues():
    learner = _learner()
    scaler = learner.amp.scaler
    assert scaler.is_enabled() and scaler.get_scale() == 2.0**16
    before = [p.detach().clone() for p in learner.policy.parameters()]
    _backward(learner)
    learner.policy.weight.grad[0, 0] = float("inf")  # an overflow in the scaled gradients
    gn, taken = optimizer_step(learner, 1)
    assert not taken and gn != gn  # NaN: no norm for a skipped step
    assert learner.amp.skipped_steps == 1 and scaler.get_scale() == 2.0**15
    assert all(torch.equal(b, p) for b, p in zip(before, learner.policy.parameters()))
    assert not learner.optimizer.state  # AdamW never stepped: no moments
    learner.optimizer.zero_grad(set_to_none=True)
    _backward(learner)
    gn, taken = optimizer_step(learner, 2)
    assert taken and gn == gn and gn > 0
    assert learner.amp.skipped_steps == 1 and scaler.get_scale() == 2.0**15  # no growth before 2000 good steps
    assert not all(torch.equal(b, p) for b, p in zip(before, learner.policy.parameters()))
