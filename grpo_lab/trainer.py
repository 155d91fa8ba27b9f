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
"""

from __future__ import annotations

import copy
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from .algorithms import Algorithm
from .objectives import policy_loss
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
        has no correct/incorrect sample), ``entropy`` (nats/token), ``kl``, ``clip_frac_low``,
        ``clip_frac_high``, ``clip_frac``, ``ratio_mean/min/max``, ``ratio_q05/q50/q95``,
        ``grad_token_frac``, ``adv_abs_mean``, ``grad_norm`` (before clipping),
        ``zero_adv_group_frac`` (groups whose rewards are all equal), ``truncation_rate``,
        ``reasoning_frac`` (tasks that define it), ``tokens_per_s`` (generated tokens / step
        wall time), ``gen_seconds``, ``step_seconds``, ``test_accuracy`` and
        ``test_length`` (greedy, NaN on steps without evaluation; the row of step ``k`` holds
        the evaluation *after* ``k`` updates, step 0 the base policy).
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

    def _train_step(self) -> dict:
        c, algo = self.config, self.algo
        t0 = time.perf_counter()
        ro = self.rollout()
        B = len(ro)
        rewards = torch.tensor([self.task.reward(t, p) for t, p in zip(ro.texts, ro.problems)], dtype=torch.float32)
        correct = torch.tensor([bool(self.task.is_correct(t, p)) for t, p in zip(ro.texts, ro.problems)])
        adv = algo.advantages(rewards, c.group_size).to(c.device)
        mask = ro.completion_mask
        with torch.no_grad():
            if c.old_logp == "behaviour":
                old_logp = ro.behaviour_logp
            elif c.epochs * c.minibatches > 1:
                old_logp = self._logp_batched(self.policy, ro)
            else:
                old_logp = None  # on-policy: π_old = sg(π_θ), filled in per micro-batch
            ref_logp = self._logp_batched(self.ref_policy, ro) if self.uses_kl else None

        mb_size = B // c.minibatches
        micro = c.micro_batch_size or mb_size
        gen = torch.Generator().manual_seed(int(self.rng.integers(2**62)))
        metric_acc: dict[str, list] = {}
        grad_norms, entropies = [], []
        for epoch in range(c.epochs):
            order = torch.randperm(B, generator=gen) if c.minibatches > 1 else torch.arange(B)
            for m in range(c.minibatches):
                idx = order[m * mb_size:(m + 1) * mb_size]
                n_tok = float(mask[idx].sum())
                n_seq = float((mask[idx].sum(-1) > 0).sum())
                self.optimizer.zero_grad(set_to_none=True)
                for s in range(0, len(idx), micro):
                    sub = idx[s:s + micro]
                    part = ro.select(sub)
                    T = part.completion_ids.shape[1]
                    logp, ent = policy_logprobs(self.policy, part, with_entropy=True)
                    if epoch == 0:
                        entropies.append((float((ent * part.completion_mask).sum()), float(part.completion_mask.sum())))
                    old = logp.detach() if old_logp is None else old_logp[sub, :T]
                    ref = ref_logp[sub, :T] if ref_logp is not None else None
                    out = policy_loss(logp, old, adv[sub], part.completion_mask, algo, ref_logp=ref,
                                      num_tokens=n_tok, num_sequences=n_seq, max_tokens=self.max_new_tokens)
                    out.loss.backward()
                    w = float(part.completion_mask.sum()) / max(n_tok, 1.0)
                    for k, v in out.metrics.items():
                        metric_acc.setdefault(k, []).append((v, w))
                gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), c.grad_clip)
                grad_norms.append(float(gn))
                for group in self.optimizer.param_groups:
                    group["lr"] = c.lr * min(1.0, (self.opt_steps + 1) / c.warmup) if c.warmup else c.lr
                self.optimizer.step()
                self.opt_steps += 1

        step_seconds = time.perf_counter() - t0
        lengths = ro.lengths.float()
        g = rewards.view(-1, c.group_size)
        zero_adv = float((g.max(1).values == g.min(1).values).float().mean())
        row = {
            "reward": float(rewards.mean()),
            "accuracy": float(correct.float().mean()),
            "length": float(lengths.mean()),
            "length_correct": float(lengths[correct].mean()) if correct.any() else float("nan"),
            "length_incorrect": float(lengths[~correct].mean()) if (~correct).any() else float("nan"),
            "entropy": sum(e for e, _ in entropies) / max(sum(n for _, n in entropies), 1.0),
            "grad_norm": float(np.mean(grad_norms)),
            "zero_adv_group_frac": zero_adv,
            "truncation_rate": float(ro.truncated.float().mean()),
            "tokens_per_s": float(mask.sum()) / step_seconds,
            "gen_seconds": ro.gen_seconds,
            "step_seconds": step_seconds,
        }
        if hasattr(self.task, "is_reasoning"):
            row["reasoning_frac"] = float(np.mean([self.task.is_reasoning(t) for t in ro.texts]))
        n_updates = c.epochs * c.minibatches
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
