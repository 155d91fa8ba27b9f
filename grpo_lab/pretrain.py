"""Deterministic supervised pretraining of the tiny base policies shipped in ``data/checkpoints``.

    python -m grpo_lab.pretrain arithmetic            # → data/checkpoints/arithmetic-base/
    python -m grpo_lab.pretrain arithmetic --out DIR  # anywhere else

The recipe (model size, data mixture, optimiser, steps, seed) is a frozen dataclass; the
checkpoint directory holds the ``transformers`` model (safetensors), the tokenizer, and
``recipe.json`` with the recipe, the measured test accuracy and the software versions. A test
reloads the committed checkpoint and checks both the recipe and the accuracy.

Pretraining is plain next-token cross-entropy on the response (prompt tokens are not scored).
The data mixture makes the base policy answer most questions directly and reason only
sometimes, so its greedy accuracy sits in the 20–60% band and RL has room to act.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .models import TinyConfig, build_char_tokenizer, count_parameters, tiny_policy
from .paths import checkpoint_dir
from .tasks.arithmetic import ArithmeticTask

__all__ = ["PretrainRecipe", "RECIPES", "pretrain", "main"]


@dataclass(frozen=True)
class PretrainRecipe:
    """Everything that determines a base checkpoint."""

    task: str = "arithmetic"
    model: TinyConfig = field(default_factory=lambda: TinyConfig(hidden_size=96, intermediate_size=288,
                                                                 num_hidden_layers=3))
    p_reason: float = 0.3
    min_terms: int = 2
    max_terms: int = 4
    digits: int = 2
    steps: int = 1500
    batch_size: int = 128
    lr: float = 3e-3
    warmup: int = 100
    min_lr_frac: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 2

    def to_dict(self) -> dict:
        d = asdict(self)
        d["model"] = self.model.to_dict()
        return d


RECIPES = {"arithmetic": PretrainRecipe()}


def make_task(recipe: PretrainRecipe) -> ArithmeticTask:
    if recipe.task != "arithmetic":
        raise ValueError(f"pretrain: unknown task {recipe.task!r}; known: {sorted(RECIPES)}")
    return ArithmeticTask(min_terms=recipe.min_terms, max_terms=recipe.max_terms,
                          digits=recipe.digits, p_reason=recipe.p_reason)


def _batch(task: ArithmeticTask, tokenizer, rng: np.random.Generator, n: int):
    """A right-padded SFT batch: prompt + response + EOS; loss only on response and EOS."""
    problems = task.sample(n, rng)
    ids, labels = [], []
    for p in problems:
        prompt = tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
        resp = tokenizer(task.demonstration(p, rng), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids.append(prompt + resp)
        labels.append([-100] * len(prompt) + resp)
    L = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([x + [pad] * (L - len(x)) for x in ids])
    attn = torch.tensor([[1] * len(x) + [0] * (L - len(x)) for x in ids])
    lab = torch.tensor([y + [-100] * (L - len(y)) for y in labels])
    return input_ids, attn, lab


def _lr_at(step: int, r: PretrainRecipe) -> float:
    if step < r.warmup:
        return r.lr * (step + 1) / r.warmup
    prog = (step - r.warmup) / max(1, r.steps - r.warmup)
    return r.lr * (r.min_lr_frac + (1 - r.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * prog)))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def evaluate_base(model, tokenizer, task) -> dict:
    """Greedy and sampled (T=1, 4 samples) test accuracy, lengths and reasoning rate, by term count."""
    from .rollout import evaluate

    torch.manual_seed(0)
    g, gframe = evaluate(model, tokenizer, task, greedy=True)
    s, sframe = evaluate(model, tokenizer, task, greedy=False, n_samples=4, temperature=1.0)
    by_terms = gframe.groupby("n_terms")["correct"].mean().round(4)
    s_by_terms = sframe.groupby("n_terms")["correct"].mean().round(4)
    return {
        "greedy_accuracy": round(g["accuracy"], 4),
        "greedy_mean_length": round(g["mean_length"], 3),
        "greedy_reasoning_frac": round(g["reasoning_frac"], 4),
        "greedy_accuracy_by_terms": {int(k): float(v) for k, v in by_terms.items()},
        "sampled_accuracy": round(s["accuracy"], 4),
        "sampled_mean_length": round(s["mean_length"], 3),
        "sampled_reasoning_frac": round(s["reasoning_frac"], 4),
        "sampled_accuracy_by_terms": {int(k): float(v) for k, v in s_by_terms.items()},
        "sampled_length_sd": round(float(sframe["length"].std()), 3),
    }


def pretrain(recipe: PretrainRecipe, out: str | Path | None = None, *, progress: bool = True,
             evaluate: bool = True) -> dict:
    """Train the base policy of ``recipe`` and save it (model, tokenizer, ``recipe.json``).

    Deterministic on a given machine and software stack: fixed seeds, fixed thread count,
    data drawn from a seeded ``numpy`` generator.

    Args:
        recipe: what to train.
        out: output directory (default ``data/checkpoints/<task>-base``; only then is the task's
            fixed test set written to ``data/tasks/`` too).
        progress: tqdm bar.
        evaluate: measure test accuracy after training (``metrics`` in the record; skipping it is
            only useful for quick tests).

    Returns:
        The record written to ``recipe.json``.
    """
    default_out = checkpoint_dir(f"{recipe.task}-base")
    out = Path(out) if out is not None else default_out
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    task = make_task(recipe)
    tokenizer = build_char_tokenizer()
    model = tiny_policy(tokenizer, recipe.model, seed=recipe.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay, betas=(0.9, 0.98))
    t0 = time.perf_counter()
    losses = []
    it = range(recipe.steps)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc=f"pretrain {recipe.task}", mininterval=2.0)
    for step in it:
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, recipe)
        input_ids, attn, labels = _batch(task, tokenizer, rng, recipe.batch_size)
        loss = model(input_ids=input_ids, attention_mask=attn, labels=labels, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
        if progress and step % 100 == 0:
            it.set_postfix(loss=f"{np.mean(losses[-100:]):.3f}")
    train_seconds = time.perf_counter() - t0
    model.eval()
    metrics = evaluate_base(model, tokenizer, task) if evaluate else None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if out.resolve() == default_out.resolve():
        task.write_test_set()  # the fixed test set ships next to the base checkpoint
    import transformers

    record = {
        "recipe": recipe.to_dict(),
        "parameters": count_parameters(model),
        "final_loss_mean_last100": round(float(np.mean(losses[-100:])), 4),
        "metrics": metrics,
        "train_seconds": round(train_seconds, 1),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "model_sha256": sha256_file(out / "model.safetensors"),
    }
    (out / "recipe.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("task", choices=sorted(RECIPES))
    ap.add_argument("--out", default=None, help="output directory (default data/checkpoints/TASK-base)")
    ap.add_argument("--steps", type=int, default=None, help="override the recipe's steps (for quick tests)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    recipe = RECIPES[a.task]
    if a.steps is not None:
        from dataclasses import replace
        recipe = replace(recipe, steps=a.steps)
    rec = pretrain(recipe, a.out, progress=not a.quiet)
    print(json.dumps({k: rec[k] for k in ("parameters", "final_loss_mean_last100", "metrics", "train_seconds")}, indent=2))


if __name__ == "__main__":
    main()
