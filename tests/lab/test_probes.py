"""lab.pretrain_critic and update_probe: VAPO §4.1's value pretraining as a seeded run a worker process can do
(chapter 6 §6.7 compares two critic designs over five seeds with it)."""

import pickle
from functools import partial

import pandas as pd
import torch
import pytest

from _toys import TINY, tiny_profile
from grpo_lab import experiments, lab
from grpo_lab.algo.algorithms import GRPO, VAPO
from grpo_lab.policy.models import load_policy
from grpo_lab.tasks import get_task
from grpo_lab.training.trainer import Trainer


@pytest.fixture(scope="module")
def prof(tmp_path_factory):
    return tiny_profile(tmp_path_factory.mktemp("base"), steps=1, eval_every=0)


def test_it_is_the_trainers_own_pretraining_with_the_seed_and_design_added(prof, tmp_path):
    history = lab.pretrain_critic((1, "policy", str(tmp_path / "critic")), algo=VAPO, profile=prof, steps=2,
                                          value_lr=1e-3)
    # the same numbers as Trainer.pretrain_value built by hand with that seed and design
    import dataclasses

    policy, tok = load_policy(prof.base)
    cfg = dataclasses.replace(prof.config, seed=1, value_init="policy", value_lr=1e-3, eval_every=0, progress=False)
    by_hand = Trainer(policy, tok, get_task(prof.task, **dict(prof.task_kwargs)), VAPO, cfg).pretrain_value(2)
    columns = ["value_step", "value_loss", "explained_variance", "value_mean", "return_mean"]
    pd.testing.assert_frame_equal(history[columns], by_hand[columns])
    assert (history["seed"] == 1).all() and (history["init"] == "policy").all()
    # a copy of the backbone plus a scalar head (weight and bias): the policy's parameters + hidden + 1
    assert (history["value_parameters"] == history["policy_parameters"] + TINY.hidden_size + 1).all()
    assert (tmp_path / "critic").is_dir() and any((tmp_path / "critic").iterdir())  # saved for value_init=path
    reused = dataclasses.replace(cfg, value_init=str(tmp_path / "critic"))
    Trainer(*load_policy(prof.base), get_task(prof.task, **dict(prof.task_kwargs)), VAPO, reused)  # loads


def test_a_worker_can_receive_it_and_a_critic_free_algorithm_is_refused(prof):
    pickle.dumps(partial(lab.pretrain_critic, algo=VAPO, profile=prof, steps=1, value_lr=1e-3))
    with pytest.raises(ValueError, match="no value model"):
        lab.pretrain_critic((0, "policy", None), algo=GRPO, profile=prof, steps=1, value_lr=1e-3)
    scratch = lab.pretrain_critic((0, "scratch", None), algo=VAPO, profile=prof, steps=1, value_lr=1e-3)
    assert scratch["init"].tolist() == ["scratch"] and len(scratch) == 1


def test_update_probe_returns_the_log_ratios_of_the_trainers_own_update(prof):
    out = lab.update_probe(0, algo=GRPO, profile=prof, prompts_per_step=2, minibatches=2)
    log_r, mask, adv = out["log_ratio"], out["mask"], out["advantages"]
    B = 2 * prof.config.group_size
    assert log_r.shape[0] == B and mask.shape == log_r.shape and adv.shape == (B,)
    assert log_r.dtype == torch.float64 and mask.dtype == torch.bool
    assert (log_r[~mask] == 0).all() and torch.isfinite(log_r).all()
    # the same numbers as the trainer's stages run by hand with that seed: collect, advantages, update
    import dataclasses

    from grpo_lab.policy.rollout import policy_logprobs

    cfg = dataclasses.replace(prof.config, seed=0, prompts_per_step=2, minibatches=2, eval_every=0, progress=False)
    tr = Trainer(*load_policy(prof.base), get_task(prof.task, **dict(prof.task_kwargs)), GRPO, cfg)
    batch = tr.collect()
    tr.compute_advantages(batch)
    with torch.no_grad():
        before = policy_logprobs(tr.policy, batch.rollout).double()
    tr.update(batch)
    with torch.no_grad():
        after = policy_logprobs(tr.policy, batch.rollout).double()
    torch.testing.assert_close(log_r[mask], (after - before)[mask], rtol=0, atol=0)
    if (adv != 0).any():  # an update with signal moves the policy
        assert log_r[mask].abs().max() > 0
