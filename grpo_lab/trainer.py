"""One trainer for every algorithm: rollout → reward → advantage → μ updates → metrics.

The trainer knows the algorithmic axes only through an :class:`grpo_lab.algorithms.Algorithm`:
it computes advantages with ``algo``, and the loss with
:func:`grpo_lab.objectives.policy_loss` (ratio, clipping, KL and aggregation all live there).
What it owns is the plumbing: sampling groups, recomputing π_old and π_ref log-probs,
splitting a rollout into minibatches and micro-batches with *global* token/sequence counts (so
the gradient does not depend on how the batch is split), logging, checkpointing and exact
resume.

π_old: with ``epochs=1, minibatches=1`` the update is on-policy and the ratio is 1 in value;
clipping only acts when the same rollout is used for more than one optimiser step (``epochs`` ×
``minibatches`` > 1) or when π_old differs from the training forward (``old_logp="behaviour"``
uses the log-probs recorded by ``generate``).

Sampling & shaping (DAPO, arXiv 2503.14476, §3.2 and §3.4), switched on by the algorithm:
``overlong_cache_len`` adds the soft overlong penalty (Eq. 13, ``L_max`` = ``max_new_tokens``) to
the task reward; ``overlong_filter`` masks truncated samples out of the loss; ``dynamic_sampling``
(Eq. 11) generates up to ``max_gen_rounds`` rollouts per step and trains only on groups whose raw
accuracy is strictly between 0 and 1. Raw correctness (``task.is_correct``) stays separate from
the shaped reward: accuracy and the dynamic-sampling filter use it.
"""

from __future__ import annotations

import copy
import json
import math
import random
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from .algorithms import Algorithm
from .objectives import policy_loss
from .rewards import overlong_penalty
from .rollout import Rollout, evaluate, generate, policy_logprobs

__all__ = ["TrainerConfig", "Trainer"]


