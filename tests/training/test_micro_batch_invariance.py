"""The trainer's promise, for every preset in PRESETS (derived from the registry, so a new preset is
covered without editing this file): the update does not depend on ``micro_batch_size`` or
``sort_by_length``. Checked on the second optimiser step of a rollout (``minibatches=2``), where the
policy has moved and ratios differ from 1, so clips, gates and covariance selections act; the
whole-minibatch statistics of KL-Cov / Clip-Cov are computed once before micro-batching
(grpo_lab.training.update), which this test would catch if they were computed per micro-batch."""

import pytest
import torch

from _toys import TINY, HalfTask
from grpo_lab.algo.algorithms import PRESETS
from grpo_lab.policy.models import tiny_policy
from grpo_lab.training.trainer import Trainer, TrainerConfig


#: selections large enough to act on a 8-row batch (the papers' 2e-3 and 2e-4 pick one token here)
TOY_OVERRIDES = {"KL_COV": {"kl_cov_ratio": 0.2}, "CLIP_COV": {"clip_cov_ratio": 0.3, "clip_cov_lb": 0.0}}


def _second_step_grads(tok, algo, **cfg):
    if algo.advantage == "gae":
        cfg["value_init"] = "scratch"  # a small critic of its own (the policy-copy default is slower)
    config = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False,
                           lr=3e-3, seed=0, minibatches=2, **cfg)
    tr = Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), algo, config)
    grads, step = [], tr.optimizer.step

    def wrapped(*a, **k):
        grads.append([p.grad.clone() if p.grad is not None else None for p in tr.policy.parameters()])
        return step(*a, **k)

    tr.optimizer.step = wrapped
    torch.manual_seed(1)  # Clip-Cov draws from the global generator: the same draw in every run
    h = tr.train(1)
    return grads[-1], h


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_update_is_micro_batch_invariant(tok, name):
    algo = PRESETS[name].replace(**TOY_OVERRIDES.get(name, {}))
    g_whole, h_whole = _second_step_grads(tok, algo)
    assert h_whole["grad_norm"].iloc[0] > 0
    for cfg in (dict(micro_batch_size=3), dict(micro_batch_size=1, sort_by_length=True)):
        g, h = _second_step_grads(tok, algo, **cfg)
        assert h["reward"].equals(h_whole["reward"])
        for a, b in zip(g_whole, g):
            if a is None:
                assert b is None
                continue
            torch.testing.assert_close(b, a, atol=1e-7, rtol=1e-4)
    if name in TOY_OVERRIDES:  # the statistic really selected tokens on the second step
        col = {"KL_COV": "kl_cov_selected", "CLIP_COV": "clip_cov_detached"}[name]
        assert h_whole[col].iloc[0] > 0


def test_ratio_quantiles_do_not_depend_on_micro_batching(tok):
    # The quantiles pool the ratios of every micro-batch of an optimiser step (D3: a mean of per-micro-batch
    # quantiles moved by up to 0.02 with micro_batch_size). 16 rows in one minibatch, two epochs: the second
    # epoch's ratios differ from 1; micro-batches of 16 (whole), 8 and 3 rows, sorted by length or not.
    def quantiles(**cfg):
        config = TrainerConfig(prompts_per_step=4, group_size=4, max_new_tokens=8, eval_every=0, progress=False,
                               lr=3e-3, seed=0, epochs=2, **cfg)
        h = Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), PRESETS["GRPO"], config).train(1)
        return h[["ratio_q05", "ratio_q50", "ratio_q95", "ratio_min", "ratio_max"]].iloc[0]

    whole = quantiles()
    assert whole["ratio_q05"] < whole["ratio_q95"]  # the second epoch moved the ratios
    for cfg in (dict(micro_batch_size=8), dict(micro_batch_size=3), dict(micro_batch_size=3, sort_by_length=False)):
        got = quantiles(**cfg)
        assert got.to_numpy() == pytest.approx(whole.to_numpy(), abs=1e-6), cfg
