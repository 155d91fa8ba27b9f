"""Tests for grpo_lab.training.trainer: config validation, history, on/off-policy ratios, micro-batch
invariance and exact resume."""

import dataclasses
import json
import math

import pandas as pd
import pytest
import torch

import grpo_lab.tasks as tasks_mod
import grpo_lab.training.trainer as trainer_mod
import grpo_lab.training.update as update_mod
from grpo_lab.algo.objectives import policy_loss
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.policy.models import TinyConfig, build_char_tokenizer, tiny_policy
from grpo_lab.tasks import ArithmeticTask
from grpo_lab.training.trainer import HISTORY_COLUMNS, MEASURED_COLUMNS, Trainer, TrainerConfig

TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)
TIMING = ["tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb"]
DOCUMENTED = ["step", "reward", "accuracy", "length", "length_correct", "length_incorrect", "entropy", "kl",
              "clip_frac_low", "clip_frac_high", "clip_frac", "ratio_mean", "ratio_min", "ratio_max",
              "ratio_q05", "ratio_q50", "ratio_q95", "grad_token_frac", "adv_abs_mean", "grad_norm",
              "zero_adv_group_frac", "truncation_rate", "reasoning_frac", *TIMING[:3]]
NO_NAN = ["loss", "kl", "clip_frac_low", "clip_frac_high", "clip_frac", "ratio_mean", "ratio_min", "ratio_max",
          "ratio_q05", "ratio_q50", "ratio_q95", "grad_norm", "entropy", "reward"]


@dataclasses.dataclass
class ToyTask(ArithmeticTask):
    """Arithmetic prompts with a reward a random policy earns about half the time (first character
    in the first 25 of CHARS), so that groups have non-zero advantages and training moves."""

    name: str = "toy"

    def is_correct(self, completion, problem):
        return len(completion) > 0 and completion[0] in "0123456789+-*=#;.,:? abcd"

    def reward(self, completion, problem):
        return 1.0 if self.is_correct(completion, problem) else 0.0


def make_trainer(tok, algo=GRPO, task=None, loss_fn=policy_loss, **kw):
    cfg = dict(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False, lr=1e-2, seed=0)
    cfg.update(kw)
    return Trainer(tiny_policy(tok, TINY, seed=0), tok, task or ToyTask(test_size=5), algo, TrainerConfig(**cfg),
                   loss_fn=loss_fn)


def params(trainer):
    return [p.detach().clone() for p in trainer.policy.parameters()]


# ------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("kwargs", [
    dict(prompts_per_step=0), dict(group_size=0), dict(epochs=0), dict(minibatches=0),
    dict(prompts_per_step=2, group_size=4, minibatches=3),  # 3 does not divide 8
    dict(micro_batch_size=0), dict(sort_by_length=1), dict(old_logp="bogus"), dict(temperature=0.0), dict(temperature=-1.0),
    # found by a fresh user: each failed late with a raw error, or was accepted and broke training
    dict(grad_clip=0.0), dict(seed=-1), dict(seed=0.5), dict(seed="0"), dict(threads=-1), dict(weight_decay="x"),
    dict(betas=(1.5, 2)), dict(betas=(0.9,)), dict(eval_every=-1), dict(eval_every="5"), dict(warmup=2.5),
    dict(device="tpu"), dict(lr=0.0),
])
def test_config_validation(kwargs):
    with pytest.raises(ValueError, match="TrainerConfig"):
        TrainerConfig(**kwargs)


def test_config_stores_python_numbers():
    import numpy as np

    c = TrainerConfig(micro_batch_size=np.int64(32), lr=np.float32(1e-3), seed=np.int64(3), betas=(np.float64(0.9), 0.99))
    assert type(c.micro_batch_size) is int and type(c.lr) is float and type(c.seed) is int
    assert all(type(b) is float for b in c.betas)
    json.dumps(c.to_dict())  # a numpy scalar would not serialise


def test_config_dict_round_trip():
    c = TrainerConfig(prompts_per_step=3, group_size=2, betas=(0.8, 0.9), minibatches=3, micro_batch_size=2)
    d = json.loads(json.dumps(c.to_dict()))
    assert d["betas"] == [0.8, 0.9]
    assert TrainerConfig.from_dict(d) == c
    assert TrainerConfig.from_dict({**d, "not_a_field": 1}) == c


