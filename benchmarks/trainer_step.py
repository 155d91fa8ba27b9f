"""Time one GRPO training step three ways (grpo_lab, bare transformers/torch, TRL) in one process.

Every contender does the same job from the same weights: sample ``16 questions × G`` completions
of the arithmetic task from the shipped ``arithmetic-base`` checkpoint (a tiny ``Qwen2ForCausalLM``
with a character tokenizer), score them, compute group advantages, run a no-grad forward of the
frozen reference model (GRPO's KL, beta = 0.04) and of the policy (π_old, needed because the rollout
feeds two optimiser steps), then two optimiser steps, each on half of the rows (forward, backward of
the clipped-ratio loss, gradient clipping at norm 1, AdamW with lr 1e-6 so the weights barely move).
Each contender gets its own deep copy of the checkpoint (policy and reference) and its own optimiser.

The contenders
--------------
``grpo_lab``
    ``grpo_lab.training.trainer.Trainer`` with the ``GRPO`` preset and ``TrainerConfig(prompts_per_step=16,
    group_size=G, minibatches=2, epochs=1, max_new_tokens=N, lr=1e-6, warmup=0, eval_every=0,
    micro_batch_size=32)`` (the CPU profile's micro-batch size: with ``sort_by_length``, rows of
    similar length share a micro-batch, which trims padding; the gradient is the same sum);
    one step is ``trainer.train(1)`` (the public call; it adds the history row and builds the
    history DataFrame, about a millisecond). What the step does: ``rollout.generate`` (HF
    ``generate`` with ``output_logits=True``, so it also stacks the sampler's logits into behaviour
    log-probs), decode and score, advantages, π_old and π_ref forwards, 2 × (forward with entropy,
    loss, backward, clip, AdamW), and the step's metrics.
``bare``
    The floor, written here directly with transformers/torch (no grpo_lab trainer): HF
    ``model.generate`` (sampling, temperature 1, top_p 1, top_k 0, ``return_dict_in_generate=True``,
    ``output_logits=False``: the floor recomputes π_old with a forward pass, so it has no use for the
    sampler's logits), decode and score, z-score group advantages, no-grad forwards of the reference
    and of the policy over prompt + completion (``logits_to_keep``: only the completion's logits),
    then 2 × (forward over half the rows, token-level clipped ratio (eps 0.2) + beta·k3 KL averaged
    per sequence then over sequences, backward, clip, AdamW). No metrics, no entropy, no checks:
    what any implementation must do.
``trl``
    ``trl.GRPOTrainer`` (TRL 1.16) with ``GRPOConfig(num_generations=G,
    per_device_train_batch_size=8·G, steps_per_generation=2, gradient_accumulation_steps=1,
    beta=0.04, loss_type="grpo", epsilon=0.2, max_completion_length=N, temperature=1, top_p=1,
    top_k=0, use_vllm=False, use_cpu=True, bf16=fp16=False, gradient_checkpointing=False,
    learning_rate=1e-6, lr_scheduler_type="constant")``: one generation batch is 16·G rows (16
    prompts × G), and it feeds two optimiser steps of 8·G rows. A TRL "step" here is one generation
    cycle = two optimiser steps. Its reward function scores with ``task.reward(text, problem)``
    (prompts are mapped back to their problems); the data set is ``Dataset.from_dict({"prompt":
    [...]})`` of plain-string arithmetic prompts. Settings that differ from TRL's defaults, and why:
    ``gradient_checkpointing=False`` (TRL's default is True; the other two keep activations, so
    recomputing them would time a different memory/speed trade-off), ``bf16=False`` (TRL's default
    is True; everything here runs in float32), ``loss_type="grpo"`` (TRL's default is ``"dapo"``;
    ``"grpo"`` is the per-sequence token mean of the GRPO preset), ``lr_scheduler_type="constant"``
    (no decay, as the others). Its optimiser is transformers' default (``adamw_torch_fused`` with
    torch ≥ 2.8; the JSON records it). Its reference model is not a deep copy passed in: TRL loads
    it itself from ``policy.config._name_or_path``, the checkpoint directory, i.e. the same weights.

    What TRL 1.16 computes in this setting (read in ``trl/trainer/grpo_trainer.py``):
    ``_generate_and_score_completions`` computes ``old_per_token_logps`` with a no-grad forward of
    the policy because ``gradient_accumulation_steps % (steps_per_generation × num_iterations) =
    1 % 2 ≠ 0`` (with ``steps_per_generation=1`` it would skip it and use ``per_token_logps.detach()``),
    and ``ref_per_token_logps`` with a no-grad forward of ``ref_model`` because ``beta ≠ 0``; both
    forwards run in chunks of ``per_device_train_batch_size`` = 8·G rows. Its log-prob forward is a
    patched "fused LM head" (``trl.trainer.utils.add_fused_lm_head``): the backbone runs, then the
    hidden states are projected to the vocabulary in tiles that return per-token log-probs without
    materialising the full logits. The policy is patched to return **entropies** too, so they are
    computed in the π_old forward as well as in the training forward (the reference returns
    log-probs only). Off Triton devices (so on CPU) the tiles cover **every** position of prompt +
    completion, prompt and padding included (``compact = _use_triton(device)``; the prompt's labels
    are only masked afterwards), whereas grpo_lab and the floor pass ``logits_to_keep`` and project
    the completion's positions only. On top of the others it also: shuffles the generation batch before splitting it; multiplies the KL
    term by the ratio (``use_bias_correction_kl=True``, its default); computes clip fractions and
    several metrics with ``.item()`` calls every optimiser step; and the transformers ``Trainer``
    loop adds its own per-step work (FLOP counting, learning-rate scheduler, callbacks).

Shapes (``--shapes``)
---------------------
* ``short``: at most 32 new tokens, the model stops at EOS (as in training), G = 8;
* ``forced32``: exactly 32 new tokens, G = 16;
* ``forced128``: exactly 128 new tokens, G = 8 (prompt + completion exceed the checkpoint's
  ``max_position_embeddings=128``; RoPE has no learned table: the forced shapes' configs declare 128 more
  positions, which grpo_lab's rollout otherwise refuses).

"Forced": every contender gets a tokenizer copy whose EOS is a new token ``<never>`` (id 52) that
the model cannot emit (its vocabulary has 52 ids, 0-51), and the model's ``generation_config``
declares the same EOS; so generation always runs the full budget. (``<unk>``, id 3, is not safe:
past its real EOS the checkpoint emits garbage in which ``<unk>`` has probability up to a few %,
about one stray stop per 16k sampled tokens.) The table's JSON has each contender's mean
completion length (tokens, EOS included) so you can check that the shapes matched; in the short
shape they vary a little from step to step because every contender samples its own questions.

Interleaving
------------
All contenders run in one process, one step each per repetition, in a rotating order (rep ``r``
starts with contender ``r mod 3`` of ``(grpo_lab, bare, trl)``), after ``--warmup`` warm-up reps
(timed the same way, kept in the JSON, left out of the summary). Interleaving spreads slow drifts of the
machine (thermal, other load, memory state) evenly over the three instead of charging them to
whichever ran last, and the rotation avoids always following the same neighbour (cache state).
``gc.collect()`` runs before every step, outside the timed region.

TRL owns its training loop (``trainer.train()``), so it cannot be called one step at a time.
The benchmark therefore runs *inside* it: a ``TrainerCallback`` runs, at ``on_train_begin``,
the contenders that precede TRL in rep 0's order, and at every second ``on_step_end`` (the end of
a generation cycle) the contenders that follow TRL in this rep's order and those that precede it
in the next rep's. The TRL cycle time is the wall time between the end of one callback and the
next cycle boundary, i.e. everything TRL's loop does for that cycle, minus the other contenders'
steps (which run inside the callback and are timed separately). ``time.perf_counter`` throughout.

Reading the table
-----------------
Medians over the timed reps (IQR in the JSON, with min/max and every rep). ``grpo_lab / bare`` is
the overhead of grpo_lab over the floor (1.0 = none); ``TRL / bare`` the same for TRL;
``grpo_lab / TRL`` < 1 means grpo_lab's step is faster. The target line checks
``grpo_lab ≤ 0.75 × TRL`` at the short shape. On 2 CPU cores and a 0.3M-parameter model the
times are dominated by per-token Python/dispatch overhead of ``generate`` and by per-call
overheads, not by FLOPs: the ratios say how much each implementation adds around the same kernels.
Run it on an otherwise idle machine: with ``--threads 2`` on two cores that another process also
uses, OpenMP threads wait for each other and single steps slow down by up to 10× at random (the
JSON records the load average before and after, and every rep's time, to spot this).

Usage::

    pip install -e '.[bench]'                       # TRL 1.16 (pulls accelerate, datasets)
    python benchmarks/trainer_step.py               # all shapes, 2 warm-up + 10 timed reps
    python benchmarks/trainer_step.py --quick       # 1 warm-up + 2 reps (smoke test)
    python benchmarks/trainer_step.py --shapes short --reps 20 --threads 2 --out results.json
    python benchmarks/trainer_step.py --no-trl      # grpo_lab and bare only

Set ``OMP_NUM_THREADS``, ``HF_HUB_OFFLINE=1`` and ``TOKENIZERS_PARALLELISM=false`` in the
environment as for the tests. Results go to ``benchmarks/results/trainer_step_cpu.json``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

CONTENDERS = ("grpo_lab", "bare", "trl")
NEVER = "<never>"  # an EOS the model cannot emit (added to a tokenizer copy, id = vocab size)
LR, BETA, EPS, MINIBATCHES, GRAD_CLIP, ADV_EPS = 1e-6, 0.04, 0.2, 2, 1.0, 1e-4
TRL_VERSION = "1.16.0"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "trainer_step_cpu.json"
INSTALL_HINT = "pip install -e '.[bench]'"


@dataclass(frozen=True)
class Shape:
    """One benchmark shape: ``prompts`` questions × ``group_size`` completions of at most
    ``max_new_tokens`` tokens (exactly that many when ``forced``)."""

    name: str
    max_new_tokens: int
    group_size: int
    forced: bool
    prompts: int = 16

    @property
    def label(self) -> str:
        return f"{self.name} ({self.prompts} × {self.group_size}, {'=' if self.forced else '≤'}{self.max_new_tokens} tok)"


SHAPES = {
    "short": Shape("short", 32, 8, forced=False),
    "forced32": Shape("forced32", 32, 16, forced=True),
    "forced128": Shape("forced128", 128, 8, forced=True),
}


# ---------------------------------------------------------------------------------------- weights
_BASE: tuple | None = None


def _base():
    """The shipped checkpoint, loaded once (each contender deep-copies it)."""
    global _BASE
    if _BASE is None:
        from grpo_lab.policy.models import load_policy
        from grpo_lab.paths import checkpoint_dir

        policy, tok = load_policy(checkpoint_dir("arithmetic-base"), progress=False)
        _BASE = (policy.eval(), tok)
    return _BASE


def _weights(shape: Shape):
    """A contender's own ``(policy, ref, tokenizer)``: deep copies of the checkpoint; for a forced
    shape the tokenizer's and the model's EOS is ``<never>``, which the model cannot sample."""
    base, base_tok = _base()
    policy, ref, tok = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base_tok)
    tok.padding_side = "left"
    if shape.forced:
        tok.add_special_tokens({"eos_token": NEVER})
        assert tok.eos_token_id >= policy.config.vocab_size, "the forced EOS must be outside the model's vocabulary"
        policy.generation_config.eos_token_id = tok.eos_token_id
        # forced128 runs past the checkpoint's 128 trained positions on purpose: grpo_lab's rollout refuses that
        # unless the config declares more (a rotary model's max_position_embeddings changes no number here)
        for m in (policy, ref):
            m.config.max_position_embeddings += shape.max_new_tokens
    return policy, ref, tok


def _task():
    from grpo_lab.tasks import get_task

    return get_task("arithmetic")


# ---------------------------------------------------------------------------------------- grpo_lab
class GrpoLabStep:
    """``grpo_lab.training.trainer.Trainer`` (GRPO preset); ``__call__`` runs one step, returns its mean
    completion length."""

    def __init__(self, shape: Shape, seed: int = 0):
        from grpo_lab.algo.algorithms import GRPO
        from grpo_lab.experiments import get_profile
        from grpo_lab.training.trainer import Trainer, TrainerConfig

        policy, ref, tok = _weights(shape)
        config = TrainerConfig(prompts_per_step=shape.prompts, group_size=shape.group_size, minibatches=MINIBATCHES,
                               epochs=1, max_new_tokens=shape.max_new_tokens, lr=LR, warmup=0, eval_every=0,
                               threads=None, progress=False, seed=seed,
                               micro_batch_size=get_profile("cpu").config.micro_batch_size)
        self.trainer = Trainer(policy, tok, _task(), GRPO, config, ref_policy=ref)

    def __call__(self) -> float:
        self.trainer.train(1)
        return float(self.trainer.rows[-1]["length"])


# ---------------------------------------------------------------------------------------- bare
class BareStep:
    """The floor: HF ``generate`` + two no-grad forwards + 2 × (forward, backward, AdamW), written
    directly with transformers/torch."""

    def __init__(self, shape: Shape, seed: int = 0):
        from transformers import GenerationConfig

        self.shape, self.task = shape, _task()
        self.policy, self.ref, self.tok = _weights(shape)
        self.ref.requires_grad_(False)
        self.rng = np.random.default_rng(seed + 1)
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.0)
        self.eos, self.pad = self.tok.eos_token_id, self.tok.pad_token_id
        self.gen_config = GenerationConfig(
            do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=shape.max_new_tokens,
            pad_token_id=self.pad, eos_token_id=self.eos, return_dict_in_generate=True, output_logits=False)

    @staticmethod
    def _logp(model, ids, attn, pos, completion):
        """Per-token log-probs of ``completion`` (the last ``T`` columns of ``ids``)."""
        T = completion.shape[1]
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=T + 1,
                       use_cache=False).logits[:, :-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, completion[..., None]).squeeze(-1)

    def __call__(self) -> float:
        G, policy = self.shape.group_size, self.policy
        problems = [p for p in self.task.sample(self.shape.prompts, self.rng) for _ in range(G)]
        enc = self.tok([p.prompt for p in problems], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = policy.generate(**enc, generation_config=self.gen_config)
        P = enc["input_ids"].shape[1]
        comp = out.sequences[:, P:]
        B, T = comp.shape
        is_eos = comp == self.eos
        end = torch.where(is_eos.any(-1), is_eos.int().argmax(-1), T)  # index of the first EOS, T if none
        mask = (torch.arange(T)[None, :] <= end[:, None]).float()
        comp = comp.masked_fill(mask == 0, self.pad)
        texts = [self.tok.decode(row[:n]) for row, n in zip(comp.tolist(), end.tolist())]
        r = torch.tensor([self.task.reward(t, p) for t, p in zip(texts, problems)]).view(-1, G)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + ADV_EPS)).flatten()

        ids = torch.cat([enc["input_ids"], comp], 1)
        attn = torch.cat([enc["attention_mask"], mask.long()], 1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            ref_logp = self._logp(self.ref, ids, attn, pos, comp)
            old_logp = self._logp(policy, ids, attn, pos, comp)
        for rows in torch.randperm(B).chunk(MINIBATCHES):
            logp = self._logp(policy, ids[rows], attn[rows], pos[rows], comp[rows])
            ratio = torch.exp(logp - old_logp[rows])
            a = adv[rows, None]
            pg = -torch.minimum(ratio * a, ratio.clamp(1 - EPS, 1 + EPS) * a)
            d = ref_logp[rows] - logp
            per_token = pg + BETA * (torch.exp(d) - d - 1)  # k3 KL estimator
            m = mask[rows]
            loss = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), GRAD_CLIP)
            self.opt.step()
        return float(mask.sum(-1).mean())


# ---------------------------------------------------------------------------------------- TRL
def _import_trl():
    """``trl`` (and ``datasets``), or exit with the install hint."""
    try:
        import datasets  # noqa: F401
        import trl
    except ImportError as exc:
        sys.exit(f"trainer_step.py: TRL is not installed ({exc}). Install the benchmark extra with\n"
                 f"    {INSTALL_HINT}\nor run without the TRL contender: --no-trl")
    if trl.__version__ != TRL_VERSION:
        warnings.warn(f"trainer_step.py is written for TRL {TRL_VERSION}, found {trl.__version__}", stacklevel=2)
    return trl


class TrlRun:
    """A ``trl.GRPOTrainer`` set up for ``cycles`` generation cycles (2 optimiser steps each);
    :meth:`run` calls ``trainer.train()`` with a callback that reports each cycle boundary."""

    def __init__(self, shape: Shape, cycles: int, workdir: str, seed: int = 0):
        _import_trl()
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        task = _task()
        policy, _ref, tok = _weights(shape)  # TRL builds its own reference from the checkpoint path
        del _ref
        problems = task.sample(shape.prompts * cycles, np.random.default_rng(seed + 2))
        by_prompt = {p.prompt: p for p in problems}
        self.lengths: list[float] = []

        def arithmetic_reward(prompts, completions, completion_ids, **_):
            self.lengths.append(float(np.mean([len(ids) for ids in completion_ids])))  # EOS included, as grpo_lab
            return [task.reward(c, by_prompt[p]) for p, c in zip(prompts, completions)]

        G = shape.group_size
        rows = shape.prompts * G
        # transformers 5 renamed gradient_checkpointing (TRL's default: True) to activation_checkpointing
        names = {f.name for f in dataclasses.fields(GRPOConfig)}
        no_checkpointing = {"activation_checkpointing" if "activation_checkpointing" in names
                            else "gradient_checkpointing": False}
        if rows % MINIBATCHES:
            raise ValueError(f"{shape}: {rows} rows do not split into {MINIBATCHES} minibatches")
        self.config = GRPOConfig(
            output_dir=workdir, report_to="none", logging_strategy="no", save_strategy="no", eval_strategy="no",
            disable_tqdm=True, use_cpu=True, bf16=False, fp16=False, **no_checkpointing, seed=seed, dataloader_num_workers=0,
            num_generations=G, per_device_train_batch_size=rows // MINIBATCHES, steps_per_generation=MINIBATCHES,
            gradient_accumulation_steps=1, num_iterations=1, max_steps=MINIBATCHES * cycles,
            max_completion_length=shape.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
            use_vllm=False, beta=BETA, epsilon=EPS, loss_type="grpo", scale_rewards="group",
            learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            adam_beta1=0.9, adam_beta2=0.99, max_grad_norm=GRAD_CLIP,
        )
        assert self.config.generation_batch_size == rows, self.config.generation_batch_size
        dataset = Dataset.from_dict({"prompt": [p.prompt for p in problems]})
        self.trainer = GRPOTrainer(model=policy, reward_funcs=arithmetic_reward, args=self.config,
                                   train_dataset=dataset, processing_class=tok)
        from transformers.trainer_callback import PrinterCallback

        self.trainer.remove_callback(PrinterCallback)  # it prints the end-of-training metrics dict to stdout
        self.cycles = cycles

    def check(self) -> dict:
        """What TRL set up: old/ref log-probs on, its EOS ids, optimiser; raises if not as intended."""
        t, a = self.trainer, self.config
        generate_every = a.steps_per_generation * t.num_iterations
        old_logps = a.gradient_accumulation_steps % generate_every != 0  # the condition in _generate_and_score_completions
        if not old_logps or t.ref_model is None or t.beta != BETA:
            raise RuntimeError("TRL would not compute old and reference log-probs in this configuration")
        model = t.accelerator.unwrap_model(t.model)
        checkpointing = getattr(model, "is_activation_checkpointing", None)
        checkpointing = model.is_gradient_checkpointing if checkpointing is None else checkpointing
        if checkpointing:
            raise RuntimeError("TRL's policy uses activation checkpointing; the benchmark turns it off")
        base, ref = _base()[0].state_dict(), t.ref_model.state_dict()
        ref_same = base.keys() == ref.keys() and all(torch.equal(base[k], ref[k]) for k in base)
        return {"computes_old_logps": old_logps, "ref_model": True, "ref_equals_checkpoint": ref_same,
                "eos_token_ids": list(t.eos_token_ids), "optim": getattr(a.optim, "value", str(a.optim)),
                "loss_type": a.loss_type, "activation_checkpointing": bool(checkpointing),
                "generation_batch_size": a.generation_batch_size,
                "per_device_train_batch_size": a.per_device_train_batch_size,
                "steps_per_generation": a.steps_per_generation}

    def run(self, on_begin: Callable[[], None], on_cycle_end: Callable[[int, float], None]) -> None:
        """``trainer.train()``; ``on_begin()`` at train begin, ``on_cycle_end(cycle, seconds)`` after
        every generation cycle with its wall time (the callbacks' own time excluded)."""
        from transformers import TrainerCallback

        every = self.config.steps_per_generation

        class Interleave(TrainerCallback):
            t_last = 0.0

            def on_train_begin(self, args, state, control, **kwargs):
                on_begin()
                gc.collect()
                self.t_last = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step % every:
                    return
                seconds = time.perf_counter() - self.t_last
                on_cycle_end(state.global_step // every - 1, seconds)
                gc.collect()
                self.t_last = time.perf_counter()

        callback = Interleave()
        self.trainer.add_callback(callback)
        try:
            self.trainer.train()
        finally:
            self.trainer.remove_callback(callback)


# ---------------------------------------------------------------------------------------- driver
def _orders(names: tuple[str, ...], n: int) -> list[tuple[str, ...]]:
    """Rep ``r`` runs ``names`` rotated to start at ``names[r % len(names)]``."""
    return [names[r % len(names):] + names[:r % len(names)] for r in range(n)]


def _stats(xs: list[float]) -> dict:
    if not xs:
        return {}
    q = np.percentile(xs, [25, 50, 75]) if len(xs) > 1 else [xs[0]] * 3
    return {"median": float(q[1]), "q1": float(q[0]), "q3": float(q[2]), "iqr": float(q[2] - q[0]),
            "min": float(min(xs)), "max": float(max(xs)), "mean": float(statistics.fmean(xs))}


def run_shape(shape: Shape, *, warmup: int, reps: int, with_trl: bool = True, seed: int = 0,
              log: Callable[[str], None] | None = None) -> dict:
    """Interleaved reps of every contender at ``shape``; returns per-contender times and lengths
    (``times``/``lengths`` over all reps, warm-up first), summaries over the timed reps, and ratios."""
    log = log or (lambda s: None)
    total = warmup + reps
    names = CONTENDERS if with_trl else tuple(n for n in CONTENDERS if n != "trl")
    steps: dict[str, Callable[[], float]] = {"grpo_lab": GrpoLabStep(shape, seed), "bare": BareStep(shape, seed)}
    times = {n: [None] * total for n in names}
    lengths = {n: [None] * total for n in names}
    orders = _orders(names, total)

    def timed(name: str, r: int) -> None:
        gc.collect()
        t0 = time.perf_counter()
        length = steps[name]()
        times[name][r], lengths[name][r] = time.perf_counter() - t0, length
        log(f"  {shape.name} rep {r}{' (warm-up)' if r < warmup else ''}: {name:8s} {times[name][r]:7.3f} s, "
            f"mean length {length:.1f}")

    result = {"shape": asdict(shape), "warmup": warmup, "reps": reps, "orders": [list(o) for o in orders]}
    if not with_trl:
        for r, order in enumerate(orders):
            for name in order:
                timed(name, r)
    else:
        with tempfile.TemporaryDirectory(prefix="trainer_step_trl_") as workdir:
            trl_run = TrlRun(shape, total, workdir, seed)
            result["trl_setup"] = trl_run.check()
            before = lambda r: orders[r][:orders[r].index("trl")]  # noqa: E731
            after = lambda r: orders[r][orders[r].index("trl") + 1:]  # noqa: E731

            def on_begin():
                for name in before(0):
                    timed(name, 0)

            def on_cycle_end(r: int, seconds: float):
                times["trl"][r], lengths["trl"][r] = seconds, trl_run.lengths[r]
                log(f"  {shape.name} rep {r}{' (warm-up)' if r < warmup else ''}: trl      {seconds:7.3f} s, "
                    f"mean length {trl_run.lengths[r]:.1f}")
                for name in after(r):
                    timed(name, r)
                if r + 1 < total:
                    for name in before(r + 1):
                        timed(name, r + 1)

            trl_run.run(on_begin, on_cycle_end)
            if len(trl_run.lengths) != total or any(t is None for t in times["trl"]):
                raise RuntimeError(f"TRL ran {len(trl_run.lengths)} generation cycles, expected {total}")
            del trl_run
    result["times"], result["lengths"] = times, lengths
    result["summary"] = {n: _stats(times[n][warmup:]) for n in names}
    result["mean_length"] = {n: float(statistics.fmean(lengths[n][warmup:] or lengths[n])) for n in names}
    med = {n: result["summary"][n].get("median") for n in names}
    ratio = lambda a, b: (med[a] / med[b]) if a in med and b in med and med[a] and med[b] else None  # noqa: E731
    result["ratios"] = {"grpo_lab/bare": ratio("grpo_lab", "bare"), "trl/bare": ratio("trl", "bare"),
                        "grpo_lab/trl": ratio("grpo_lab", "trl")}
    return result


def _processor() -> str:
    from grpo_lab.experiments import processor_name

    return processor_name()


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _git() -> dict:
    """HEAD's sha and whether tracked files differ from it (read-only: no index refresh is written)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             env=env, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, env=env, check=True).stdout.strip() != ""
        return {"sha": sha, "dirty": dirty}
    except (OSError, subprocess.CalledProcessError):
        return {"sha": None, "dirty": None}


def run_benchmark(shapes: list[Shape], *, warmup: int = 2, reps: int = 10, threads: int | None = 2,
                  with_trl: bool = True, seed: int = 0, log: Callable[[str], None] | None = None) -> dict:
    """Every shape in turn (see :func:`run_shape`); returns the JSON-able result. ``threads``
    sets torch's intra-op threads for the run (restored afterwards); ``None`` leaves it."""
    import transformers

    from grpo_lab.policy.models import count_parameters

    if with_trl:
        trl = _import_trl()
    saved = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        out = {
            "benchmark": "trainer_step",
            "config": {"prompts_per_step": shapes[0].prompts if shapes else None, "minibatches": MINIBATCHES,
                       "epochs": 1, "lr": LR, "beta": BETA, "eps": EPS, "grad_clip": GRAD_CLIP, "temperature": 1.0,
                       "algorithm": "GRPO", "task": "arithmetic", "checkpoint": "arithmetic-base",
                       "parameters": count_parameters(_base()[0]), "seed": seed,
                       "shapes": [asdict(s) for s in shapes], "contenders": list(
                           CONTENDERS if with_trl else (n for n in CONTENDERS if n != "trl"))},
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__, "trl": trl.__version__ if with_trl else None,
                         "grpo_lab_git": _git()},
            "processor": _processor(),
            "threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "HF_HUB_OFFLINE",
                                                   "TOKENIZERS_PARALLELISM")},
            "warmup": warmup, "reps": reps,
            "loadavg_start": _loadavg(),
            "shapes": {},
        }
        for shape in shapes:
            if log:
                log(f"shape {shape.label}")
            out["shapes"][shape.name] = run_shape(shape, warmup=warmup, reps=reps, with_trl=with_trl, seed=seed,
                                                  log=log)
            if torch.get_num_threads() != out["threads"]:
                raise RuntimeError(f"a contender changed torch's thread count to {torch.get_num_threads()}")
        out["loadavg_end"] = _loadavg()
        short = out["shapes"].get("short")
        r = short["ratios"]["grpo_lab/trl"] if short else None
        out["target"] = {"rule": "grpo_lab step <= 0.75 x TRL's at the short shape",
                         "grpo_lab_over_trl": r, "met": None if r is None else bool(r <= 0.75)}
        return out
    finally:
        torch.set_num_threads(saved)


