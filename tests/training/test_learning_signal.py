"""The no-learning-signal warning: every group tied for NO_SIGNAL_STEPS steps in a row (issue 36)."""

import math
import warnings

import pytest

from _toys import TINY, HalfTask, tiny_profile
from grpo_lab import experiments
from grpo_lab.policy.models import tiny_policy
from grpo_lab.tasks import ArithmeticTask
from grpo_lab.training.trainer import (MEASURED_COLUMNS, DynamicSamplingShortfallWarning, NoLearningSignalWarning, Trainer,
                              TrainerConfig)
from grpo_lab.training.learning_signal import NO_SIGNAL_STEPS, no_signal_step, no_signal_warning, shortfall_steps


def _rows(fracs):
    return [{"step": 0, "test_accuracy": 0.0}] + [{"step": i + 1, "zero_adv_group_frac": f} for i, f in enumerate(fracs)]


def test_streak_detection():
    k = NO_SIGNAL_STEPS
    assert no_signal_step(_rows([1.0] * k)) == k
    assert no_signal_step(_rows([1.0] * (k - 1))) is None
    assert no_signal_step(_rows([1.0] * (k - 1) + [0.5] + [1.0] * (k - 1))) is None  # a mixed step resets it
    assert no_signal_step(_rows([0.5, 0.0] + [1.0] * (k + 3))) == k + 2  # the step that completes the streak
    assert no_signal_step(_rows([1.0, math.nan] + [1.0] * (k - 1))) == k + 1  # NaN (no training step): skipped
    assert no_signal_step(_rows([1.0, 1.0]), steps=2) == 2


def test_message_names_cause_and_fix():
    msg = no_signal_warning("GRPO", 8, 5, seeds=[0, 1], base_accuracy=0.0)
    for part in ("GRPO (seeds 0, 1)", "all 8 responses", "every advantage is 0", "never (or always) solves",
                 "0.000", "supervised warm start", "group_size", "temperature", "dynamic_sampling"):
        assert part in msg, part


def _trainer(task, tok):
    cfg = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=4, eval_every=0, seed=0)
    return Trainer(tiny_policy(tok, TINY, seed=0), tok, task, "GRPO", cfg)


def test_trainer_warns_once_when_every_group_is_tied(tok):
    trainer = _trainer(ArithmeticTask(test_size=5), tok)  # a random policy never solves arithmetic: all tied
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(NO_SIGNAL_STEPS - 1)
        assert not [w for w in caught if issubclass(w.category, NoLearningSignalWarning)]
        trainer.train(2)  # the streak completes at step NO_SIGNAL_STEPS; the step after: no repeat
    hits = [w for w in caught if issubclass(w.category, NoLearningSignalWarning)]
    assert len(hits) == 1, [str(w.message) for w in hits]
    assert f"up to step {NO_SIGNAL_STEPS}" in str(hits[0].message)
    assert (trainer.history["zero_adv_group_frac"].dropna() == 1.0).all()


def test_no_warning_with_mixed_groups_and_same_numbers(tok):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _trainer(HalfTask(test_size=5), tok)
        trainer.train(NO_SIGNAL_STEPS + 1)
    assert not [w for w in caught if issubclass(w.category, NoLearningSignalWarning)]
    # the warning changes no number: the same tied run gives the same history, the warning shown or ignored
    histories = []
    for action in ("always", "ignore"):
        with warnings.catch_warnings(record=True):
            warnings.simplefilter(action, NoLearningSignalWarning)
            t = _trainer(ArithmeticTask(test_size=5), tok)
            t.train(NO_SIGNAL_STEPS)
            histories.append(t.history.drop(columns=list(MEASURED_COLUMNS), errors="ignore"))
    assert histories[0].equals(histories[1])