# ------------------------------------------------------------------------------------ train
def test_two_steps_history(tok):
    tr = make_trainer(tok)
    w0 = params(tr)
    h = tr.train(2)
    assert list(h["step"]) == [1, 2] and tr.step == 2
    missing = [c for c in DOCUMENTED if c not in h]
    assert not missing
    assert "test_accuracy" not in h  # eval_every=0
    assert not h[NO_NAN].isna().any().any()
    assert ((h["reward"] >= 0) & (h["reward"] <= 1)).all()
    assert (h["reward"] == h["accuracy"]).all()  # the toy reward is its correctness
    assert ((h["length"] >= 1) & (h["length"] <= 8)).all()
    # entropy of a 52-way distribution is at most ln 52 = 3.95 nats
    assert ((h["entropy"] > 0) & (h["entropy"] <= math.log(52) + 1e-6)).all()
    assert h["zero_adv_group_frac"].isin([0.0, 0.5, 1.0]).all()  # 2 groups per step
    assert (h["tokens_per_s"] > 0).all() and (h["step_seconds"] >= h["gen_seconds"]).all()
    assert (h["kl"] >= 0).all()  # k3 is non-negative
    # the policy moved (the toy reward gives non-zero advantages)
    assert any(not torch.equal(a, b) for a, b in zip(w0, params(tr)))
    assert tr.history.equals(h)


def test_eval_rows(tok):
    tr = make_trainer(tok, eval_every=2)
    h = tr.train(3)
    # step 0 holds the base policy's evaluation; then every 2 steps and after the last one
    assert list(h["step"]) == [0, 1, 2, 3]
    assert h["test_accuracy"].isna().tolist() == [False, True, False, False]
    assert h["reward"].isna().tolist() == [True, False, False, False]
    assert h["test_accuracy"].dropna().between(0, 1).all()
    assert "test_length" in h and "test_reasoning_frac" in h
    # the evaluation's own wall time, on the evaluated rows only, outside step_seconds
    assert h["eval_seconds"].isna().tolist() == [False, True, False, False]
    assert (h["eval_seconds"].dropna() > 0).all()


def test_evaluate_does_not_advance_torch_rng(tok):
    tr = make_trainer(tok)
    state = torch.random.get_rng_state()
    s = tr.evaluate(greedy=False)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert 0 <= s["accuracy"] <= 1
    assert tr.policy.training  # evaluation hands the policy back in train mode (generate switches to eval)


def test_on_policy_ratio_exactly_one(tok):
    # epochs * minibatches == 1: pi_old = sg(pi_theta), ratio 1 in value, nothing clipped
    h = make_trainer(tok).train(2)
    for c in ["ratio_mean", "ratio_min", "ratio_max", "ratio_q05", "ratio_q50", "ratio_q95"]:
        assert (h[c] == 1.0).all(), c
    for c in ["clip_frac_low", "clip_frac_high", "clip_frac"]:
        assert (h[c] == 0.0).all(), c


class _Recorder:
    """A ``loss_fn`` for ``Trainer(..., loss_fn=)``: policy_loss, recording each call's metrics."""

    def __init__(self):
        self.metrics = []

    def __call__(self, *a, **k):
        out = policy_loss(*a, **k)
        self.metrics.append(out.metrics)
        return out


@pytest.mark.parametrize("kw", [dict(minibatches=2), dict(epochs=2)])
def test_second_update_is_off_policy(tok, monkeypatch, kw):
    rec = _Recorder()
    h = make_trainer(tok, lr=0.05, loss_fn=rec, **kw).train(1)
    assert len(rec.metrics) == 2  # two optimiser steps on one rollout, no micro-batching
    first, second = rec.metrics
    # the first update runs on the sampling weights: pi_old = sg(pi_theta) there, ratio exactly 1
    assert first["ratio_min"] == 1.0 and first["ratio_max"] == 1.0
    # after one update with a large lr the second minibatch / epoch sees the policy moved
    assert max(abs(second["ratio_min"] - 1), abs(second["ratio_max"] - 1)) > 1e-3
    assert h["ratio_min"].iloc[0] == min(first["ratio_min"], second["ratio_min"])
    assert h["ratio_max"].iloc[0] == max(first["ratio_max"], second["ratio_max"])