def markdown_table(result: dict) -> str:
    """The summary table (medians, ratios) and the target line."""
    def s(x, digits=3):
        return "–" if x is None else f"{x:.{digits}f}"

    def rt(x):
        return "–" if x is None else f"{x:.2f}"

    lines = ["| shape (16 questions × G) | grpo_lab s | bare s | TRL s | grpo_lab / bare | TRL / bare | grpo_lab / TRL |",
             "|---|---|---|---|---|---|---|"]
    for name, sh in result["shapes"].items():
        shape = Shape(**sh["shape"])
        med = {n: sh["summary"].get(n, {}).get("median") for n in CONTENDERS}
        ra = sh["ratios"]
        lines.append(f"| {name} ({shape.prompts} × {shape.group_size}, {'=' if shape.forced else '≤'}"
                     f"{shape.max_new_tokens} tok) | {s(med['grpo_lab'])} | {s(med['bare'])} | {s(med['trl'])} | "
                     f"{rt(ra['grpo_lab/bare'])} | {rt(ra['trl/bare'])} | {rt(ra['grpo_lab/trl'])} |")
    lines.append("")
    lines.append("Spread (IQR of the timed reps, s) and mean completion length (tokens, EOS included):")
    lines.append("")
    lines.append("| shape | grpo_lab IQR | bare IQR | TRL IQR | grpo_lab len | bare len | TRL len |")
    lines.append("|---|---|---|---|---|---|---|")
    for name, sh in result["shapes"].items():
        iqr = {n: sh["summary"].get(n, {}).get("iqr") for n in CONTENDERS}
        ln = {n: sh["mean_length"].get(n) for n in CONTENDERS}
        lines.append(f"| {name} | {s(iqr['grpo_lab'])} | {s(iqr['bare'])} | {s(iqr['trl'])} | "
                     f"{s(ln['grpo_lab'], 1)} | {s(ln['bare'], 1)} | {s(ln['trl'], 1)} |")
    t = result.get("target", {})
    lines.append("")
    if t.get("met") is None:
        lines.append("Target grpo_lab step ≤ 0.75 × TRL's at the short shape: not measured (needs the short shape and TRL)")
    else:
        lines.append(f"Target grpo_lab step ≤ 0.75 × TRL's at the short shape: {'met' if t['met'] else 'not met'} "
                     f"(grpo_lab / TRL = {t['grpo_lab_over_trl']:.2f})")
    return "\n".join(lines)


