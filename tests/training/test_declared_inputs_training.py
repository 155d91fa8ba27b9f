"""The trainer supplies exactly the declared inputs, checks the run configuration once, and TIS / MIS train."""

import pytest
import torch

from _toys import TINY, HalfTask
from grpo_lab.algo import hparams
from grpo_lab.algo.algorithms import GRPO, TIS, MIS
from grpo_lab.algo.objectives import SURROGATES, ppo_surrogate
from grpo_lab.policy.models import tiny_policy
from grpo_lab.training.trainer import Trainer, TrainerConfig


def _trainer(tok, algo, **cfg):
    config = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False,
                           lr=3e-3, seed=0, minibatches=2, **cfg)
    return Trainer(tiny_policy(tok, TINY, seed=0), tok, HalfTask(test_size=5), algo, config)


def test_a_mismatch_correction_with_behaviour_old_logp_is_refused_at_construction(tok):
    with pytest.raises(ValueError, match=r"mismatch='token_truncate'.*needs TrainerConfig.old_logp='recompute', got "
                                         r"old_logp='behaviour'"):
        _trainer(tok, TIS, old_logp="behaviour")


@pytest.mark.parametrize("algo", [TIS, MIS], ids=["TIS", "MIS"])
def test_tis_and_mis_train_against_a_bfloat16_sampler(tok, algo):
    h = _trainer(tok, algo, rollout_dtype="bfloat16", micro_batch_size=3).train(1)
    assert {"is_capped_frac", "is_weight_mean"} <= set(h.columns)
    assert 0 < h["is_weight_mean"].iloc[0] and h["grad_norm"].iloc[0] > 0


def test_the_trainer_supplies_exactly_the_declared_inputs(tok, monkeypatch):
    seen = []

    @hparams.declare(inputs=("entropy", "lengths", "group_ids"))
    def entropy_aware(ctx, *, eps_low: float = 0.2, eps_high: float = 0.2):
        seen.append((ctx.entropy, ctx.lengths, ctx.group_ids, ctx.behaviour_logp, ctx.correct))
        return ppo_surrogate(ctx, eps_low=eps_low, eps_high=eps_high)

    monkeypatch.setitem(SURROGATES, "entropy_aware", entropy_aware)
    _trainer(tok, GRPO.replace(surrogate="entropy_aware"), micro_batch_size=3).train(1)
    assert seen
    for ent, lengths, gids, beh, correct in seen:
        assert ent.shape[0] == lengths.shape[0] == gids.shape[0] and ent.dim() == 2
        assert bool((ent >= 0).all()) and beh is None and correct is None
        assert lengths.dtype == torch.int64 and int(gids.max()) <= 1