# (8 rows in every case; four minibatches of whole groups need four groups of 2)
@pytest.mark.parametrize("kw", [dict(minibatches=2), dict(minibatches=4, prompts_per_step=4, group_size=2),
                                dict(epochs=2, minibatches=2),
                                dict(minibatches=2, micro_batch_size=1)])
def test_old_policy_forward_skips_the_first_minibatch(tok, monkeypatch, kw):
    # The old-policy forward runs only on rows that are trained after the first optimiser step;
    # the first minibatch's pi_old is sg(pi_theta) of its own training forward. Hand count: 8 rows,
    # m minibatches -> 8 - 8/m rows of no-grad forward in the first epoch's layout, plus all 8 rows
    # again for a second epoch (reshuffled: a new micro-batch layout, scored in its own layout)
    # (GRPO's default beta adds the reference forward over all 8 rows, so beta=0 here).
    no_grad_rows = []
    orig = update_mod.policy_logprobs

    def counting(model, ro, **k):
        if not torch.is_grad_enabled():
            no_grad_rows.append(len(ro))
        return orig(model, ro, **k)

    monkeypatch.setattr(update_mod, "policy_logprobs", counting)  # where the update calls it
    rec = _Recorder()
    t = make_trainer(tok, algo=GRPO.replace(beta=0.0), lr=0.05, loss_fn=rec, **kw)
    t.train(1)
    assert sum(no_grad_rows) == 8 - 8 // kw["minibatches"] + 8 * (kw.get("epochs", 1) - 1)
    first_step = rec.metrics[: 8 // kw["minibatches"] // (kw.get("micro_batch_size") or 8 // kw["minibatches"])]
    assert all(m["ratio_min"] == 1.0 and m["ratio_max"] == 1.0 for m in first_step)


def test_skipped_rows_keep_their_old_logp_for_later_epochs(tok, monkeypatch):
    # epochs=2: rows of the first minibatch come back in epoch 2 and need pi_old. It must be the
    # sampling policy's log-prob (recorded from the first forward), equal to a fresh no-grad
    # recompute at the sampling weights up to float rounding, not the 0 placeholder.
    seen = []

    def wrapped(logp, old, adv, mask, algo, **k):
        seen.append((old.detach().clone(), mask.clone()))
        return policy_loss(logp, old, adv, mask, algo, **k)

    t = make_trainer(tok, algo=GRPO.replace(beta=0.0), lr=0.05, epochs=2, minibatches=2, loss_fn=wrapped)
    batch = t.collect()
    # pi_old over every row, before any update
    reference = update_mod.logp_chunks(t.policy, batch.rollout, [torch.arange(8)], t.amp)
    t.compute_advantages(batch)
    t.update(batch)
    assert len(seen) == 4
    # epoch 2 sees all 8 rows across its two minibatches; every used pi_old is within 1e-5 of the recompute
    used = torch.cat([o[m.bool()] for o, m in seen[2:]])
    assert used.numel() == int(batch.loss_mask.sum())
    assert (used < 0).all()  # a log-prob of a sampled token, not the 0 placeholder
    assert torch.allclose(torch.sort(used).values,
                          torch.sort(reference[batch.loss_mask.bool()]).values, atol=1e-5)


def test_old_logp_behaviour_matches_recompute(tok, monkeypatch):
    # pi_old from the sampler's log-probs equals the recomputed one up to float noise
    rec = _Recorder()
    make_trainer(tok, old_logp="behaviour", loss_fn=rec).train(1)
    (m,) = rec.metrics
    assert abs(m["ratio_min"] - 1) < 1e-5 and abs(m["ratio_max"] - 1) < 1e-5


@pytest.mark.parametrize("algo", [GRPO, GRPO.replace(name="tm", aggregation="token_mean")])
def test_micro_batches_give_the_same_update(tok, algo, capture_grads):
    # global token/sequence counts: splitting 8 rows into micro-batches of 3, 3, 2 changes nothing
    # (Adam turns a gradient into ~lr * sign(g), so float noise in a near-zero gradient component
    # moves a parameter by up to ~lr * noise / eps: lr=1e-4 keeps that well under the tolerance,
    # while every parameter with a real gradient moves by ~1e-4 >> 1e-6.)
    grads = {}
    results = {}
    w0 = params(make_trainer(tok, algo=algo))
    for micro in (None, 3):
        tr = make_trainer(tok, algo=algo, lr=1e-4, micro_batch_size=micro)
        capture_grads(tr, grads, micro)
        h = tr.train(1)
        results[micro] = (h, params(tr))
    (h1, p1), (h3, p3) = results[None], results[3]
    assert h1["reward"].equals(h3["reward"]) and h1["length"].equals(h3["length"])
    assert abs(h1["grad_norm"].iloc[0] - h3["grad_norm"].iloc[0]) <= 1e-5 * h1["grad_norm"].iloc[0]
    assert h1["grad_norm"].iloc[0] > 0
    for g1, g3 in zip(grads[None], grads[3]):
        torch.testing.assert_close(g3, g1, atol=1e-7, rtol=1e-4)
    for a, b in zip(p1, p3):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
    assert max((a - w).abs().max().item() for a, w in zip(p1, w0)) > 5e-5  # the step did move
    for c in ["entropy", "kl", "ratio_mean", "grad_token_frac", "adv_abs_mean"]:
        assert h3[c].iloc[0] == pytest.approx(h1[c].iloc[0], rel=1e-5, abs=1e-7), c


def test_length_sorted_micro_batches_same_update_less_padding(tok, monkeypatch, capture_grads):
    # sort_by_length regroups a minibatch's rows into micro-batches of similar length: the gradient
    # is the same sum (global normalisers), the forward passes cover fewer padded positions.
    positions, grads = {}, {}
    orig = update_mod.policy_logprobs
    for sort in (False, True):
        positions[sort] = 0

        def counting(model, ro, _sort=sort, **k):
            positions[_sort] += ro.prompt_ids.numel() + ro.completion_ids.numel()
            return orig(model, ro, **k)

        monkeypatch.setattr(update_mod, "policy_logprobs", counting)
        tr = make_trainer(tok, algo=GRPO.replace(beta=0.0), lr=1e-4, micro_batch_size=2, sort_by_length=sort,
                          task=ToyTask(test_size=5, max_new_tokens=16))
        capture_grads(tr, grads, sort)
        tr.train(1)
    assert positions[True] < positions[False]
    for a, b in zip(grads[False], grads[True]):
        torch.testing.assert_close(b, a, atol=1e-7, rtol=1e-4)


def test_logged_loss_independent_of_micro_batches(tok):
    h1 = make_trainer(tok, lr=1e-3).train(1)
    h3 = make_trainer(tok, lr=1e-3, micro_batch_size=3).train(1)
    assert h3["loss"].iloc[0] == pytest.approx(h1["loss"].iloc[0], abs=1e-6)
    assert h3["pg_loss"].iloc[0] == pytest.approx(h1["pg_loss"].iloc[0], abs=1e-6)


# ------------------------------------------------------------------------------------ checkpoints
def test_save_layout(tok, tmp_path, monkeypatch):
    monkeypatch.setitem(tasks_mod.TASKS, "toy", ToyTask)  # task_spec needs a registered task
    tr = make_trainer(tok)
    tr.train(1)
    tr.save(tmp_path)
    for f in ["policy/config.json", "policy/model.safetensors", "policy/tokenizer.json", "ref/model.safetensors",
              "optimizer.pt", "rng.pt", "state.json", "history.json"]:
        assert (tmp_path / f).is_file(), f
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["step"] == 1 and state["task"]["name"] == "toy" and state["algo"]["name"] == "GRPO"
    assert TrainerConfig.from_dict(state["config"]) == tr.config
    opt = torch.load(tmp_path / "optimizer.pt", weights_only=True)  # loads without pickle
    assert len(opt["state"]) == len(list(tr.policy.parameters()))
    rng = torch.load(tmp_path / "rng.pt", weights_only=True)
    assert torch.equal(rng["torch"], torch.random.get_rng_state())
    assert len(json.loads((tmp_path / "history.json").read_text())) == 1


def test_no_reference_without_kl(tok, tmp_path, monkeypatch):
    monkeypatch.setitem(tasks_mod.TASKS, "toy", ToyTask)
    tr = make_trainer(tok, algo=GRPO.replace(name="nokl", beta=0.0))
    assert tr.ref_policy is None
    tr.train(1)
    tr.save(tmp_path)
    assert not (tmp_path / "ref").exists()


def test_resume_requires_state_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="state.json"):
        Trainer.resume(tmp_path)
    with pytest.raises(FileNotFoundError):
        Trainer.resume(tmp_path / "missing")


