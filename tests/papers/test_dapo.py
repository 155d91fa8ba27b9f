"""Tests for DAPO's techniques (Yu et al., arXiv 2503.14476): the soft overlong punishment (Eq. 13),
clip-higher (Eq. 10), the token-level loss (Eq. 12) under micro-batching, dynamic sampling
(Eq. 11) and overlong filtering (§3.4) in the trainer, and exact resume with dynamic sampling."""

import dataclasses
import math
import warnings

import pandas as pd
import pytest
import torch

import grpo_lab.tasks as tasks_mod
from grpo_lab.algo.algorithms import DAPO, GRPO
from grpo_lab.policy.models import TinyConfig, tiny_policy
from grpo_lab.algo.objectives import policy_loss
from grpo_lab.algo.rewards import overlong_penalty, shape_rewards
from grpo_lab.policy.rollout import policy_logprobs
from grpo_lab.tasks import ArithmeticTask, Problem
from grpo_lab.training.collection import Batch, concat_rollouts
from grpo_lab.training.trainer import Trainer, TrainerConfig

TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)
TIMING = ["tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb"]
G = 4


# ------------------------------------------------------------------------------------ Eq. 13
def test_overlong_penalty_golden_values():
    # L_max = 20, L_cache = 4: the penalty starts after L_max - L_cache = 16 tokens
    got = overlong_penalty(torch.tensor([15, 16, 17, 18, 20, 21, 0]), max_len=20, cache_len=4)
    want = [
        0.0,    # |y| = 15 = L_max - L_cache - 1 <= 16                         -> 0
        0.0,    # |y| = 16 = L_max - L_cache (last unpunished length)          -> 0
        -0.25,  # |y| = 17: (16 - 17) / 4                                      -> -0.25
        -0.5,   # |y| = 18, inside the cache: (16 - 18) / 4                    -> -0.5
        -1.0,   # |y| = 20 = L_max: (16 - 20) / 4                              -> -1 (continuous)
        -1.0,   # |y| = 21 = L_max + 1 > L_max                                 -> -1
        0.0,    # empty response
    ]
    assert got.dtype == torch.float32 and got.shape == (7,)
    assert got.tolist() == want  # all exactly representable


def test_overlong_penalty_papers_setting():
    # DAPO §4.1: expected maximum 16,384 + cache 4,096 -> L_max = 20,480, L_cache = 4,096
    got = overlong_penalty([16384, 16385, 18432, 20480], max_len=20480, cache_len=4096)
    assert got[0] == 0.0 and got[2] == -0.5 and got[3] == -1.0   # (16384 - 18432) / 4096 = -0.5
    assert got[1] == pytest.approx(-1 / 4096)                   # (16384 - 16385) / 4096
    # swapping the two quantities (a common misreading) would punish from 4,096 - 20,480 < 0, i.e.
    # always; it is rejected because the cache must fit in the budget
    with pytest.raises(ValueError, match="L_cache"):
        overlong_penalty([100], max_len=4096, cache_len=20480)


def test_overlong_penalty_edge_cases():
    # L_cache = L_max: the ramp covers the whole budget, -|y| / L_max
    assert overlong_penalty([0, 2, 4], max_len=4, cache_len=4).tolist() == [0.0, -0.5, -1.0]
    # L_cache = 1: a step from 0 to -1 at L_max
    assert overlong_penalty([2, 3, 4], max_len=3, cache_len=1).tolist() == [0.0, -1.0, -1.0]
    assert overlong_penalty(torch.tensor([2.5]), max_len=4, cache_len=2).tolist() == [-0.25]
    assert overlong_penalty(torch.zeros(0, dtype=torch.long), max_len=4, cache_len=2).shape == (0,)
    # shaped reward = correctness + penalty (DAPO §3.4)
    r = shape_rewards(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([16, 18, 21]), max_len=20, cache_len=4)
    assert r.tolist() == [1.0, 0.5, -1.0] and r.dtype == torch.float32


@pytest.mark.parametrize("kw, match", [
    (dict(max_len=4, cache_len=0), "cache_len"),
    (dict(max_len=4, cache_len=5), "cache_len"),
    (dict(max_len=0, cache_len=1), "max_len"),
    (dict(max_len=4.0, cache_len=2), "max_len"),
    (dict(max_len=4, cache_len=True), "cache_len"),
])
def test_overlong_penalty_validates_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        overlong_penalty([1, 2], **kw)