def test_run_warns_once_over_seeds(tmp_path):
    prof = tiny_profile(tmp_path / "base", steps=NO_SIGNAL_STEPS, eval_every=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        experiments.run("GRPO", profile=prof, seeds=(0, 1), n_jobs=1, cache=False)
    hits = [str(w.message) for w in caught if issubclass(w.category, NoLearningSignalWarning)]
    assert len(hits) == 1 and hits[0].startswith("GRPO (seeds 0, 1): no learning signal"), hits
    assert caught[[issubclass(w.category, NoLearningSignalWarning) for w in caught].index(True)].filename == __file__


def test_value_baseline_never_warns(tok):
    cfg = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=4, eval_every=0, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(tiny_policy(tok, TINY, seed=0), tok, ArithmeticTask(test_size=5), "PPO", cfg).train(NO_SIGNAL_STEPS)
    assert not [w for w in caught if issubclass(w.category, NoLearningSignalWarning)]


@pytest.mark.slow
def test_worker_processes_warn_once_in_the_caller(tmp_path):
    prof = tiny_profile(tmp_path / "base", steps=NO_SIGNAL_STEPS, eval_every=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        experiments.run("GRPO", profile=prof, seeds=(0, 1), n_jobs=2, cache=False)
    experiments.shutdown_workers()
    hits = [str(w.message) for w in caught if issubclass(w.category, NoLearningSignalWarning)]
    assert len(hits) == 1 and "seeds 0, 1" in hits[0], hits


def test_shortfall_steps_by_hand():
    rows = [{"step": 0, "test_accuracy": 0.1}, {"step": 1, "trained_groups": 2}, {"step": 2, "trained_groups": 1},
            {"step": 3, "trained_groups": 0}, {"step": 4, "trained_groups": float("nan")}]
    assert shortfall_steps(rows, prompts_per_step=2) == 2  # steps 2 and 3; step 0 and the NaN row skipped
    assert shortfall_steps(rows, prompts_per_step=1) == 1


def test_run_says_a_dynamic_sampling_shortfall_once_over_seeds(tmp_path):
    # the tiny random policy solves nothing, so every group is tied and dynamic sampling (DAPO) finds no mixed
    # group in max_gen_rounds rounds: the trainer warns at each step; run() silences those in its seeds and
    # warns once (it printed one RuntimeWarning per step and seed from the worker processes of chapter 7)
    prof = tiny_profile(tmp_path / "base", steps=2, eval_every=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = experiments.run("DAPO", profile=prof, seeds=(0, 1), n_jobs=1, cache=False,
                                 max_gen_rounds=2)
    hits = [str(w.message) for w in caught if issubclass(w.category, DynamicSamplingShortfallWarning)]
    assert len(hits) == 1, hits
    assert hits[0].startswith("DAPO (seeds 0, 1): dynamic sampling found fewer than prompts_per_step=2 groups")
    assert "max_gen_rounds=2 rounds at 2, 2 of 2 steps" in hits[0]
    assert (result.history.query("step > 0")["trained_groups"] == 0).all()  # what the warning counted
    assert issubclass(DynamicSamplingShortfallWarning, RuntimeWarning)  # old RuntimeWarning filters still match


def test_zero_adv_groups_of_gae_come_from_its_advantages_and_tied_groups_are_their_own_column():
    # by hand: two tied groups of G = 2 (rewards all 0). A group baseline gives them advantage 0 exactly: both
    # columns read 1. GAE's value baseline gives group 1 a signal; group 0's advantages are 0 at every real token
    # (non-zero only at padding, which the loss never sees): zero_adv_group_frac = 1/2, tied_group_frac = 1
    from types import SimpleNamespace

    import torch

    from grpo_lab.training.history import tied_group_frac, zero_advantage_group_frac

    shaped = torch.zeros(4)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([[0.0, 0.0, 0.7], [0.0, -0.3, 0.2], [0.0, -0.5, 0.0], [0.0, 0.0, 0.0]])
    batch = SimpleNamespace(advantages=adv, loss_mask=mask)
    assert tied_group_frac(shaped, 2) == 1.0
    assert zero_advantage_group_frac(batch, SimpleNamespace(advantage="gae"), shaped, 2) == 0.5
    assert zero_advantage_group_frac(batch, SimpleNamespace(advantage="group"), shaped, 2) == 1.0
    assert tied_group_frac(torch.tensor([1.0, 0.0, 0.5, 0.5]), 2) == 0.5


def test_ppo_on_tied_groups_has_a_signal_and_is_not_warned_about(tok):
    # a random policy never solves arithmetic: every group is tied, yet PPO's value baseline (a critic that
    # predicts 0.5 per token) gives advantages (the old column counted tied groups for gae: 1 at every step)
    import torch

    from grpo_lab.algo.algorithms import PPO

    class Half(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.v = torch.nn.Embedding(len(tok), 1)
            torch.nn.init.constant_(self.v.weight, 0.5)

        def values(self, rollout):
            return self.v(rollout.completion_ids).squeeze(-1)

    cfg = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=4, eval_every=0, seed=0, progress=False)
    trainer = Trainer(tiny_policy(tok, TINY, seed=0), tok, ArithmeticTask(test_size=5), PPO, cfg, value_model=Half())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = trainer.train(NO_SIGNAL_STEPS)
    assert not [w for w in caught if issubclass(w.category, NoLearningSignalWarning)]
    assert (h["tied_group_frac"].dropna() == 1.0).all()
    assert (h["zero_adv_group_frac"].dropna() < 1.0).all() and (h["adv_abs_mean"].dropna() > 0).all()


def test_group_estimators_count_tied_groups_in_both_columns(tok):
    h = _trainer(HalfTask(test_size=5), tok).train(3)
    assert h["zero_adv_group_frac"].dropna().equals(h["tied_group_frac"].dropna())