def _check_exact_resume(tok, tmp_path, monkeypatch, **kw):
    monkeypatch.setitem(tasks_mod.TASKS, "toy", ToyTask)
    straight = make_trainer(tok, lr=1e-2, minibatches=2, **kw)
    straight.train(4)

    first = make_trainer(tok, lr=1e-2, minibatches=2, **kw)
    first.train(2)
    first.save(tmp_path)
    torch.manual_seed(999)  # whatever happens in between must not matter
    resumed = Trainer.resume(tmp_path)
    assert resumed.step == 2 and resumed.task == ToyTask(test_size=5) and resumed.algo == GRPO
    assert resumed.opt_steps == first.opt_steps == 4
    assert resumed.optimizer.state_dict()["state"].keys() == first.optimizer.state_dict()["state"].keys()
    resumed.train(2)

    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)
    ha = straight.history.drop(columns=TIMING, errors="ignore")
    hb = resumed.history.drop(columns=TIMING, errors="ignore")
    assert list(hb["step"]) == [1, 2, 3, 4]
    pd.testing.assert_frame_equal(ha, hb, check_exact=True, check_dtype=False)


def test_exact_resume(tok, tmp_path, monkeypatch):
    _check_exact_resume(tok, tmp_path, monkeypatch)


def test_exact_resume_mid_warmup(tok, tmp_path, monkeypatch):
    # warm-up over 6 optimiser steps: the resumed run (after 4) must continue the same schedule
    _check_exact_resume(tok, tmp_path, monkeypatch, warmup=6)