@pytest.mark.parametrize("lengths, match", [
    ([1, -1], ">= 0"), ([[1, 2]], "1-D"), ([1.0, float("nan")], "finite"), (["a"], "lengths"),
])
def test_overlong_penalty_validates_lengths(lengths, match):
    with pytest.raises(ValueError, match=match):
        overlong_penalty(lengths, max_len=4, cache_len=2)


def test_shape_rewards_validates():
    with pytest.raises(ValueError, match="shape mismatch"):
        shape_rewards(torch.ones(2), [1, 2, 3], max_len=4, cache_len=2)
    with pytest.raises(ValueError, match="finite"):
        shape_rewards(torch.tensor([1.0, float("nan")]), [1, 2], max_len=4, cache_len=2)


# ------------------------------------------------------------------------------------ Eq. 10, 12
@pytest.mark.parametrize("eps_high, pi, moves", [
    (0.2, 0.0119, True),    # ratio 1.19 < 1 + 0.2: still pushed up
    (0.2, 0.0121, False),   # ratio 1.21 > 1.2: clipped, gradient 0 -> at most 0.01 * 1.2 = 0.012
    (0.28, 0.0121, True),   # clip-higher leaves room up to 0.01 * 1.28 = 0.0128
    (0.28, 0.0127, True),
    (0.28, 0.0129, False),  # ratio 1.29 > 1.28: clipped
])
def test_clip_higher_papers_example(eps_high, pi, moves):
    # DAPO §3.1: with eps = 0.2 a token at pi_old = 0.01 can rise only to 0.012; eps_high = 0.28
    # raises the ceiling to 0.0128. A > 0; the gradient of the loss w.r.t. log pi is -A * ratio / 1
    # inside the clip and 0 once the ratio exceeds 1 + eps_high.
    algo = DAPO.replace(eps_high=eps_high)
    logp = torch.tensor([[math.log(pi)]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[math.log(0.01)]], dtype=torch.float64)
    out = policy_loss(logp, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1), algo, group_size=1)
    out.loss.backward()
    g = logp.grad.item()
    if moves:
        assert g == pytest.approx(-pi / 0.01, rel=1e-12)  # d(-ratio)/dlogp = -ratio
        assert out.metrics["clip_frac_high"] == 0.0
    else:
        assert g == 0.0 and out.metrics["clip_frac_high"] == 1.0


def test_token_mean_micro_batch_invariance_under_dapo():
    # Eq. 12 as verl and TRL compute it ("token_mean": 1 / sum_i |o_i| over the whole batch; the
    # preset's per-group form is tested in test_group_token_mean.py). Micro-batches given the global token count sum
    # to the full-batch loss and gradient, off-policy (so clip-higher acts) and with ragged lengths.
    g = torch.Generator().manual_seed(0)
    B, T = 8, 7
    lengths = torch.tensor([7, 1, 3, 5, 2, 7, 4, 6])
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    base = torch.randn(B, T, generator=g, dtype=torch.float64) - 2
    old = base + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)

    logp = base.clone().requires_grad_(True)
    dapo_tm = DAPO.replace(aggregation="token_mean")
    full = policy_loss(logp, old, adv, mask, dapo_tm)
    full.loss.backward()
    assert full.metrics["clip_frac"] > 0  # the clip is exercised
    n_tok = float(mask.sum())
    logp2 = base.clone().requires_grad_(True)
    total = 0.0
    for idx in ([0, 1, 2], [3, 4, 5], [6, 7]):
        out = policy_loss(logp2[idx], old[idx], adv[idx], mask[idx], dapo_tm, num_tokens=n_tok)
        out.loss.backward()
        total = total + out.loss.detach()
    torch.testing.assert_close(total, full.loss.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logp2.grad, logp.grad, rtol=1e-12, atol=1e-12)
    # and it is not the mean of per-micro-batch token means (what a local normaliser would give)
    local = sum(policy_loss(base[i], old[i], adv[i], mask[i], dapo_tm).loss for i in ([0, 1, 2], [3, 4, 5], [6, 7])) / 3
    assert abs(float(local.detach()) - float(full.loss.detach())) > 1e-3


