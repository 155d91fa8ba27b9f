"""The "group_token_mean" aggregation: DAPO Eq. 12 as written (a token mean per group, then the
mean over groups), against "token_mean" (the whole batch's token count, as verl and TRL compute it)."""

import numpy as np
import pytest
import torch

from grpo_lab.algo.algorithms import DAPO, GRPO
from grpo_lab.algo.objectives import aggregate, policy_loss
from grpo_lab.training.trainer import Trainer, TrainerConfig
from grpo_lab.training.update import group_token_counts


def _batch():
    # two groups of two rows; real lengths 1, 3 | 2, 1: group token totals 4 and 3
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float64)
    values = torch.tensor([[2.0, 9.0, 9.0], [1.0, 1.0, 1.0], [4.0, 2.0, 9.0], [6.0, 9.0, 9.0]], dtype=torch.float64)
    return values, mask


def test_hand_golden_and_difference_to_token_mean():
    values, mask = _batch()
    # hand: group 0 has tokens 1 + 3 = 4, sum 2 + 3 = 5 -> 5/4; group 1 has tokens 2 + 1 = 3,
    # sum 6 + 6 = 12 -> 4; mean over the 2 groups = (1.25 + 4) / 2 = 2.625
    got = aggregate(values, mask, "group_token_mean", group_size=2)
    assert float(got) == pytest.approx(2.625, abs=1e-12)
    # token_mean divides the whole sum (17) by all 7 tokens: 17/7, a different weighting
    assert float(aggregate(values, mask, "token_mean")) == pytest.approx(17 / 7, abs=1e-12)


def test_equals_token_mean_for_one_group_or_equal_group_totals():
    values, mask = _batch()
    assert torch.allclose(aggregate(values, mask, "group_token_mean", group_size=4),
                          aggregate(values, mask, "token_mean"))
    eq_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=torch.float64)  # 5 and 5 tokens
    assert torch.allclose(aggregate(values, eq_mask, "group_token_mean", group_size=2),
                          aggregate(values, eq_mask, "token_mean"))


def test_gradient_weights_tokens_by_their_groups_size():
    values, mask = _batch()
    v = values.clone().requires_grad_()
    aggregate(v, mask, "group_token_mean", group_size=2).backward()
    # hand: d/dv_it = m_it / (T_g * N_groups): group 0 -> 1/8, group 1 -> 1/6
    expected = mask * torch.tensor([1 / 8, 1 / 8, 1 / 6, 1 / 6], dtype=torch.float64)[:, None]
    assert torch.allclose(v.grad, expected, atol=1e-15)


def test_micro_batches_with_global_group_counts_add_up():
    torch.manual_seed(0)
    B, T, G = 12, 5, 4
    mask = (torch.rand(B, T) < 0.7).double()
    mask[:, 0] = 1
    mask[5] = 0  # an empty row inside a group
    logp = (-torch.rand(B, T, dtype=torch.float64)).requires_grad_()
    old = (logp.detach() + 0.3 * torch.randn(B, T, dtype=torch.float64)).clamp(max=0)
    adv = torch.randn(B, dtype=torch.float64)
    algo = DAPO.replace(aggregation="group_token_mean", dynamic_sampling=False, overlong_cache_frac=None)
    full = policy_loss(logp, old, adv, mask, algo, group_size=G)
    (g_full,) = torch.autograd.grad(full.loss, logp)
    per_group = mask.sum(-1).view(-1, G).sum(-1)
    group_tokens = per_group.repeat_interleave(G)
    n_groups = float((per_group > 0).sum())
    rows = torch.randperm(B)  # micro-batches that split groups
    total, g_sum = 0.0, torch.zeros_like(logp)
    for part in (rows[:5], rows[5:]):
        lp = logp.detach()[part].clone().requires_grad_()
        out = policy_loss(lp, old[part], adv[part], mask[part], algo, group_tokens=group_tokens[part],
                          num_groups=n_groups)
        (g,) = torch.autograd.grad(out.loss, lp)
        total += float(out.loss.detach())
        g_sum[part] = g
    assert total == pytest.approx(float(full.loss.detach()), abs=1e-12)
    assert torch.allclose(g_sum, g_full, atol=1e-14)


@pytest.mark.parametrize("kwargs, match", [
    ({}, "group structure"),
    (dict(group_size=3), "does not divide"),
    (dict(group_size=2, num_groups=2.0, group_tokens=torch.ones(4)), "either group_size"),
    (dict(group_tokens=torch.full((4,), 9.0)), "go together"),
    (dict(group_tokens=torch.full((3,), 9.0), num_groups=2), "shape"),
    (dict(group_tokens=torch.tensor([4.0, 2.0, 3.0, 3.0]), num_groups=2), "at least each row"),
    (dict(group_tokens=torch.full((4,), 9.0), num_groups=0), "num_groups"),
    # the rows hold 1/4 + 3/4 + 2/3 + 1/3 = 2 groups' worth of tokens: one group is impossible (by hand)
    (dict(group_tokens=torch.tensor([4.0, 4.0, 3.0, 3.0]), num_groups=1), "below the 2 groups"),
])
def test_bad_group_structure_is_a_clear_error(kwargs, match):
    values, mask = _batch()
    with pytest.raises(ValueError, match=match):
        aggregate(values, mask, "group_token_mean", **kwargs)


def test_trainer_group_tokens_per_minibatch():
    lm = torch.tensor([[1, 1], [1, 0], [1, 1], [0, 0], [1, 0], [1, 1]], dtype=torch.float32)
    idx = torch.tensor([5, 0, 3, 2])  # group 2 (row 5 of 4, 5), group 0 (row 0 of 0, 1), group 1 (rows 3 and 2)
    counts = {}
    out = group_token_counts(lm, idx, counts, group_size=2)
    # hand: each row gets its WHOLE group's count, even where the minibatch holds a fragment (DAPO Eq. 12 divides
    # by sum_i |o_i| over the group): group 0 = 2 + 1, group 1 = 2 + 0, group 2 = 1 + 2; 0 outside the minibatch
    assert out.tolist() == [3.0, 0.0, 2.0, 2.0, 0.0, 3.0] and counts["num_groups"] == 3.0
    with pytest.raises(ValueError, match="group_size=4 does not divide the rollout's 6 rows"):
        group_token_counts(lm, idx, {}, group_size=4)


def test_trainer_trains_with_group_token_mean():
    from grpo_lab.policy.models import load_policy
    from grpo_lab.tasks import get_task

    policy, tok = load_policy("arithmetic-base")
    algo = GRPO.replace(name="group", kl=None, beta=0.0, aggregation="group_token_mean")
    cfg = TrainerConfig(prompts_per_step=4, group_size=4, minibatches=2, micro_batch_size=3, eval_every=0,
                        threads=1, seed=0)
    h = Trainer(policy, tok, get_task("arithmetic"), algo, cfg).train(1)
    assert np.isfinite(h["loss"].iloc[-1]) and np.isfinite(h["grad_norm"].iloc[-1])