def test_exact_resume_with_weight_decay_two_param_groups(tok, tmp_path, monkeypatch):
    # weight_decay > 0: two AdamW groups (biases and norm weights undecayed), saved and resumed exactly
    _check_exact_resume(tok, tmp_path, monkeypatch, weight_decay=0.1)
    tr = make_trainer(tok, weight_decay=0.1)
    assert [g["weight_decay"] for g in tr.optimizer.param_groups] == [0.1, 0.0]
    undecayed = {id(p) for p in tr.optimizer.param_groups[1]["params"]}
    names = {n for n, p in tr.policy.named_parameters() if id(p) in undecayed}
    assert names and all(n.endswith("bias") or "norm" in n for n in names)
    assert len(make_trainer(tok).optimizer.param_groups) == 1  # weight_decay = 0: one group, as before


def test_warmup_schedule(tok):
    # lr_k = lr * min(1, k / warmup) for optimiser step k = 0, 1, ... (transformers' convention, as TRL and verl):
    # with lr 1e-2 and warmup 4, three RL steps of two minibatches each use 0, 2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2
    # (hand-computed).
    tr = make_trainer(tok, lr=1e-2, minibatches=2, warmup=4)
    seen = []
    orig = tr.optimizer.step

    def step(*a, **k):
        seen.append(tr.optimizer.param_groups[0]["lr"])
        return orig(*a, **k)

    tr.optimizer.step = step
    tr.train(3)
    assert seen == pytest.approx([0.0, 2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2])
    with pytest.raises(ValueError, match="warmup"):
        TrainerConfig(warmup=-1)


