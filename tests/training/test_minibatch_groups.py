"""Minibatches hold whole prompt groups (issue 52). DAPO's Eq. 12 and MiniMax-M1's Eq. 4 divide each group's
token sum by that group's total length Σ_i |o_i|; a minibatch holding a fragment of a group would normalise
the fragment by its own length (a row alone in its minibatch by |o_i|: GRPO's length bias). The trainer
shuffles groups, not rows, so every response's per-token weight is 1 / (Σ_{i in group} |o_i| · N_groups)
whatever the shuffle seed, the number of minibatches and ``micro_batch_size``."""

import pytest
import torch

from _toys import TINY, HalfTask
from grpo_lab.algo.algorithms import CISPO, DAPO
from grpo_lab.policy.models import tiny_policy
from grpo_lab.training import update
from grpo_lab.training.trainer import Trainer, TrainerConfig
from grpo_lab.training.update import _group_orders


def _token_weights(tok, monkeypatch, algo, *, seed, minibatches, micro):
    """Per optimiser step, the rows it trained and each row's per-token weight -dL/dlogp / (A · r) (the
    derivative of the surrogate at a token that is not clipped is -A·r for DAPO and -A·clip(r) for CISPO;
    at lr 1e-12 every ratio is 1 to 1e-9 and no clip acts), and the rollout's loss mask."""
    steps, current = [], {}
    original = update._policy_term

    def policy_term(run, mb, sub, *args):
        if not steps or steps[-1]["mb"] is not mb:
            steps.append({"mb": mb, "rows": [], "w": [], "lm": run.batch.loss_mask, "adv": run.batch.advantages})
        current["sub"] = sub
        return original(run, mb, sub, *args)

    def loss_fn(logp, old, adv, mask, algo_, **kw):
        out = update.policy_loss(logp, old, adv, mask, algo_, **kw)
        g = torch.autograd.grad(out.loss, logp, retain_graph=True)[0].double()  # [b, T]
        ratio = torch.exp(logp.detach() - old).double()
        w = -g / (adv.double()[:, None] * ratio)
        steps[-1]["rows"].append(current["sub"].clone())
        steps[-1]["w"].append(torch.where(mask.bool(), w, torch.nan))
        return out

    monkeypatch.setattr(update, "_policy_term", policy_term)
    # every group kept and no truncated row masked, so each minibatch has loss tokens and makes a step
    algo = algo.replace(dynamic_sampling=False, overlong_filter=False)
    config = TrainerConfig(prompts_per_step=4, group_size=4, max_new_tokens=12, eval_every=0, progress=False,
                           lr=1e-12, seed=seed, minibatches=minibatches, micro_batch_size=micro, epochs=2)
    tr = Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), algo, config, loss_fn=loss_fn)
    tr.train(1)
    return steps


@pytest.mark.parametrize("algo", [DAPO, CISPO], ids=["DAPO", "CISPO"])
@pytest.mark.parametrize("seed,minibatches,micro", [(0, 2, None), (1, 2, 3), (2, 4, None), (3, 4, 1), (4, 1, 5)])
def test_every_response_of_a_group_weighs_the_same(tok, monkeypatch, algo, seed, minibatches, micro):
    G = 4
    steps = _token_weights(tok, monkeypatch, algo, seed=seed, minibatches=minibatches, micro=micro)
    assert len(steps) == 2 * minibatches  # epochs × minibatches optimiser steps
    for step in steps:
        rows = torch.cat(step["rows"])
        groups = torch.unique(rows // G)
        # the minibatch is whole groups: every row of each group it touches, once
        assert sorted(rows.tolist()) == sorted((groups[:, None] * G + torch.arange(G)).reshape(-1).tolist())
        assert len(groups) == 4 // minibatches
        lm = step["lm"]
        for sub, w in zip(step["rows"], step["w"]):
            for r, w_row in zip(sub.tolist(), w):
                live = ~torch.isnan(w_row) & (step["adv"][r] != 0)
                if not live.any():
                    continue
                g = r // G
                whole = float(lm[g * G:(g + 1) * G].sum())  # Σ_{i in group} |o_i| over the whole group
                # Eq. 12: each token weighs 1 / (Σ_i |o_i| · N_groups); the same for every row of the group
                torch.testing.assert_close(w_row[live], torch.full_like(w_row[live], 1.0 / (whole * len(groups))),
                                           rtol=1e-6, atol=0.0)


def test_group_orders_keep_groups_whole_and_spread_a_short_batch():
    # 7 groups of 3 (a dynamic-sampling batch that fell short of 8) in 3 minibatches: 2, 2 and 3 groups
    orders, bounds = _group_orders(21, 3, 3, epochs=2, seed=5)
    assert bounds == [0, 6, 12, 21]
    for order in orders:
        assert sorted(order.tolist()) == list(range(21))
        for a, b in zip(bounds[:-1], bounds[1:]):
            chunk = order[a:b].view(-1, 3)
            assert (chunk - chunk[:, :1] == torch.arange(3)).all() and (chunk[:, 0] % 3 == 0).all()
    assert not torch.equal(orders[0], orders[1])  # each epoch its own shuffle
    one, b1 = _group_orders(12, 4, 1, epochs=1, seed=0)  # one minibatch: rows in order
    assert torch.equal(one[0], torch.arange(12)) and b1 == [0, 12]
    few, b2 = _group_orders(8, 4, 4, epochs=1, seed=0)  # more minibatches than groups left: one group each
    assert b2 == [0, 4, 8]


def test_minibatches_must_divide_the_groups():
    with pytest.raises(ValueError, match="minibatches=4 does not divide prompts_per_step=6: every minibatch holds "
                                         "whole groups.*choose minibatches among \\[1, 2, 3, 6\\]"):
        TrainerConfig(prompts_per_step=6, group_size=4, minibatches=4)
    TrainerConfig(prompts_per_step=6, group_size=4, minibatches=3)  # 2 whole groups each
