"""VAPO where the reward arrives hundreds of tokens after the decision: the regime chapter 6 cannot reach.

    python -m grpo_lab.lab.pretrain arithmetic-long     # once: data/checkpoints/arithmetic-long-base
    python benchmarks/vapo_long.py                  # 5 seeds, writes benchmarks/results/vapo_long.json
    python benchmarks/vapo_long.py --seeds 1 --steps 2 --out /tmp/x.json   # a quick look (the test's)

Chapter 6's responses have a median of 5 tokens, so three of VAPO's changes (length-adaptive GAE,
decoupled GAE, the token-level loss) have nothing to act on there: the reward is never more than a
few tokens from any token, and lengths differ by a factor of about 10. This benchmark trains from
``arithmetic-long-base``: the same arithmetic, but three quarters of its pretraining demonstrations
end with a run of 1-320 dots after the answer, which the reward ignores (the filler variant of
:class:`grpo_lab.tasks.ArithmeticTask`). The answer is decided early and the outcome reward arrives
at the last token, up to 320 tokens later. That is the situation of VAPO §4 (arXiv 2504.05118):
with lambda = 0.95, a token n tokens before the end sees the reward with weight 0.95^(n-1)
(0.006 at n = 100), so its advantage is almost all bootstrapped from the critic.

Before any verdict the script measures, on one batch of the base policy with the pretrained critic,
each change's precondition beside the paper's value (the ``regime`` of the results file). Then it
trains, from the same critic pretrained on the base policy (VAPO §4.1's 50 steps), VAPO (the paper's
alpha = 0.05), the three single-change rows whose preconditions are about length, and VAPO with
GRPO's group advantages in place of GAE (no critic: it isolates the critic's per-token credit); the
same seeds for every setting, greedy test accuracy at the end, paired differences from VAPO. The
policy trains at 1e-4 and the critic at 6e-4 (:data:`POLICY_LR`, :data:`VALUE_LR`): VAPO ended at 0.52
at the CPU profile's 3e-4 and at 0.85 at 1e-4 when the rate was chosen (0.60 and 0.81 since minibatches
hold whole prompt groups), the critic's explained variance falling at both
(``benchmarks/vapo_long_critic.py``, which also tries the 50 pretraining steps alone). That rate was
chosen on VAPO's runs, so the control also trains at 3e-4 and at 5e-5 (:data:`CONTROL_LR`).

It also measures where each estimator puts the credit on that batch: the share of the advantage's
absolute mass on the tokens that decide the answer (everything up to the answer's last digit)
rather than on the dots after it.

What it found (2026-12-07, minibatches holding whole prompt groups; see the results file and chapter 6
§6.9): the length preconditions hold on the base policy (median response 128 tokens, the answer about 124
tokens before the end) and erode in training (VAPO's responses at the last step: 52 to 139 tokens, median
of the runs 75); the length-adaptive and token-level rows are out of the paper's regime by construction
(lambda_policy above 0.95 needs more than 400 tokens; a length ratio of 66, not 100); VAPO's critic does
not keep pace (explained variance 0.43 -> 0.15; its training loss rose too). VAPO ends at 0.809 from the
base's 0.450, level with VAPO with group advantages at the same rate: 0.000 [-0.099, 0.099] (paired, 5
seeds; with minibatches that cut groups at random, 2026-12-04, it was 0.068 [0.025, 0.111]). The control
does best at that rate too (0.809; 0.611 at 5e-5, 0.595 at 3e-4). No single-change row separates from
VAPO. The critic's GAE puts 17% of the advantage mass on the decisive tokens (7% of the tokens) against
8.5% for group advantages.
About 19 min on 2 cores, two at a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from grpo_lab import experiments, lab
from grpo_lab.experiments import stats
from grpo_lab.algo.advantages import AdvantageBatch, length_adaptive_lam
from grpo_lab.algo.algorithms import VAPO
from grpo_lab.policy.models import load_policy
from grpo_lab.paths import checkpoint_dir
from grpo_lab.lab.pretrain import RECIPES, sha256_file
from grpo_lab.tasks import get_task
from grpo_lab.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "vapo_long.json"
BASE = "arithmetic-long-base"
STEPS, EVAL_EVERY, PROMPTS = 16, 8, 8  # 8 questions x 8 responses per step, as chapter 6
PRETRAIN_STEPS = 50  # value pretraining on the frozen base policy: VAPO §4.1's 50 steps (chapter 6's short task: 16)
#: the policy's learning rate on the long task, and the critic's (pretraining and RL): at the CPU profile's 3e-4 VAPO
#: ended at 0.52, at 1e-4 at 0.85 (0.60 and 0.81 with whole groups per minibatch; benchmarks/vapo_long_critic.py;
#: the critic's explained variance fell at both).
#: The critic keeps the 6e-4 at which it learns in pretraining (a slower one learned nothing in 40 steps), six times the policy's where
#: VAPO §5.1 has twice a 1e-6 actor's
POLICY_LR, VALUE_LR = 1e-4, 6e-4
H_FIXED = 1 / (1 - 0.95)  # the horizon of a fixed lambda = 0.95: 20 tokens
SETTINGS = {
    "VAPO": VAPO,
    "w/o length-adaptive GAE": VAPO.replace(name="w/o length-adaptive GAE", lam_alpha=None),
    "w/o decoupled GAE": VAPO.replace(name="w/o decoupled GAE", critic_lam=None),
    "w/o token-level loss": VAPO.replace(name="w/o token-level loss", aggregation="seq_mean_token_mean"),
    "VAPO with group advantages": VAPO.replace(name="VAPO with group advantages", advantage="group"),
    "VAPO with group advantages, policy lr 5e-5": VAPO.replace(name="VAPO with group advantages, policy lr 5e-5",
                                                               advantage="group"),
    "VAPO with group advantages, policy lr 3e-4": VAPO.replace(name="VAPO with group advantages, policy lr 3e-4",
                                                               advantage="group"),
}
#: the control at half the policy's rate: group advantages are z-scored within the group, GAE's are not, so at one
#: learning rate the control takes the larger steps (its mean |advantage| is the larger: ``adv_abs_mean`` in the file);
#: and the rate 1e-4 was chosen on VAPO's runs (benchmarks/vapo_long_critic.py, which tried 3e-4 and 1e-4), so the
#: control gets the same two and a third
CONTROL_LR = {"VAPO with group advantages, policy lr 5e-5": 5e-5, "VAPO with group advantages, policy lr 3e-4": 3e-4}
PAPER_AIME = {"VAPO": 60, "w/o length-adaptive GAE": 45, "w/o decoupled GAE": 33, "w/o token-level loss": 53}


def long_profile(steps: int = STEPS, lr: float = POLICY_LR) -> experiments.Profile:
    """The CPU profile on ``arithmetic-long-base`` and its task (the recipe's filler and 360-token budget), with the
    policy's learning rate ``lr``."""
    cpu = experiments.get_profile("cpu")
    r = RECIPES["arithmetic-long"]
    task_kwargs = {"filler": r.filler, "p_filler": r.p_filler, "max_filler": r.max_filler,
                   "filler_position": r.filler_position, "max_new_tokens": r.max_new_tokens}
    return dataclasses.replace(cpu, name="cpu-long", base=str(checkpoint_dir(BASE)), task_kwargs=task_kwargs,
                               steps=steps, config=dataclasses.replace(cpu.config, prompts_per_step=PROMPTS,
                                                                       eval_every=EVAL_EVERY, lr=lr))


def _decisive_mask(texts: list[str], task, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: the real tokens up to the answer's last digit (one token per character), not the dots
    after it nor EOS."""
    head = torch.tensor([len(t.rstrip(task.filler)) for t in texts])  # characters before the trailing run of dots
    pos = torch.arange(mask.shape[1])[None, :]
    return (pos < head[:, None]) & mask.bool()


def regime(profile, critic: str) -> dict:
    """The preconditions, measured on one batch (seed 100) of the base policy with the pretrained ``critic``."""
    task = get_task(profile.task, **dict(profile.task_kwargs))
    probe = Trainer(*load_policy(profile.base), task, VAPO,
                    dataclasses.replace(profile.config, seed=100, value_init=critic, progress=False))
    batch = probe.collect()
    mask = batch.loss_mask.bool()
    lens = mask.sum(-1).double()  # tokens, EOS included
    decisive = _decisive_mask(batch.rollout.texts, task, batch.loss_mask)
    after = (lens - decisive.sum(-1)).double()  # tokens from the answer's last digit to the end
    view = AdvantageBatch.from_groups(batch.rewards, probe.config.group_size, mask=batch.loss_mask,
                                      values=batch.values)
    credit = {}
    for name, algo in SETTINGS.items():
        if name in ("w/o decoupled GAE", "w/o token-level loss", *CONTROL_LR):  # advantages: VAPO's or the control's
            continue
        adv = algo.estimate_advantages(view)
        adv = (adv[:, None] * batch.loss_mask if adv.dim() == 1 else adv).abs()
        credit[name] = float(adv[decisive].sum() / adv[mask].sum())
    lam_med = float(length_adaptive_lam(lens.median()[None], VAPO.lam_alpha))
    return {"median_length": float(lens.median()), "min_length": float(lens.min()), "max_length": float(lens.max()),
            "length_ratio": float(lens.max() / lens.min()), "fixed_horizon_over_median": H_FIXED / float(lens.median()),
            "median_tokens_after_answer": float(np.median(after.numpy())),
            "share_long_after_answer": float((after >= 100).double().mean()),
            # the reward is n tokens after the answer's last digit: 0.95^n at the median n (numpy's median: the
            # mean of the two middle values; results written before this line used n - 1 and torch's lower median)
            "reward_share_at_answer_lam095_median": float(0.95 ** np.median(after.numpy())),
            "lam_policy_at_median": lam_med,
            "share_lam_policy_above_095": float((length_adaptive_lam(lens, VAPO.lam_alpha) > 0.95).double().mean()),
            "reward_share_first_token_lam095": float((0.95 ** (lens - 1)).mean()),
            "decisive_token_share": float(decisive.sum() / mask.sum()),
            "credit_on_decisive_tokens": credit, "base_batch_accuracy": float(batch.correct.double().mean())}


def _row(name: str, res, vapo, budget: int) -> dict:
    """One setting's results: final greedy accuracy per seed and over seeds, paired difference from VAPO, lengths."""
    final = res.final()
    hist = res.history.dropna(subset=["length"])
    last = hist[hist["step"] == hist["step"].max()]
    row = {"setting": name, "paper_aime24": PAPER_AIME.get(name), "final_accuracy_per_seed": final.round(4).tolist(),
           "final_accuracy": stats.format_interval(stats.t_interval(final, bounds=(0, 1))),
           "base_accuracy": float(res.base().mean()),
           "length_last_step_per_seed": last.groupby("seed")["length"].mean().round(1).tolist(),
           "length_last_step": stats.format_interval(stats.t_interval(last.groupby("seed")["length"].mean(),
                                                                      bounds=(0, budget)), 1)}
    if name != "VAPO" and len(final) >= 2:
        d = stats.paired_difference(final, vapo.final())
        row.update(minus_vapo=stats.format_interval(d), minus_vapo_excludes_0=bool(d.excludes(0.0)))
    if "adv_abs_mean" in hist:  # the advantages' scale: the step size at a given learning rate (mean over steps)
        row["adv_abs_mean_per_seed"] = hist.groupby("seed")["adv_abs_mean"].mean().round(4).tolist()
    if "value_loss" in hist and hist["value_loss"].notna().any():  # the critic's training loss, first and last step
        vloss = hist.dropna(subset=["value_loss"]).groupby(["seed", "step"])["value_loss"].mean().unstack()
        row["value_loss_first_last_per_seed"] = [vloss[vloss.columns.min()].round(5).tolist(),
                                                 vloss[vloss.columns.max()].round(5).tolist()]
    if "explained_variance_mc" in hist and hist["explained_variance_mc"].notna().any():
        ev = hist.dropna(subset=["explained_variance_mc"]).groupby(["seed", "step"])["explained_variance_mc"].mean()
        ev = ev.unstack()
        row["explained_variance_first_last_per_seed"] = [ev[ev.columns.min()].round(4).tolist(),
                                                         ev[ev.columns.max()].round(4).tolist()]
        row["explained_variance_first_last"] = [stats.format_interval(stats.t_interval(ev[ev.columns.min()]), 2),
                                                stats.format_interval(stats.t_interval(ev[ev.columns.max()]), 2)]
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--n-jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    if not (checkpoint_dir(BASE) / "model.safetensors").is_file():
        raise SystemExit(f"{BASE} not found: make it first (python -m grpo_lab.lab.pretrain arithmetic-long)")
    t0 = time.perf_counter()
    prof = long_profile(a.steps)
    value_lr = VALUE_LR
    pretrain_steps = PRETRAIN_STEPS if a.steps >= STEPS else 2  # a quick look pretrains briefly
    critic = str(ROOT / "_build" / f"vapo_long_critic_{pretrain_steps}")  # the run cache hashes its weights
    warm = lab.pretrain_critic((0, "policy", critic), algo=VAPO, profile=prof, steps=pretrain_steps,
                                       value_lr=value_lr)
    reg = regime(prof, critic)
    print(json.dumps(reg, indent=1), flush=True)
    seeds = list(range(a.seeds))
    overrides = {"VAPO with group advantages": {"value_init": "policy"},  # no critic: nothing to load
                 **{k: {"value_init": "policy", "lr": lr} for k, lr in CONTROL_LR.items()}}
    grid = experiments.run_grid(list(SETTINGS.values()), profile=prof, seeds=seeds, steps=a.steps, n_jobs=a.n_jobs,
                                eval_every=min(EVAL_EVERY, a.steps), value_init=critic, value_lr=value_lr,
                                overrides=overrides)
    rows = [_row(n, grid[n], grid["VAPO"], prof.config.max_new_tokens or RECIPES["arithmetic-long"].max_new_tokens)
            for n in SETTINGS]
    for r in rows:
        print(r["setting"], r["final_accuracy"], r.get("minus_vapo", ""), flush=True)
    # what the runs cost from an empty run cache: their own step and evaluation seconds (a cache hit keeps them)
    run_seconds = sum(float(g.history[c].sum()) for g in grid.values() for c in ("step_seconds", "eval_seconds")
                      if c in g.history)
    from_cache = sum(len(g.provenance.get("cached_seeds", [])) for g in grid.values())
    whole = experiments.provenance(VAPO, prof, a.steps, seeds, time.perf_counter() - t0)
    prov = {k: whole[k] for k in ("git_sha", "grpo_lab", "torch", "transformers", "python", "device_name", "date",
                                  "wall_seconds")}
    base_dir = checkpoint_dir(BASE)
    record = json.loads((base_dir / "recipe.json").read_text())
    a.out.write_text(json.dumps({
        "paper": "VAPO Table 1 (AIME 2024 avg@32, Qwen2.5-32B); §4: 0.95^100 = 0.006",
        "base": BASE, "base_weights_sha256": sha256_file(base_dir / "model.safetensors"),
        "base_greedy_accuracy": record["metrics"]["greedy_accuracy"], "seeds": seeds, "steps": a.steps,
        "prompts_per_step": PROMPTS, "group_size": prof.config.group_size, "policy_lr": prof.config.lr, "value_lr": value_lr,
        "value_pretrain_steps": int(warm["value_step"].max()),
        "value_pretrain_explained_variance_last4": float(warm["explained_variance"].tail(4).mean()),
        "test_questions": len(get_task(prof.task, **dict(prof.task_kwargs)).test_set()),
        "regime": reg, "rows": rows, "run_seconds_sum": round(run_seconds, 1), "runs_from_cache": from_cache,
        "n_jobs": a.n_jobs, "provenance": prov}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