# ------------------------------------------------------------------------------------ reliability (issue 8)
@pytest.mark.parametrize("old_logp,minibatches", [("recompute", 1), ("behaviour", 1), ("recompute", 2)])
def test_dropout_is_off_in_every_forward(tok, tmp_path, old_logp, minibatches):
    # A checkpoint with attention dropout 0.1, GRPO. Before issue 8's fix the loss forward ran in
    # train mode while pi_old/pi_ref were scored in eval mode: the first update saw KL 5.6e-5
    # instead of 0 here, and with the sampler's log-probs as pi_old ratios from 0.941 to 1.016 (the
    # issue's larger model: ratio_min 0.0, clip_frac 0.16, KL 1e8). Since issue 31 the policy trains
    # in train mode (for gradient checkpointing) with its dropout set to 0. It must see ratio 1, no
    # clip and KL 0: on the on-policy step, and (minibatches=2, lr=1e-30: the weights do not move)
    # on the second minibatch, whose pi_old comes from the no-grad forward, where live dropout would
    # show as ratio != 1.
    from grpo_lab.policy.models import load_policy

    model = tiny_policy(tok, TINY, seed=0)
    model.config.attention_dropout = 0.1
    model.save_pretrained(tmp_path / "dropout", safe_serialization=True)
    tok.save_pretrained(tmp_path / "dropout")
    policy, tokenizer = load_policy(tmp_path / "dropout")
    assert policy.config.attention_dropout == 0.1
    policy.train()  # as a user might hand it over
    cfg = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False,
                        lr=1e-2 if minibatches == 1 else 1e-30, seed=0, old_logp=old_logp, minibatches=minibatches)
    tr = Trainer(policy, tokenizer, ToyTask(test_size=5), GRPO, cfg)
    # the dropout is off in the modules and in the config (a checkpoint saved from it reloads without it)
    assert tr.policy.config.attention_dropout == 0.0
    assert all(layer.self_attn.attention_dropout == 0.0 for layer in tr.policy.model.layers)
    h = tr.train(1)
    # recompute: exactly 1; behaviour: generate's cached forward vs the full forward, rounding only
    tol = 0.0 if old_logp == "recompute" else 1e-5
    assert abs(h.loc[0, "ratio_min"] - 1.0) <= tol and abs(h.loc[0, "ratio_max"] - 1.0) <= tol
    assert h.loc[0, "clip_frac"] == 0.0
    assert h.loc[0, "kl"] == 0.0  # the first update: pi_theta == pi_ref exactly
    assert tr.policy.training and not tr.ref_policy.training


@pytest.mark.parametrize("bad", [None, "1.0", [1.0]])
def test_reward_that_is_not_a_number_names_the_sample(tok, bad):
    @dataclasses.dataclass
    class BadTask(ToyTask):
        def reward(self, completion, problem):
            return bad if problem.prompt == self._bad_prompt else 1.0

    task = BadTask(test_size=5)
    tr = make_trainer(tok, task=task)
    ro = tr.rollout()
    task._bad_prompt = ro.problems[5].prompt  # the second group: samples 4..7
    with pytest.raises(TypeError, match=r"sample 4 .*a reward must be a real number"):
        tr.score(ro)


def test_non_finite_reward_names_the_sample(tok):
    @dataclasses.dataclass
    class NanTask(ToyTask):
        def reward(self, completion, problem):
            return float("nan")

    tr = make_trainer(tok, task=NanTask(test_size=5))
    with pytest.raises(ValueError, match=r"sample 0 .*finite"):
        tr.train(1)


def test_reward_types_accepted(tok):
    import numpy as np

    for value in (True, 1, np.float32(0.5), np.int64(1), torch.tensor(0.25)):
        @dataclasses.dataclass
        class T(ToyTask):
            def reward(self, completion, problem, v=value):
                return v

        scored = make_trainer(tok, task=T(test_size=5)).score(make_trainer(tok).rollout())
        assert scored.raw.dtype == torch.float32 and (scored.raw == float(value)).all()


@pytest.mark.parametrize("content,match", [
    ("{not json", "not valid JSON"),
    ('{"step": 2}', "lacks"),
    ("[]", "lacks"),
])
def test_corrupt_state_json_names_the_file(tok, tmp_path, monkeypatch, content, match):
    monkeypatch.setitem(tasks_mod.TASKS, "toy", ToyTask)
    tr = make_trainer(tok)
    tr.train(1)
    tr.save(tmp_path)
    (tmp_path / "state.json").write_text(content)
    with pytest.raises(ValueError, match=match) as err:
        Trainer.resume(tmp_path)
    assert str(tmp_path / "state.json") in str(err.value)


def test_corrupt_history_json_names_the_file(tok, tmp_path, monkeypatch):
    monkeypatch.setitem(tasks_mod.TASKS, "toy", ToyTask)
    tr = make_trainer(tok)
    tr.save(tmp_path)
    (tmp_path / "history.json").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(ValueError, match="history.json"):
        Trainer.resume(tmp_path)


def test_save_with_unregistered_task_resumes_with_task_argument(tok, tmp_path):
    # issue 15: an unregistered task saves (it used to be refused); resume then asks for task=
    tr = make_trainer(tok)  # ToyTask is not registered here
    ck = tr.save(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="task="):
        Trainer.resume(ck)
    assert Trainer.resume(ck, task=ToyTask(test_size=5)).task == ToyTask(test_size=5)


