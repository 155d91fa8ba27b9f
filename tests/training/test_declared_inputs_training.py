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


def test_raw_rewards_are_the_tasks_and_rewards_the_shaped_ones(tok, monkeypatch):
    seen = []

    @hparams.declare(inputs=("rewards", "raw_rewards", "correct"))
    def reward_aware(ctx, *, eps_low: float = 0.2, eps_high: float = 0.2):
        seen.append((ctx.rewards, ctx.raw_rewards, ctx.correct))
        return ppo_surrogate(ctx, eps_low=eps_low, eps_high=eps_high)

    monkeypatch.setitem(SURROGATES, "reward_aware", reward_aware)
    # DAPO's soft overlong penalty past 8 - 4 = 4 tokens: the training rewards fall below the task's on long rows
    _trainer(tok, GRPO.replace(surrogate="reward_aware", overlong_cache_len=4), micro_batch_size=3).train(1)
    shaped = torch.cat([s for s, _, _ in seen])
    raw = torch.cat([r for _, r, _ in seen])
    correct = torch.cat([c for _, _, c in seen])
    assert torch.equal(raw, correct.float())  # HalfTask's reward is its verdict
    assert bool((shaped <= raw + 1e-6).all()) and bool((shaped < raw - 1e-6).any())


def test_a_selector_gets_the_inputs_it_declares(monkeypatch):
    from grpo_lab.algo import selection

    got = {}

    @hparams.declare(inputs=("raw_rewards", "lengths"))
    def keep_long(correct, group_size, *, raw_rewards, lengths):
        got.update(raw=raw_rewards, lengths=lengths)
        return (lengths.view(-1, group_size).float().mean(1) > 2).nonzero().flatten()

    monkeypatch.setitem(selection.SELECTORS, "all", keep_long)
    correct = torch.tensor([True, False, True, True])
    inputs = {"rewards": torch.zeros(4), "raw_rewards": torch.ones(4), "lengths": torch.tensor([1, 1, 5, 5])}
    assert selection.select_groups(GRPO, correct, 2, inputs=inputs).tolist() == [1]
    assert torch.equal(got["raw"], torch.ones(4)) and "rewards" not in got
    with pytest.raises(ValueError, match=r"declares inputs \['lengths'\]"):
        selection.select_groups(GRPO, correct, 2, inputs={"raw_rewards": torch.ones(4)})