def test_group_token_mean_is_eq12_over_several_groups():
    # A float64 transcription of DAPO Eq. 12, written from the paper: the objective of a rollout of K
    # questions is the mean over questions of (1 / sum_{i=1}^G |o_i|) sum_i sum_t min(r A, clip(r, 1-eps_low,
    # 1+eps_high) A); the loss is its negative. 3 groups of 4 with ragged lengths, off-policy so the clip acts.
    g = torch.Generator().manual_seed(3)
    K, G_, T = 3, 4, 6
    lengths = torch.tensor([6, 1, 3, 2, 5, 5, 4, 6, 1, 1, 2, 3])
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    logp0 = torch.randn(K * G_, T, generator=g, dtype=torch.float64) - 2
    old = logp0 + 0.3 * torch.randn(K * G_, T, generator=g, dtype=torch.float64)
    adv = torch.randn(K * G_, generator=g, dtype=torch.float64)

    def eq12(logp, questions=range(K)):
        r = torch.exp(logp - old)
        a = adv[:, None]
        term = torch.minimum(r * a, r.clamp(1 - DAPO.eps_low, 1 + DAPO.eps_high) * a) * mask
        per_q = [term[k * G_:(k + 1) * G_].sum() / mask[k * G_:(k + 1) * G_].sum() for k in questions]
        return -sum(per_q) / len(per_q)

    ref = logp0.clone().requires_grad_(True)
    eq12(ref).backward()
    got = logp0.clone().requires_grad_(True)
    out = policy_loss(got, old, adv, mask, DAPO, group_size=G_)
    out.loss.backward()
    assert out.metrics["clip_frac"] > 0  # the clip is exercised
    torch.testing.assert_close(out.loss.detach(), eq12(logp0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.grad, ref.grad, rtol=1e-12, atol=1e-12)
    # the trainer's form: one minibatch of two whole groups (rows 4..11) given their whole-group counts
    part = logp0[4:].clone().requires_grad_(True)
    gt = mask.sum(-1).view(K, G_).sum(-1).repeat_interleave(G_)[4:]
    sub = policy_loss(part, old[4:], adv[4:], mask[4:], DAPO, group_tokens=gt, num_groups=2)
    torch.testing.assert_close(sub.loss.detach(), eq12(logp0, questions=(1, 2)), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------ toy task
@dataclasses.dataclass
class KindTask(ArithmeticTask):
    """Questions whose groups are all-correct (``A``), all-wrong (``N``) or mixed (``M``: the first
    half of each group correct) whatever the policy writes, so dynamic sampling is controllable.

    ``script``: one string of kinds per rollout (cycled), e.g. ``("AN", "MA")``; empty = kinds
    drawn uniformly with the trainer's RNG. Prompts have 1-3 repeated digits, so rollouts of
    different rounds have different prompt widths (exercising the left-padded concatenation).
    The k-th ``reward`` / ``is_correct`` call scores row ``k`` of the rollout (the trainer scores
    every row in order), so the position within a group is ``k % group``.
    """

    name: str = "kinds"
    script: tuple = ()
    group: int = G

    def __post_init__(self):
        super().__post_init__()
        self.script = tuple(self.script)
        self._rounds = self._n_reward = self._n_correct = 0

    def sample(self, n, rng):
        if self.script:
            kinds = self.script[self._rounds % len(self.script)]
            self._rounds += 1
            assert len(kinds) == n
        else:
            kinds = ["ANM"[int(i)] for i in rng.integers(0, 3, size=n)]
        return [Problem({"A": "1", "N": "2", "M": "3"}[k] * int(rng.integers(1, 4)) + "=", "0", {"kind": k})
                for k in kinds]

    def _verdict(self, problem, k):
        kind = problem.meta["kind"]
        return kind == "A" or (kind == "M" and k % self.group < self.group // 2)

    def is_correct(self, completion, problem):
        self._n_correct += 1
        return self._verdict(problem, self._n_correct - 1)

    def reward(self, completion, problem):
        self._n_reward += 1
        return 1.0 if self._verdict(problem, self._n_reward - 1) else 0.0


DS = GRPO.replace(name="GRPO+DS", dynamic_sampling=True, beta=0.0)


def make_trainer(tok, algo=DS, task=None, loss_fn=policy_loss, **kw):
    cfg = dict(prompts_per_step=2, group_size=G, max_new_tokens=6, eval_every=0, progress=False, lr=1e-2, seed=0)
    cfg.update(kw)
    return Trainer(tiny_policy(tok, TINY, seed=0), tok, task or KindTask(test_size=3), algo, TrainerConfig(**cfg),
                   loss_fn=loss_fn)


def params(tr):
    return [p.detach().clone() for p in tr.policy.parameters()]


class _LossArgs:
    """A ``loss_fn`` (``Trainer(..., loss_fn=)``): policy_loss, recording (advantages, mask, num_tokens) of every call."""

    def __init__(self):
        self.calls = []

    def __call__(self, logp, old, adv, mask, algo, **k):
        self.calls.append((adv.detach().clone(), mask.detach().clone(), k.get("num_tokens")))
        return policy_loss(logp, old, adv, mask, algo, **k)


# ------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("kwargs", [dict(max_gen_rounds=0), dict(max_gen_rounds=2.0),
                                    dict(on_gen_rounds_exhausted="ignore")])
def test_config_validation(kwargs):
    with pytest.raises(ValueError, match="TrainerConfig"):
        TrainerConfig(**kwargs)


def test_trainer_rejects_impossible_settings(tok):
    with pytest.raises(ValueError, match="L_cache"):
        make_trainer(tok, algo=DAPO.replace(overlong_cache_frac=None, overlong_cache_len=6), max_new_tokens=5)
    make_trainer(tok, algo=DAPO, max_new_tokens=5)  # the preset's fraction fits any budget (L_cache = 1)
    with pytest.raises(ValueError, match="group_size"):
        make_trainer(tok, group_size=1)


# ------------------------------------------------------------------------------------ Eq. 11
def test_dynamic_sampling_keeps_only_mixed_groups(tok):
    # rounds: A N (none kept) | M A (one kept) | M M (one kept, the extra dropped)
    tr = make_trainer(tok, task=KindTask(test_size=3, script=("AN", "MA", "MM")))
    batch = tr.collect()
    ro, rewards, generated = batch.rollout, batch.rewards, batch.generated
    assert len(generated) == 3
    assert [p.meta["kind"] for p in ro.problems] == ["M"] * (2 * G)
    assert rewards.tolist() == [1.0, 1.0, 0.0, 0.0] * 2
    # the kept groups come from rounds 2 and 3, row for row
    r2, r3 = generated[1].rollout, generated[2].rollout
    assert ro.texts == r2.texts[:G] + r3.texts[:G]
    assert ro.problems[0].prompt == r2.problems[0].prompt and ro.problems[G].prompt == r3.problems[0].prompt


def test_dynamic_sampling_metrics_and_trained_rows(tok, monkeypatch):
    rec = _LossArgs()
    tr = make_trainer(tok, task=KindTask(test_size=3, script=("AN", "MA", "MM")), loss_fn=rec)
    h = tr.train(1)
    row = h.iloc[0]
    assert row["gen_rounds"] == 3 and row["trained_groups"] == 2
    assert row["samples_per_trained"] == 3.0          # 3 rounds x 2 questions x 4 / (2 x 4)
    assert row["zero_adv_group_frac"] == 0.5          # A, N, A of the 6 generated groups
    assert row["accuracy"] == pytest.approx(14 / 24)  # (4 + 0) + (2 + 4) + (2 + 2) of 24 samples
    assert row["reward"] == row["accuracy"]           # no shaping here
    (adv, mask, n_tok), = rec.calls                   # one minibatch, no micro-batching
    assert adv.shape == (2 * G,) and bool((adv != 0).all())  # every trained row has a signal
    assert n_tok == float(mask.sum())


def test_without_dynamic_sampling_all_groups_train(tok, monkeypatch):
    rec = _LossArgs()
    h = make_trainer(tok, algo=GRPO.replace(beta=0.0), task=KindTask(test_size=3, script=("AM",)), loss_fn=rec).train(1)
    assert h["gen_rounds"].iloc[0] == 1 and h["samples_per_trained"].iloc[0] == 1.0
    assert h["zero_adv_group_frac"].iloc[0] == 0.5
    (adv, _, _), = rec.calls
    assert adv.shape == (2 * G,) and bool((adv[:G] == 0).all())


def test_gen_rounds_bound_warns_and_skips(tok):
    tr = make_trainer(tok, task=KindTask(test_size=3, script=("AN",)), max_gen_rounds=3)
    w0 = params(tr)
    with pytest.warns(RuntimeWarning, match="max_gen_rounds=3.*skipping"):
        h = tr.train(1)
    row = h.iloc[0]
    assert row["gen_rounds"] == 3 and row["trained_groups"] == 0 and math.isnan(row["samples_per_trained"])
    assert math.isnan(row["grad_norm"]) and math.isnan(row["entropy"])
    # the loss columns exist even though no step of this run updated (Trainer.train's docstring): NaN
    for k in ("loss", "pg_loss", "clip_frac", "ratio_mean", "clip_high_prob_mean", "token_prob_mean"):
        assert k in h and math.isnan(row[k]), k
    assert tr.step == 1 and tr.opt_steps == 0
    assert all(torch.equal(a, b) for a, b in zip(w0, params(tr)))


def test_gen_rounds_bound_warns_and_trains_on_partial_batch(tok):
    # one mixed group in 3 rounds of 2 questions; minibatches=2 cannot split one whole group, so its 4 rows make
    # one optimiser step (a minibatch holds whole groups: DAPO Eq. 12 divides by the whole group's length)
    tr = make_trainer(tok, task=KindTask(test_size=3, script=("MA", "AN", "AN")), max_gen_rounds=3,
                      minibatches=2)
    w0 = params(tr)
    with pytest.warns(RuntimeWarning, match="only 1 of prompts_per_step=2.*max_gen_rounds=3.*training on those"):
        h = tr.train(1)
    assert h["trained_groups"].iloc[0] == 1 and h["samples_per_trained"].iloc[0] == 6.0  # 24 / 4
    assert tr.opt_steps == 1 and not h["loss"].isna().any()
    assert any(not torch.equal(a, b) for a, b in zip(w0, params(tr)))


def test_gen_rounds_bound_error(tok):
    tr = make_trainer(tok, task=KindTask(test_size=3, script=("AN",)), max_gen_rounds=2,
                      on_gen_rounds_exhausted="error")
    with pytest.raises(RuntimeError, match="max_gen_rounds=2"):
        tr.train(1)


# ------------------------------------------------------------------------------------ top-up rounds
# KindTask asserts that each round asks for exactly as many questions as its script entry has, so
# the scripts below are the expected round sizes.
def test_topup_samples_only_what_the_missing_groups_need(tok):
    # P = 4: round 1 keeps 3 of 4 (keep rate 3/4); 1 group missing -> ceil(1 / (3/4)) = 2 questions
    tr = make_trainer(tok, task=KindTask(test_size=3, script=("MMMA", "MA")), prompts_per_step=4)
    row = tr.train(1).iloc[0]
    assert row["gen_rounds"] == 2 and row["generated_groups"] == 6
    assert row["selected_groups"] == 4 and row["trained_groups"] == 4
    assert row["samples_per_trained"] == 1.5  # (4 + 2) x 4 / (4 x 4)


def test_topup_off_generates_whole_rounds_and_drops_the_surplus(tok):
    # verl's recipe: every round is a full batch of P = 4 questions; round 2 keeps 1 of its 1 mixed group
    tr = make_trainer(tok, task=KindTask(test_size=3, script=("MMMA", "MAAA")), prompts_per_step=4, topup=False)
    row = tr.train(1).iloc[0]
    assert row["gen_rounds"] == 2 and row["generated_groups"] == 8
    assert row["selected_groups"] == 4 and row["trained_groups"] == 4 and row["samples_per_trained"] == 2.0
    # the surplus is counted as selected but not trained: "MMMM" in round 2 selects 4, trains 1
    tr = make_trainer(tok, task=KindTask(test_size=3, script=("MMMA", "MMMM")), prompts_per_step=4, topup=False)
    row = tr.train(1).iloc[0]
    assert row["selected_groups"] == 7 and row["trained_groups"] == 4


def test_round_size_uses_the_running_keep_rate_over_the_run(tok):
    tr = make_trainer(tok, prompts_per_step=16)
    batch = Batch(generated=[])
    batch.generated.append(type("S", (), {"rollout": [0] * (16 * G)})())  # this step: 16 groups generated
    batch.selected_groups = 12
    assert tr.round_size(4, batch) == 6                 # ceil(4 x 16 / 12) = ceil(5.33)
    tr.rows = [{"step": 0, "test_accuracy": 0.5},       # an evaluation row has no counts: ignored
               {"generated_groups": 40, "selected_groups": 20}]
    assert tr.round_size(4, batch) == 7                 # keep rate (12 + 20) / (16 + 40) = 4/7: 4 x 7/4 = 7
    assert tr.round_size(16, batch) == 16               # never more than a whole round
    batch.selected_groups, tr.rows = 0, []
    assert tr.round_size(3, batch) == 16                # nothing kept yet: a whole round
    tr.config = dataclasses.replace(tr.config, topup=False)
    batch.selected_groups = 12
    assert tr.round_size(1, batch) == 16


def test_topup_config_is_validated():
    with pytest.raises(ValueError, match="TrainerConfig.topup"):
        TrainerConfig(topup="yes")


def testconcat_rollouts_pads_prompts_left_and_keeps_logprobs(tok):
    tr = make_trainer(tok, task=KindTask(test_size=3, script=("MM", "MA")))
    torch.manual_seed(3)
    a, b = tr.rollout(), tr.rollout()
    b = b.select(torch.arange(G))
    cat = concat_rollouts([a, b], tok.pad_token_id)
    assert len(cat) == len(a) + len(b) and cat.texts == a.texts + b.texts
    P = max(a.prompt_ids.shape[1], b.prompt_ids.shape[1])
    T = max(a.completion_ids.shape[1], b.completion_ids.shape[1])
    assert cat.prompt_ids.shape == (3 * G, P) and cat.completion_ids.shape == (3 * G, T)
    # real prompt tokens end at the last column (left padding), completions start at column 0
    assert bool((cat.prompt_mask[:, -1] == 1).all())
    assert torch.equal(cat.completion_mask.sum(-1), torch.cat([a.completion_mask.sum(-1), b.completion_mask.sum(-1)]))
    with torch.no_grad():
        lp = policy_logprobs(tr.policy, cat)
        la, lb = policy_logprobs(tr.policy, a), policy_logprobs(tr.policy, b)
    torch.testing.assert_close(lp[:2 * G, :la.shape[1]], la, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lp[2 * G:, :lb.shape[1]], lb, atol=1e-5, rtol=1e-5)
    assert concat_rollouts([a], 0) is a
    with pytest.raises(ValueError):
        concat_rollouts([], 0)


# ------------------------------------------------------------------------------------ §3.4
def _mark_truncated(tr, rows):
    orig = tr.rollout

    def rollout(*args):
        ro = orig(*args)
        ro.truncated = ro.truncated.clone()
        ro.truncated[rows] = True
        return ro

    tr.rollout = rollout


def test_overlong_filter_masks_truncated_rows(tok, monkeypatch):
    rec = _LossArgs()
    tr = make_trainer(tok, algo=DS.replace(dynamic_sampling=False, overlong_filter=True), loss_fn=rec,
                      task=KindTask(test_size=3, script=("MM",)), max_new_tokens=12)
    seen = []
    orig = tr.rollout

    def rollout(*args):
        ro = orig(*args)
        ro.truncated = torch.zeros_like(ro.truncated)
        ro.truncated[[1, 6]] = True  # pretend rows 1 and 6 hit the budget
        seen.append(ro)
        return ro

    tr.rollout = rollout
    h = tr.train(1)
    (adv, mask, n_tok), = rec.calls
    ro, = seen
    assert mask[[1, 6]].sum() == 0
    keep = [i for i in range(2 * G) if i not in (1, 6)]
    T = mask.shape[1]
    assert torch.equal(mask[keep], ro.completion_mask[keep, :T])
    assert n_tok == float(ro.completion_mask[keep].sum())
    assert h["num_sequences"].iloc[0] == 6 and h["num_tokens"].iloc[0] == n_tok
    assert h["truncation_rate"].iloc[0] == 2 / 8  # over generated samples


def test_overlong_filter_all_truncated_skips_update(tok):
    tr = make_trainer(tok, algo=DS.replace(dynamic_sampling=False, overlong_filter=True),
                      task=KindTask(test_size=3, script=("MM",)))
    _mark_truncated(tr, slice(None))
    w0 = params(tr)
    h = tr.train(1)
    assert tr.opt_steps == 0 and all(torch.equal(a, b) for a, b in zip(w0, params(tr)))
    assert math.isnan(h["grad_norm"].iloc[0]) and h["truncation_rate"].iloc[0] == 1.0


def test_overlong_filter_micro_batch_invariance(tok, capture_grads):
    # with truncated rows masked, the global token count still makes micro-batching exact
    grads = {}
    algo = DAPO.replace(dynamic_sampling=False, overlong_cache_frac=None, overlong_cache_len=3)
    for micro in (None, 3):
        tr = make_trainer(tok, algo=algo, task=KindTask(test_size=3, script=("MM",)), micro_batch_size=micro)
        _mark_truncated(tr, [0, 5])
        capture_grads(tr, grads, micro)
        tr.train(1)
    assert any(float(g.abs().max()) > 0 for g in grads[None])
    for g1, g3 in zip(grads[None], grads[3]):
        torch.testing.assert_close(g3, g1, atol=1e-7, rtol=1e-4)


def test_soft_overlong_punishment_in_trainer(tok):
    # reward = task reward + Eq. 13 with L_max = max_new_tokens = 6, L_cache = 3; accuracy stays raw
    algo = GRPO.replace(name="shaped", beta=0.0, overlong_cache_len=3)
    tr = make_trainer(tok, algo=algo, task=KindTask(test_size=3, script=("MA",)))
    seen = []
    orig = tr.rollout
    tr.rollout = lambda *args: seen.append(orig(*args)) or seen[-1]
    h = tr.train(1)
    ro, = seen
    raw = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    pen = overlong_penalty(ro.lengths, max_len=6, cache_len=3)
    assert (pen < 0).any()  # a random tiny policy writes long answers
    assert h["accuracy"].iloc[0] == pytest.approx(6 / 8)
    assert h["reward"].iloc[0] == pytest.approx(float((raw + pen).mean()), abs=1e-6)
    assert h["overlong_frac_penalised"].iloc[0] == pytest.approx(float((ro.lengths > 3).float().mean()))
    assert h["zero_adv_group_frac"].iloc[0] <= 0.5  # shaping can break ties of the all-correct group


def test_dapo_preset_trains(tok):
    # a budget of 40 tokens lets the random tiny policy end some answers (P(EOS) ~ 1/52 per token)
    h = make_trainer(tok, algo=DAPO, task=KindTask(test_size=3), max_new_tokens=40, minibatches=2).train(2)
    for c in ["gen_rounds", "samples_per_trained", "zero_adv_group_frac", "truncation_rate", "entropy",
              "overlong_frac_penalised", "clip_frac_high", "loss", "grad_norm"]:
        assert c in h and not h[c].isna().any(), c
    assert h["kl"].isna().all() and (h["samples_per_trained"] >= 1).all()  # no KL term: not measured
    assert (h["truncation_rate"] > 0).all() and (h["truncation_rate"] < 1).all()


# ------------------------------------------------------------------------------------ resume
def test_exact_resume_with_dynamic_sampling(tok, tmp_path, monkeypatch):
    monkeypatch.setitem(tasks_mod.TASKS, "kinds", KindTask)
    algo = DAPO.replace(overlong_cache_frac=None, overlong_cache_len=3)
    kw = dict(algo=algo, minibatches=2, max_new_tokens=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        straight = make_trainer(tok, **kw)
        straight.train(4)
        first = make_trainer(tok, **kw)
        first.train(2)
        first.save(tmp_path)
        torch.manual_seed(999)
        resumed = Trainer.resume(tmp_path)
        assert resumed.algo == algo and resumed.task == KindTask(test_size=3)
        resumed.train(2)
    assert (straight.history["gen_rounds"] > 1).any()  # extra rounds did happen
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)
    pd.testing.assert_frame_equal(straight.history.drop(columns=TIMING, errors="ignore"), resumed.history.drop(columns=TIMING, errors="ignore"),
                                  check_exact=True, check_dtype=False)


def test_up_clipped_token_probability_metrics():
    # DAPO §3.1 / Fig. 3a: which tokens does the upper clip stop? Hand example (A > 0 everywhere,
    # eps_high = 0.28): pi_old = 0.01 -> pi_theta 0.02 (r = 2, clipped), 0.1 -> 0.1 (r = 1), 0.5 ->
    # 0.8 (r = 1.6, clipped), and a padded position that must not count. The metric is pi_theta.
    from grpo_lab.algo.metrics import reduce_micro_batches, reduce_updates
    p_old = torch.tensor([[0.01, 0.1], [0.5, 0.3]], dtype=torch.float64)
    p_new = torch.tensor([[0.02, 0.1], [0.8, 0.9]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    algo = DAPO.replace(aggregation="token_mean")
    out = policy_loss(p_new.log(), p_old.log(), torch.ones(2, dtype=torch.float64), mask, algo)
    assert out.metrics["clip_frac_high"] == pytest.approx(2 / 3)
    assert out.metrics["clip_high_prob_mean"] == pytest.approx((0.02 + 0.8) / 2, rel=1e-12)
    assert out.metrics["clip_high_prob_max"] == pytest.approx(0.8, rel=1e-12)
    assert out.metrics["token_prob_mean"] == pytest.approx((0.02 + 0.1 + 0.8) / 3, rel=1e-12)
    # micro-batches: weighted by the clipped-token counts, the max over those with any
    parts = [policy_loss(p_new[i].log(), p_old[i].log(), torch.ones(1, dtype=torch.float64), mask[i], algo).metrics
             for i in ([0], [1])]
    red = reduce_micro_batches(parts)
    assert float(red["clip_high_prob_mean"]) == pytest.approx(0.41, rel=1e-12)
    assert float(red["clip_high_prob_max"]) == pytest.approx(0.8, rel=1e-12)
    assert float(red["token_prob_mean"]) == pytest.approx(0.92 / 3, rel=1e-12)
    # nothing clipped: 0.0 with weight 0 in policy_loss, NaN once reduced (not measured)
    calm = policy_loss(p_old.log(), p_old.log(), torch.ones(2, dtype=torch.float64), mask, algo).metrics
    assert calm["clip_high_prob_mean"] == 0.0 and calm["clip_high_prob_mean"].weight == 0.0
    assert math.isnan(reduce_updates([reduce_micro_batches([calm])])["clip_high_prob_mean"])
    assert math.isnan(reduce_updates([reduce_micro_batches([calm])])["clip_high_prob_max"])
    assert calm["token_prob_mean"] == pytest.approx(0.61 / 3, rel=1e-12) and calm["token_prob_mean"].weight == 3.0


# ------------------------------------------------------------------------------------ L_cache sized to the budget
def test_the_preset_keeps_the_papers_proportion_at_any_budget():
    from grpo_lab.algo.algorithms import CISPO
    from grpo_lab.algo.selection import overlong_cache_tokens

    # found by a fresh user: the preset held L_cache = 6 tokens (sized for a 32-token budget); at a
    # budget of 8 every sample was penalised. Goldens by hand: floor(0.2 * L_max + 1/2), at least 1.
    expected = {20_480: 4_096, 32: 6, 20: 4, 8: 2, 5: 1, 2: 1, 1: 1}
    assert {L: overlong_cache_tokens(DAPO, L) for L in expected} == expected
    assert overlong_cache_tokens(CISPO, 32) == 6
    assert overlong_cache_tokens(GRPO, 32) is None  # off
    # the user's case: a correct 2-character answer (+ EOS: 3 tokens) at a budget of 8 is not punished
    assert float(overlong_penalty(torch.tensor([3.0]), max_len=8, cache_len=overlong_cache_tokens(DAPO, 8))) == 0.0
    # a fixed count is kept as given when it fits
    assert overlong_cache_tokens(GRPO.replace(overlong_cache_len=3), 6) == 3


def test_a_fixed_l_cache_that_does_not_fit_fails_clearly(tok):
    from grpo_lab.algo.selection import overlong_cache_tokens

    fixed = DAPO.replace(overlong_cache_frac=None, overlong_cache_len=6)
    assert overlong_cache_tokens(fixed, 12) == 6
    with pytest.raises(ValueError, match=r"overlong_cache_len=6 is too long for max_new_tokens=8.*L_max - L_cache = 2 "
                                         r"tokens.*at most L_max / 2 \(= 4 here\)"):
        overlong_cache_tokens(fixed, 8)
    with pytest.raises(ValueError, match="^Trainer: .*too long.*overlong_cache_frac=0.2"):
        make_trainer(tok, algo=fixed, task=KindTask(test_size=3), max_new_tokens=8)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        overlong_cache_tokens(DAPO, 0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(overlong_cache_frac=0.0), r"overlong_cache_frac .* \(0, 0.5\]"),
    (dict(overlong_cache_frac=0.6), r"\(0, 0.5\]"),
    (dict(overlong_cache_frac=float("nan")), "overlong_cache_frac"),
    (dict(overlong_cache_frac="0.2"), "overlong_cache_frac"),
    (dict(overlong_cache_len=6), "not both"),  # DAPO already holds a fraction
])
def test_overlong_cache_frac_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DAPO.replace(**kwargs)