# ------------------------------------------------------------------------------------ found by a fresh user
def test_train_steps_must_be_a_non_negative_int(tok):
    tr = make_trainer(tok)
    for bad in (1.5, -1, "2"):
        with pytest.raises(ValueError, match="steps"):
            tr.train(bad)


def test_algo_by_preset_name_or_clear_error(tok):
    assert make_trainer(tok, algo="DAPO").algo.name == "DAPO"
    with pytest.raises(ValueError, match="unknown algorithm|preset"):
        make_trainer(tok, algo="NOPE")
    with pytest.raises(ValueError, match="Algorithm"):
        make_trainer(tok, algo=3)


def test_non_finite_gradient_stops_before_the_update(tok, monkeypatch):
    from grpo_lab.algo.objectives import SURROGATES

    def nan_surrogate(ctx):
        none = torch.zeros_like(ctx.mask)
        loss = -torch.exp(ctx.log_ratio) * ctx.advantages + 0 * torch.sqrt(ctx.log_ratio - 1)  # sqrt(-1): NaN
        return loss, {"clip_low": none, "clip_high": none, "grad": ctx.mask}

    monkeypatch.setitem(SURROGATES, "nan", nan_surrogate)
    tr = make_trainer(tok, algo=GRPO.replace(surrogate="nan", kl=None, beta=0.0))
    w0 = params(tr)
    with pytest.raises(FloatingPointError, match="non-finite policy gradient norm.*'nan'"):
        tr.train(1)
    assert all(torch.equal(a, b) for a, b in zip(w0, params(tr)))  # nothing was applied