TABLE_MARKERS = ("<!-- trainer-step:start -->", "<!-- trainer-step:end -->")
#: the file whose table ``--write-table`` rewrites (between :data:`TABLE_MARKERS`)
TABLES = REPO / "benchmarks" / "README.md"


def write_table(result: dict, path: Path = TABLES) -> None:
    """Replace the block between :data:`TABLE_MARKERS` in ``path`` with :func:`markdown_table`
    and the measurement's setting (processor, versions, threads, repetitions, date)."""
    start, end = TABLE_MARKERS
    text = path.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start} ... {end} block")
    setting = (f"Measured on {result['processor']}, torch {result['versions']['torch']}, transformers "
               f"{result['versions']['transformers']}, TRL {result['versions']['trl']}, {result['threads']} threads, "
               f"{result.get('reps', '?')} timed repetitions per shape.")
    head, rest = text.split(start, 1)
    path.write_text(head + start + "\n" + markdown_table(result) + "\n\n" + setting + "\n" + end
                      + rest.split(end, 1)[1])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions per shape (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up repetitions per shape, not summarised (default 2)")
    ap.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES),
                    help="shapes to run (default: all)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"JSON output (default {DEFAULT_OUT.relative_to(REPO)}; with --quick a file in the system "
                         "temporary directory, so that a smoke run never replaces the committed results)")
    ap.add_argument("--quick", action="store_true", help="1 warm-up + 2 reps (smoke test)")
    ap.add_argument("--no-trl", action="store_true", help="skip the TRL contender")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-table", action="store_true",
                    help="rewrite the table in benchmarks/README.md from the JSON at --out (no timing run)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.gettempdir()) / "trainer_step_quick.json" if args.quick else DEFAULT_OUT
    if args.write_table:
        result = json.loads(args.out.read_text())
        if "--quick" in result.get("argv", []) or result.get("versions", {}).get("trl") is None:
            raise SystemExit(f"{args.out} is a --quick or --no-trl run; benchmarks/README.md shows a full measurement")
        write_table(result)
        print(markdown_table(result))
        return result
    if args.quick:
        args.warmup, args.reps = 1, 2
    if args.reps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--reps must be >= 1, --warmup >= 0, --threads >= 1")
    if not args.no_trl:
        _import_trl()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the max_position_embeddings reminder at 128 forced tokens, Trainer chatter
    hf_logging.disable_progress_bar()  # "Loading weights" when TRL loads its reference model
    warnings.filterwarnings("ignore", message=r".*is deprecated and will be removed in v6", category=FutureWarning)
    result = run_benchmark([SHAPES[s] for s in args.shapes], warmup=args.warmup, reps=args.reps,
                           threads=args.threads, with_trl=not args.no_trl, seed=args.seed,
                           log=lambda m: print(m, file=sys.stderr, flush=True))
    result["argv"] = sys.argv[1:] if argv is None else list(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nprocessor: {result['processor']}; torch {result['versions']['torch']}, transformers "
          f"{result['versions']['transformers']}, trl {result['versions']['trl']}; {result['threads']} threads; "
          f"{args.warmup} warm-up + {args.reps} timed reps per shape\n")
    print(markdown_table(result))
    print(f"\nwrote {args.out}")
    return result


if __name__ == "__main__":
    main()