@dataclass(frozen=True)
class TrainerConfig:
    """How a run samples and updates (everything that is not the algorithm or the task).

    Attributes:
        prompts_per_step: questions per rollout.
        group_size: G, responses per question (rollout has ``prompts_per_step * G`` rows).
        max_new_tokens: generation budget (default: the task's).
        temperature: sampling temperature (log-probs are computed at the same temperature).
        lr, weight_decay, betas, grad_clip: AdamW and global-norm clipping.
        warmup: optimiser steps of linear learning-rate warm-up (Adam's first steps move every
            parameter by about ``lr`` whatever its gradient, which can collapse a token's
            probability in a tiny model; a short warm-up avoids it).
        epochs: μ passes over each rollout.
        minibatches: optimiser steps per pass (each on ``B / minibatches`` rows).
        micro_batch_size: rows per forward/backward inside a minibatch (gradient accumulation
            with global token counts); ``None`` = the whole minibatch.
        old_logp: ``"recompute"`` (π_old = the policy before this rollout's first update,
            recomputed by a forward pass) or ``"behaviour"`` (the sampler's log-probs).
        eval_every: greedy test accuracy every this many steps (and before the first and after
            the last step); 0 disables.
        eval_sampled: also measure sampled accuracy (temperature ``temperature``, 1 sample).
        seed: seeds python, numpy (prompt sampling) and torch (initial state, sampling).
        device: ``"cpu"`` / ``"cuda"``.
        threads: torch intra-op threads (``None`` leaves the setting alone).
        progress: tqdm bar; ``None`` = only when stderr is a terminal and not under CI.
        max_gen_rounds: dynamic sampling (DAPO Eq. 11) only: at most this many rollouts of
            ``prompts_per_step`` questions per step while collecting ``prompts_per_step`` groups
            of mixed accuracy (verl's ``max_num_gen_batches``).
        on_gen_rounds_exhausted: what happens when ``max_gen_rounds`` rollouts did not yield
            enough mixed groups: ``"warn"`` (a ``RuntimeWarning``; train on the groups collected,
            or skip the update when there are none) or ``"error"`` (``RuntimeError``).
    """

    prompts_per_step: int = 16
    group_size: int = 8
    max_new_tokens: int | None = None
    temperature: float = 1.0
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.99)
    grad_clip: float = 1.0
    warmup: int = 0
    epochs: int = 1
    minibatches: int = 1
    micro_batch_size: int | None = None
    old_logp: str = "recompute"
    eval_every: int = 10
    eval_sampled: bool = False
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    progress: bool | None = None
    max_gen_rounds: int = 8
    on_gen_rounds_exhausted: str = "warn"

    def __post_init__(self):
        if self.prompts_per_step < 1 or self.group_size < 1:
            raise ValueError("TrainerConfig: prompts_per_step and group_size must be >= 1")
        if self.epochs < 1 or self.minibatches < 1:
            raise ValueError("TrainerConfig: epochs and minibatches must be >= 1")
        if (self.prompts_per_step * self.group_size) % self.minibatches:
            raise ValueError(
                f"TrainerConfig: minibatches={self.minibatches} does not divide the rollout size "
                f"{self.prompts_per_step * self.group_size}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError("TrainerConfig: micro_batch_size must be >= 1")
        if self.old_logp not in ("recompute", "behaviour"):
            raise ValueError(f"TrainerConfig: old_logp must be 'recompute' or 'behaviour', got {self.old_logp!r}")
        if self.temperature <= 0:
            raise ValueError("TrainerConfig: temperature must be > 0")
        if self.warmup < 0:
            raise ValueError("TrainerConfig: warmup must be >= 0")
        if isinstance(self.max_gen_rounds, bool) or not isinstance(self.max_gen_rounds, int) \
                or self.max_gen_rounds < 1:
            raise ValueError(f"TrainerConfig: max_gen_rounds must be an int >= 1, got {self.max_gen_rounds!r}")
        if self.on_gen_rounds_exhausted not in ("warn", "error"):
            raise ValueError("TrainerConfig: on_gen_rounds_exhausted must be 'warn' or 'error', "
                             f"got {self.on_gen_rounds_exhausted!r}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainerConfig":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = float(mask.sum())
    return float((x * mask).sum() / n) if n > 0 else 0.0


def _nanmean(xs) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(xs)) if xs else float("nan")


class Trainer:
    """GRPO-family trainer for a ``transformers`` causal LM.

    Args:
        policy: the causal LM to train (updated in place).
        tokenizer: its tokenizer.
        task: a :class:`grpo_lab.tasks.base.Task`.
        algo: the :class:`grpo_lab.algorithms.Algorithm`.
        config: a :class:`TrainerConfig`.
        ref_policy: the KL reference; default a frozen copy of ``policy`` at construction
            (only created when ``algo`` has a KL term).

    ``train(steps)`` returns the history DataFrame (one row per step); ``save(path)`` and
    ``Trainer.resume(path)`` checkpoint and continue exactly.
    """

    def __init__(self, policy, tokenizer, task, algo: Algorithm, config: TrainerConfig | None = None,
                 *, ref_policy=None):
        self.config = config or TrainerConfig()
        self.algo = algo
        self.task = task
        self.tokenizer = tokenizer
        c = self.config
        if c.threads:
            torch.set_num_threads(c.threads)
        self.policy = policy.to(c.device)
        self.policy.train()
        self.uses_kl = algo.kl is not None and algo.beta > 0
        if self.uses_kl:
            self.ref_policy = (ref_policy if ref_policy is not None else copy.deepcopy(policy)).to(c.device)
            self.ref_policy.eval()
            for p in self.ref_policy.parameters():
                p.requires_grad_(False)
        else:
            self.ref_policy = None
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=c.lr, weight_decay=c.weight_decay,
                                           betas=tuple(c.betas))
        self.step = 0
        self.opt_steps = 0
        self.rows: list[dict] = []
        self.max_new_tokens = c.max_new_tokens or task.max_new_tokens
        if algo.overlong_cache_len is not None and algo.overlong_cache_len > self.max_new_tokens:
            raise ValueError(
                f"Trainer: algo.overlong_cache_len (L_cache={algo.overlong_cache_len}) exceeds the generation "
                f"budget max_new_tokens (L_max={self.max_new_tokens}); DAPO Eq. 13 needs L_cache <= L_max")
        if algo.dynamic_sampling and c.group_size < 2:
            raise ValueError("Trainer: dynamic sampling needs group_size >= 2 (a group of one is never "
                             "of mixed accuracy)")
        random.seed(c.seed)
        self.rng = np.random.default_rng(c.seed)
        torch.manual_seed(c.seed)

    # ------------------------------------------------------------------ public API
    @property
    def history(self) -> pd.DataFrame:
        """One row per step (see :meth:`train`)."""
        return pd.DataFrame(self.rows)

    def evaluate(self, *, greedy: bool = True) -> dict:
        """Test-set accuracy now (does not advance any training RNG: the torch RNG state is
        saved and restored around sampled evaluation)."""
        state = torch.random.get_rng_state()
        try:
            summary, _ = evaluate(self.policy, self.tokenizer, self.task, greedy=greedy,
                                  temperature=self.config.temperature, max_new_tokens=self.max_new_tokens)
        finally:
            torch.random.set_rng_state(state)
            self.policy.train()
        return summary

    def train(self, steps: int) -> pd.DataFrame:
        """Run ``steps`` more steps; returns the whole history.

        Columns: ``step``, ``reward``, ``accuracy`` (train samples, raw correctness),
        ``length``, ``length_correct``, ``length_incorrect`` (tokens incl. EOS; NaN when a step
        has no correct/incorrect sample), ``entropy`` (nats/token), ``kl`` (NaN when the algorithm
        has no KL term: no reference model is kept), ``clip_frac_low``,
        ``clip_frac_high``, ``clip_frac``, ``ratio_mean/min/max``, ``ratio_q05/q50/q95``,
        ``grad_token_frac``, ``adv_abs_mean``, ``grad_norm`` (before clipping),
        ``zero_adv_group_frac`` (groups whose rewards are all equal), ``truncation_rate``,
        ``reasoning_frac`` (tasks that define it), ``tokens_per_s`` (generated tokens / step
        wall time), ``gen_seconds``, ``step_seconds``, ``test_accuracy`` and
        ``test_length`` (greedy, NaN on steps without evaluation; the row of step ``k`` holds
        the evaluation *after* ``k`` updates, step 0 the base policy); then the sampling &
        shaping columns ``gen_rounds`` (rollouts generated this step), ``trained_groups``,
        ``samples_per_trained`` (generated samples / samples in the update batch; NaN when the
        update was skipped) and ``overlong_frac_penalised`` (generated samples with a negative
        overlong penalty; 0 when the penalty is off).

        Which samples each column describes: ``reward``, ``accuracy``, the lengths,
        ``reasoning_frac``, ``zero_adv_group_frac``, ``truncation_rate``, ``tokens_per_s`` and
        ``gen_seconds`` cover **every** sample generated in the step (with dynamic sampling, all
        rounds, before filtering, so they describe the policy, not the filtered batch); the
        loss, ratio, clip, KL, entropy and gradient columns cover the tokens of the update batch
        that enter the loss (overlong filtering removes truncated rows). ``reward`` is
        the shaped reward (task reward + overlong penalty), ``accuracy`` the raw correctness.
        A step whose dynamic sampling kept no group (``on_gen_rounds_exhausted="warn"``) makes no
        update: ``trained_groups`` is 0 and the update columns are NaN.
        """
        c = self.config
        end = self.step + steps
        if self.step == 0 and c.eval_every and not self.rows:
            self.rows.append(self._eval_row())
        bar = None
        show = c.progress if c.progress is not None else (sys.stderr.isatty() and not _under_ci())
        if show:
            from tqdm.auto import tqdm
            bar = tqdm(total=steps, desc=f"{self.algo.name} seed {c.seed}", mininterval=1.0)
        while self.step < end:
            row = self._train_step()
            self.step += 1
            row["step"] = self.step
            if c.eval_every and (self.step % c.eval_every == 0 or self.step == end):
                row.update({k: v for k, v in self._eval_row().items() if k != "step"})
            self.rows.append(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward']:.2f}", len=f"{row['length']:.1f}")
        if bar is not None:
            bar.close()
        return self.history

    # ------------------------------------------------------------------ internals
    def _eval_row(self) -> dict:
        row = {"step": self.step}
        s = self.evaluate(greedy=True)
        row["test_accuracy"] = s["accuracy"]
        row["test_length"] = s["mean_length"]
        if "reasoning_frac" in s:
            row["test_reasoning_frac"] = s["reasoning_frac"]
        if self.config.eval_sampled:
            s2 = self.evaluate(greedy=False)
            row["test_accuracy_sampled"] = s2["accuracy"]
        return row

    def rollout(self) -> Rollout:
        """Sample one rollout (``prompts_per_step`` questions × G responses) with the current policy."""
        c = self.config
        problems = self.task.sample(c.prompts_per_step, self.rng)
        return generate(self.policy, self.tokenizer, problems, group_size=c.group_size,
                        max_new_tokens=self.max_new_tokens, temperature=c.temperature)

    def _score(self, ro: Rollout):
        """``(rewards [B] float32, correct [B] bool, penalty [B] float32 | None)`` of a rollout:
        the task reward plus, when ``algo.overlong_cache_len`` is set, DAPO's soft overlong
        penalty (Eq. 13, ``L_max = max_new_tokens``); ``correct`` is the raw correctness."""
        rewards = torch.tensor([self.task.reward(t, p) for t, p in zip(ro.texts, ro.problems)], dtype=torch.float32)
        correct = torch.tensor([bool(self.task.is_correct(t, p)) for t, p in zip(ro.texts, ro.problems)])
        penalty = None
        if self.algo.overlong_cache_len is not None:
            penalty = overlong_penalty(ro.lengths.cpu(), max_len=self.max_new_tokens,
                                       cache_len=self.algo.overlong_cache_len)
            rewards = rewards + penalty
        return rewards, correct, penalty

    def _collect(self):
        """Generate this step's rollouts and pick the rows to train on.

        Returns ``(train_ro | None, train_rewards | None, generated)`` where ``generated`` lists
        every rollout sampled this step with its rewards, correctness and penalty (for metrics).
        Without dynamic sampling this is one rollout, trained on whole. With it (DAPO Eq. 11),
        rollouts of ``prompts_per_step`` questions are drawn until ``prompts_per_step`` groups of
        raw accuracy strictly between 0 and 1 are kept (extras of the last round are dropped) or
        ``max_gen_rounds`` rollouts were drawn.
        """
        c, G = self.config, self.config.group_size
        generated = []
        if not self.algo.dynamic_sampling:
            ro = self.rollout()
            rewards, correct, penalty = self._score(ro)
            generated.append((ro, rewards, correct, penalty))
            return ro, rewards, generated
        kept_ro, kept_r, n_kept = [], [], 0
        while n_kept < c.prompts_per_step and len(generated) < c.max_gen_rounds:
            ro = self.rollout()
            rewards, correct, penalty = self._score(ro)
            generated.append((ro, rewards, correct, penalty))
            acc = correct.float().view(-1, G).mean(1)
            groups = ((acc > 0) & (acc < 1)).nonzero().flatten().tolist()[: c.prompts_per_step - n_kept]
            if groups:
                rows = torch.tensor([g * G + j for g in groups for j in range(G)], dtype=torch.long)
                kept_ro.append(ro.select(rows))
                kept_r.append(rewards[rows])
                n_kept += len(groups)
        if n_kept < c.prompts_per_step:
            msg = (f"dynamic sampling: only {n_kept} of prompts_per_step={c.prompts_per_step} groups had mixed "
                   f"accuracy (0 < acc < 1) after max_gen_rounds={c.max_gen_rounds} rollouts at step {self.step + 1}")
            if c.on_gen_rounds_exhausted == "error":
                raise RuntimeError(msg + "; raise TrainerConfig.max_gen_rounds or set on_gen_rounds_exhausted='warn'")
            warnings.warn(msg + ("; training on those groups" if n_kept else "; skipping this step's update")
                          + " (TrainerConfig.max_gen_rounds bounds the extra generation)", RuntimeWarning,
                          stacklevel=3)
        if not n_kept:
            return None, None, generated
        return _concat_rollouts(kept_ro, self.tokenizer.pad_token_id), torch.cat(kept_r), generated

    def _train_step(self) -> dict:
        c, algo = self.config, self.algo
        t0 = time.perf_counter()
        ro, rewards, generated = self._collect()
        metric_acc: dict[str, list] = {}
        grad_norms, entropies = [], []
        n_updates = 0
        if ro is not None:
            B = len(ro)
            adv = algo.advantages(rewards, c.group_size).to(c.device)
            mask = ro.completion_mask
            # the loss mask: DAPO's overlong filtering drops truncated rows from the loss and its counts
            keep = (~ro.truncated).to(mask.dtype) if algo.overlong_filter else None
            loss_mask = mask * keep[:, None] if keep is not None else mask
            n_mb = min(c.minibatches, B)  # fewer rows than configured only when dynamic sampling fell short
            with torch.no_grad():
                if c.old_logp == "behaviour":
                    old_logp = ro.behaviour_logp
                elif c.epochs * n_mb > 1:
                    old_logp = self._logp_batched(self.policy, ro)
                else:
                    old_logp = None  # on-policy: π_old = sg(π_θ), filled in per micro-batch
                ref_logp = self._logp_batched(self.ref_policy, ro) if self.uses_kl else None

            bounds = [(m * B) // n_mb for m in range(n_mb + 1)]  # = m * B / minibatches when it divides
            micro = c.micro_batch_size or (B // n_mb)
            gen = torch.Generator().manual_seed(int(self.rng.integers(2**62)))
            for epoch in range(c.epochs):
                order = torch.randperm(B, generator=gen) if c.minibatches > 1 else torch.arange(B)
                for m in range(n_mb):
                    idx = order[bounds[m]:bounds[m + 1]]
                    n_tok = float(loss_mask[idx].sum())
                    n_seq = float((loss_mask[idx].sum(-1) > 0).sum())
                    if n_tok == 0:  # every row of this minibatch was filtered out: nothing to learn
                        continue
                    self.optimizer.zero_grad(set_to_none=True)
                    for s in range(0, len(idx), micro):
                        sub = idx[s:s + micro]
                        part = ro.select(sub)
                        T = part.completion_ids.shape[1]
                        part_mask = part.completion_mask if keep is None else part.completion_mask * keep[sub][:, None]
                        logp, ent = policy_logprobs(self.policy, part, with_entropy=True)
                        if epoch == 0:
                            entropies.append((float((ent * part_mask).sum()), float(part_mask.sum())))
                        old = logp.detach() if old_logp is None else old_logp[sub, :T]
                        ref = ref_logp[sub, :T] if ref_logp is not None else None
                        out = policy_loss(logp, old, adv[sub], part_mask, algo, ref_logp=ref,
                                          num_tokens=n_tok, num_sequences=n_seq, max_tokens=self.max_new_tokens)
                        out.loss.backward()
                        w = float(part_mask.sum()) / max(n_tok, 1.0)
                        for k, v in out.metrics.items():
                            if w == 0 and k in ("ratio_min", "ratio_max"):
                                continue  # an all-filtered micro-batch reports the neutral ratio 1
                            metric_acc.setdefault(k, []).append((v, w))
                    gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), c.grad_clip)
                    grad_norms.append(float(gn))
                    for group in self.optimizer.param_groups:
                        group["lr"] = c.lr * min(1.0, (self.opt_steps + 1) / c.warmup) if c.warmup else c.lr
                    self.optimizer.step()
                    self.opt_steps += 1
                    n_updates += 1

        step_seconds = time.perf_counter() - t0
        G = c.group_size
        all_ro = [g[0] for g in generated]
        all_rewards = torch.cat([g[1] for g in generated])
        correct = torch.cat([g[2] for g in generated])
        lengths = torch.cat([r.lengths.float().cpu() for r in all_ro])
        truncated = torch.cat([r.truncated.cpu() for r in all_ro])
        g = all_rewards.view(-1, G)
        zero_adv = float((g.max(1).values == g.min(1).values).float().mean())
        n_trained = len(ro) if ro is not None else 0
        penalties = [p for _, _, _, p in generated if p is not None]
        row = {
            "reward": float(all_rewards.mean()),
            "accuracy": float(correct.float().mean()),
            "length": float(lengths.mean()),
            "length_correct": float(lengths[correct].mean()) if correct.any() else float("nan"),
            "length_incorrect": float(lengths[~correct].mean()) if (~correct).any() else float("nan"),
            "entropy": (sum(e for e, _ in entropies) / max(sum(n for _, n in entropies), 1.0)
                        if entropies else float("nan")),
            "grad_norm": float(np.mean(grad_norms)) if grad_norms else float("nan"),
            "zero_adv_group_frac": zero_adv,
            "truncation_rate": float(truncated.float().mean()),
            "tokens_per_s": sum(float(r.completion_mask.sum()) for r in all_ro) / step_seconds,
            "gen_seconds": sum(r.gen_seconds for r in all_ro),
            "step_seconds": step_seconds,
        }
        if hasattr(self.task, "is_reasoning"):
            row["reasoning_frac"] = float(np.mean([self.task.is_reasoning(t) for r in all_ro for t in r.texts]))
        for k, vals in metric_acc.items():
            if k in ("loss", "pg_loss", "num_tokens", "num_sequences"):
                # micro-batch losses are normalised by the global counts: they add up
                row[k] = sum(v for v, _ in vals) / n_updates
            elif k in ("ratio_min",):
                row[k] = min(v for v, _ in vals)
            elif k in ("ratio_max",):
                row[k] = max(v for v, _ in vals)
            else:  # token-weighted mean over micro-batches, averaged over updates
                row[k] = sum(v * w for v, w in vals) / n_updates
        if self.ref_policy is None:
            row["kl"] = float("nan")  # no reference model is kept without a KL term: not measured
        # sampling & shaping (DAPO): generation rounds, oversampling factor, penalised fraction
        row["gen_rounds"] = len(generated)
        row["trained_groups"] = n_trained // G
        row["samples_per_trained"] = len(lengths) / n_trained if n_trained else float("nan")
        row["overlong_frac_penalised"] = float((torch.cat(penalties) < 0).float().mean()) if penalties else 0.0
        return row

    @torch.no_grad()
    def _logp_batched(self, model, ro: Rollout) -> torch.Tensor:
        c = self.config
        B = len(ro)
        micro = c.micro_batch_size or B
        T = ro.completion_ids.shape[1]
        out = torch.zeros(B, T, device=ro.completion_ids.device)
        was = model.training
        model.eval()
        for s in range(0, B, micro):
            idx = torch.arange(s, min(B, s + micro))
            part = ro.select(idx)
            lp = policy_logprobs(model, part)
            out[idx, : lp.shape[1]] = lp
        if was:
            model.train()
        return out

    # ------------------------------------------------------------------ checkpointing
    def save(self, path: str | Path) -> Path:
        """Write a checkpoint directory: ``policy/`` (safetensors + tokenizer), ``ref/``
        (safetensors, when a KL reference exists), ``optimizer.pt``, ``rng.pt``, ``state.json``
        (step, config, algorithm, task spec, numpy RNG state) and ``history.json``."""
        from .tasks import task_spec

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.policy.save_pretrained(path / "policy", safe_serialization=True)
        self.tokenizer.save_pretrained(path / "policy")
        if self.ref_policy is not None:
            self.ref_policy.save_pretrained(path / "ref", safe_serialization=True)
        torch.save(self.optimizer.state_dict(), path / "optimizer.pt")
        torch.save({"torch": torch.random.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}, path / "rng.pt")
        state = {
            "step": self.step,
            "opt_steps": self.opt_steps,
            "config": self.config.to_dict(),
            "algo": asdict(self.algo),
            "task": task_spec(self.task),
            "numpy_rng": self.rng.bit_generator.state,
            "python_rng": _py_state_to_json(random.getstate()),
        }
        (path / "state.json").write_text(json.dumps(state, indent=2, default=_json_default))
        (path / "history.json").write_text(json.dumps(self.rows, default=_json_default))
        return path

    @classmethod
    def resume(cls, path: str | Path, *, device: str | None = None) -> "Trainer":
        """Rebuild a trainer from :meth:`save` so that ``train`` continues exactly.

        Raises:
            FileNotFoundError: ``path`` is not a checkpoint directory.
        """
        from transformers import AutoModelForCausalLM

        from .models import load_policy
        from .tasks import task_from_spec

        path = Path(path)
        if not (path / "state.json").is_file():
            raise FileNotFoundError(f"Trainer.resume: {path} has no state.json (not a trainer checkpoint)")
        state = json.loads((path / "state.json").read_text())
        config = TrainerConfig.from_dict(state["config"])
        if device is not None:
            config = replace(config, device=device)
        algo = Algorithm(**state["algo"])
        task = task_from_spec(state["task"])
        policy, tokenizer = load_policy(path / "policy", device=config.device)
        ref = None
        if (path / "ref").is_dir():
            ref = AutoModelForCausalLM.from_pretrained(path / "ref", use_safetensors=True).to(config.device)
        trainer = cls(policy, tokenizer, task, algo, config, ref_policy=ref)
        trainer.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        rng = torch.load(path / "rng.pt", weights_only=True)
        torch.random.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        trainer.rng.bit_generator.state = state["numpy_rng"]
        random.setstate(_py_state_from_json(state["python_rng"]))
        trainer.step = int(state["step"])
        trainer.opt_steps = int(state.get("opt_steps", 0))
        trainer.rows = json.loads((path / "history.json").read_text())
        return trainer


def _concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """One :class:`Rollout` from several (the kept groups of several dynamic-sampling rounds).

    Rollouts of different prompt / completion widths are padded to the widest: prompts on the
    **left** (pad id, mask 0), completions, masks and behaviour log-probs on the **right** (pad
    id, 0, 0), keeping the layout of :func:`grpo_lab.rollout.generate`; position ids derive from
    the masks, so the extra padding changes no real token's position. Rows stay in order, so
    groups stay contiguous. Per-row ``extras`` tensors are concatenated when every part has them.

    Raises:
        ValueError: no parts, or parts with different ``group_size`` / ``temperature``.
    """
    if not parts:
        raise ValueError("_concat_rollouts: no rollouts given")
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if any(r.group_size != first.group_size or r.temperature != first.temperature for r in parts):
        raise ValueError("_concat_rollouts: rollouts differ in group_size or temperature")
    P = max(r.prompt_ids.shape[1] for r in parts)
    T = max(r.completion_ids.shape[1] for r in parts)

    def left(x, width, value):
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x, width, value):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    extras = {}
    for k, v in first.extras.items():
        vs = [r.extras.get(k) for r in parts]
        if all(torch.is_tensor(x) and x.shape[:1] == r.truncated.shape for x, r in zip(vs, parts)):
            try:
                extras[k] = torch.cat(vs)
            except RuntimeError:
                pass
    return Rollout(
        prompt_ids=torch.cat([left(r.prompt_ids, P, pad_id) for r in parts]),
        prompt_mask=torch.cat([left(r.prompt_mask, P, 0) for r in parts]),
        completion_ids=torch.cat([right(r.completion_ids, T, pad_id) for r in parts]),
        completion_mask=torch.cat([right(r.completion_mask, T, 0.0) for r in parts]),
        behaviour_logp=torch.cat([right(r.behaviour_logp, T, 0.0) for r in parts]),
        truncated=torch.cat([r.truncated for r in parts]),
        texts=[t for r in parts for t in r.texts], problems=[p for r in parts for p in r.problems],
        group_size=first.group_size, temperature=first.temperature,
        gen_seconds=sum(r.gen_seconds for r in parts), extras=extras,
    )


def _under_ci() -> bool:
    import os

    return bool(os.environ.get("CI"))


def _json_default(o: Any):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _py_state_to_json(state):
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _py_state_from_json(state):
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
