"""The extension points work from outside the package: a new surrogate, a new advantage estimator
and a value model are defined in this file, registered, and trained with the unchanged Trainer.

No package file is edited: each new choice is one function and one registry line, and the
algorithm that uses it is one ``Algorithm`` value.
"""

import pandas as pd
import pytest
import torch

import grpo_lab.tasks as tasks_mod
from grpo_lab.algo.advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch
from grpo_lab.algo.algorithms import GRPO, Algorithm
from grpo_lab.policy.models import tiny_policy
from grpo_lab.algo.objectives import SURROGATES, policy_loss
from grpo_lab.training.trainer import Trainer, TrainerConfig

from _toys import TINY, HalfTask

TIMING = ["tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb"]


# ---- a toy surrogate: plain REINFORCE with the ratio, -r * A, no trust region ---------------------
def reinforce_surrogate(ctx):
    ratio = torch.exp(ctx.log_ratio)
    per_token = -ratio * ctx.advantages
    none = torch.zeros_like(ctx.mask)
    return per_token, {"clip_low": none, "clip_high": none, "grad": ctx.mask & (ctx.advantages != 0)}


# ---- a toy advantage estimator: the sign of the centred reward ------------------------------------
def sign_advantages(batch: AdvantageBatch):
    r = batch.rewards.view(-1, batch.group_size)
    return torch.sign(r - r.mean(1, keepdim=True)).flatten().float()


# ---- a toy critic and an estimator that uses its values -------------------------------------------
class TokenValue(torch.nn.Module):
    """V(s_t) from the completion token id alone: an embedding table with one number per token."""

    def __init__(self, vocab: int):
        super().__init__()
        self.v = torch.nn.Embedding(vocab, 1)
        torch.nn.init.zeros_(self.v.weight)

    def values(self, rollout):
        return self.v(rollout.completion_ids).squeeze(-1)


def reward_minus_value(batch: AdvantageBatch):
    return (batch.rewards[:, None] - batch.values) * batch.mask


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(SURROGATES, "reinforce", reinforce_surrogate)
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "sign", sign_advantages)
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "reward_minus_value", reward_minus_value)
    monkeypatch.setitem(tasks_mod.TASKS, "half", HalfTask)


def make(tok, algo, value_model=None, **kw):
    cfg = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False,
                        lr=1e-2, seed=0, **kw)
    return Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), algo, cfg, value_model=value_model)


def test_unregistered_choice_is_refused():
    with pytest.raises(ValueError, match="reinforce"):
        GRPO.replace(surrogate="reinforce")


def test_outside_surrogate_and_estimator_train(tok, registered):
    algo = GRPO.replace(name="sign-REINFORCE", advantage="sign", surrogate="reinforce", kl=None, beta=0.0)
    assert isinstance(algo, Algorithm)
    # the loss is what the toy functions say: -mean_i mean_t r_it A_i, with r = 1 on-policy
    logp = torch.log(torch.full((4, 3), 0.5)).requires_grad_()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    adv = algo.estimate_advantages(AdvantageBatch.from_groups(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4))
    assert adv.tolist() == [1.0, -1.0, -1.0, 1.0]
    out = policy_loss(logp, logp.detach(), adv, mask, algo)
    assert out.loss.item() == pytest.approx(-(1 - 1 - 1 + 1) / 4)
    assert out.metrics["clip_frac"] == 0.0 and out.metrics["grad_token_frac"] == 1.0

    tr = make(tok, algo, minibatches=2)
    w0 = [p.detach().clone() for p in tr.policy.parameters()]
    h = tr.train(2)
    assert list(h["step"]) == [1, 2]
    assert h["clip_frac"].eq(0.0).all()  # the toy surrogate clips nothing, even off-policy
    assert h["adv_abs_mean"].between(0.0, 1.0).all()  # |sign| is 0 or 1 per token
    assert any(not torch.equal(a, b) for a, b in zip(w0, tr.policy.parameters()))


def test_value_model_slot_trains_saves_and_resumes(tok, registered, tmp_path):
    algo = GRPO.replace(name="critic", advantage="reward_minus_value", kl=None, beta=0.0)
    straight = make(tok, algo, value_model=TokenValue(len(tok)), minibatches=2, value_lr=0.1)
    straight.train(4)
    assert "value_loss" in straight.history and straight.history["value_loss"].gt(0).all()
    assert straight.value_model.v.weight.abs().sum() > 0  # the critic learned from its own optimiser

    first = make(tok, algo, value_model=TokenValue(len(tok)), minibatches=2, value_lr=0.1)
    first.train(2)
    first.save(tmp_path)
    assert (tmp_path / "value.safetensors").is_file() and (tmp_path / "value_optimizer.pt").is_file()
    with pytest.raises(ValueError, match="value_model"):
        Trainer.resume(tmp_path)
    resumed = Trainer.resume(tmp_path, value_model=TokenValue(len(tok)))
    resumed.train(2)
    assert torch.equal(straight.value_model.v.weight, resumed.value_model.v.weight)
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)
    pd.testing.assert_frame_equal(straight.history.drop(columns=TIMING, errors="ignore"), resumed.history.drop(columns=TIMING, errors="ignore"),
                                  check_exact=True, check_dtype=False)