def test_resume_without_ref_is_refused_when_the_loss_has_kl(tok, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setitem(tasks_mod.TASKS, "toy", ToyTask)
    tr = make_trainer(tok)  # GRPO, beta 0.04: a reference is kept
    tr.train(1)
    tr.save(tmp_path / "ck")
    shutil.rmtree(tmp_path / "ck" / "ref")
    with pytest.raises(ValueError, match="no ref/"):
        Trainer.resume(tmp_path / "ck")


@pytest.mark.parametrize("damage", ["missing optimizer.pt", "garbage rng.pt", "history.json {}", "step x"])
def test_damaged_checkpoint_files_are_named(tok, tmp_path, monkeypatch, damage):
    monkeypatch.setitem(tasks_mod.TASKS, "toy", ToyTask)
    tr = make_trainer(tok)
    tr.train(1)
    ck = tr.save(tmp_path / "ck")
    if damage == "missing optimizer.pt":
        (ck / "optimizer.pt").unlink()
        name = "optimizer.pt"
    elif damage == "garbage rng.pt":
        (ck / "rng.pt").write_bytes(b"not a tensor file")
        name = "rng.pt"
    elif damage == "history.json {}":
        (ck / "history.json").write_text("{}")
        name = "history.json"
    else:
        state = json.loads((ck / "state.json").read_text())
        state["step"] = "x"
        (ck / "state.json").write_text(json.dumps(state))
        name = "state.json"
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        Trainer.resume(ck)


def test_save_is_atomic(tok, tmp_path, monkeypatch):
    # a crash while saving step 2 over the step-1 checkpoint leaves the step-1 checkpoint whole
    monkeypatch.setitem(tasks_mod.TASKS, "toy", ToyTask)
    tr = make_trainer(tok)
    tr.train(1)
    ck = tr.save(tmp_path / "ck")
    tr.train(1)
    real_save = torch.save

    def failing_save(obj, f, *a, **k):
        if str(f).endswith("optimizer.pt"):
            raise OSError("disk full")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        tr.save(ck)
    monkeypatch.setattr(torch, "save", real_save)
    resumed = Trainer.resume(ck)
    assert resumed.step == 1 and len(resumed.rows) == 1
    tr.save(ck)  # a later save replaces it and leaves no temporary directory behind
    assert Trainer.resume(ck).step == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


# ------------------------------------------------------------------------------------ layout
def test_loss_fn_is_the_loss_the_update_calls(tok):
    # the seam chapter 3 records the loss's inputs through: Trainer(..., loss_fn=) replaces policy_loss in the
    # update, with policy_loss's arguments; a loss_fn that returns policy_loss's output trains identically
    calls = []

    def recording(logp, old_logp, advantages, mask, algo, **kwargs):
        calls.append(sorted(kwargs))
        return policy_loss(logp, old_logp, advantages, mask, algo, **kwargs)

    plain = make_trainer(tok, minibatches=2).train(2)
    recorded = make_trainer(tok, minibatches=2, loss_fn=recording).train(2)
    assert len(calls) == 4 and {"num_tokens", "group_tokens", "ref_logp", "max_tokens"} <= set(calls[0])
    measured = [c for c in MEASURED_COLUMNS if c in plain]
    pd.testing.assert_frame_equal(plain.drop(columns=measured), recorded.drop(columns=measured))
    with pytest.raises(TypeError, match="loss_fn must be a callable"):
        make_trainer(tok, loss_fn="policy_loss")


@pytest.mark.parametrize("wrong, message", [
    (lambda *a, **k: policy_loss(*a, **k).loss, "returned Tensor; it must return what policy_loss returns"),
    (lambda *a, **k: tuple(policy_loss(*a, **k)), "returned tuple"),
    (lambda *a, **k: type(policy_loss(*a, **k))(torch.tensor(0.0), {}), "does not require grad"),
])
def test_a_loss_fn_with_the_wrong_output_is_named_at_the_first_update(tok, wrong, message):
    # found by a fresh user: these failed mid-step with an AttributeError or torch's own message, naming no loss_fn
    with pytest.raises(TypeError, match=r"Trainer\(loss_fn=<lambda>\)") as info:
        make_trainer(tok, loss_fn=wrong).train(1)
    assert message in str(info.value)


def test_resume_takes_the_loss_fn_again(tok, tmp_path):
    # a checkpoint does not store the loss_fn: resume(loss_fn=) passes it again, and without it the default is used
    calls = []

    def recording(*args, **kwargs):
        calls.append(1)
        return policy_loss(*args, **kwargs)

    tr = make_trainer(tok, loss_fn=recording)
    tr.train(1)
    tr.save(tmp_path / "ck")
    assert Trainer.resume(tmp_path / "ck", task=tr.task, loss_fn=recording).loss_fn is recording
    assert Trainer.resume(tmp_path / "ck", task=tr.task).loss_fn is policy_loss


@pytest.mark.parametrize("algo, kw", [(GRPO, dict(eval_every=1, eval_sampled=True, minibatches=2)),
                                      ("VAPO", dict(value_init="scratch")), ("GSPO", {}), ("DAPO", {})])
def test_every_history_column_is_described(tok, algo, kw):
    # HISTORY_COLUMNS is the documentation of Trainer.train's rows: every column a run writes is in it
    h = make_trainer(tok, algo=algo, **kw).train(2)
    undescribed = sorted(set(h.columns) - set(HISTORY_COLUMNS))
    assert not undescribed, f"history columns without a description in HISTORY_COLUMNS: {undescribed}"
    assert set(MEASURED_COLUMNS) <= set(HISTORY_COLUMNS)


def test_public_names_keep_their_import_path():
    # documented, pickled and shown under grpo_lab.training.trainer, wherever they are defined
    for name in ("Trainer", "TrainerConfig", "Batch", "Scored", "ValueModel"):
        assert getattr(trainer_mod, name).__module__ == "grpo_lab.training.trainer", name
    assert set(trainer_mod.__all__) <= set(vars(trainer_mod))


def test_eval_batch_size_reaches_evaluate(tok, monkeypatch):
    """TrainerConfig.eval_batch_size (default 256, evaluate's own default) is the batch of every evaluation the
    trainer runs, greedy and sampled; the GPU profile sets 64; a non-positive or non-int value is refused."""
    import grpo_lab.training.history as history_mod
    from grpo_lab.experiments import gpu_profile

    assert TrainerConfig().eval_batch_size == 256 and gpu_profile(environ={}).config.eval_batch_size == 64
    for bad in (0, -3, 2.5, True, None):
        with pytest.raises(ValueError, match="eval_batch_size must be a positive int"):
            TrainerConfig(eval_batch_size=bad)
    seen = []
    real = history_mod.evaluate

    def spy(*args, **kw):
        seen.append((kw["greedy"], kw["batch_size"]))
        return real(*args, **kw)

    monkeypatch.setattr(history_mod, "evaluate", spy)
    tr = make_trainer(tok, eval_every=1, eval_sampled=True, eval_batch_size=2)
    tr.train(1)
    assert seen == [(True, 2), (False, 2)] * 2  # before step 1 and after it
