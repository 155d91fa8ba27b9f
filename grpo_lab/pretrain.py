"""Deterministic supervised pretraining of the tiny base policies shipped in ``data/checkpoints``.

    python -m grpo_lab.pretrain arithmetic            # → data/checkpoints/arithmetic-base/
    python -m grpo_lab.pretrain arithmetic-filler     # → data/checkpoints/arithmetic-filler-base/
    python -m grpo_lab.pretrain arithmetic-moe        # → data/checkpoints/arithmetic-moe-base/
    python -m grpo_lab.pretrain arithmetic --out DIR  # anywhere else

The recipe (model size, data mixture, optimiser, steps, seed) is a frozen dataclass; the
checkpoint directory holds the ``transformers`` model (safetensors), the tokenizer, and
``recipe.json`` with the recipe, the measured test accuracy and the software versions. A test
reloads the committed checkpoint and checks both the recipe and the accuracy.

Pretraining is plain next-token cross-entropy on the response (prompt tokens are not scored).
The data mixture makes the base policy answer most questions directly and reason only
sometimes, so its greedy accuracy sits in the 20–60% band and RL has room to act.

``arithmetic-filler`` is the same recipe on the filler variant of the task
(:class:`~grpo_lab.tasks.ArithmeticTask` with ``filler="."``): half of its demonstrations end
with a run of 1–12 dots after the answer, which the parser ignores, so the base policy pads some
answers and response length is free of correctness (chapter 3's length-bias experiment).

``arithmetic-moe`` is ``arithmetic``'s recipe (task, data, optimiser, steps, seed) with a
Qwen3-MoE-style model of the same width and depth: 8 experts of width 36 per layer, top-2
routing (the experts hold the dense MLP's parameters), for the Mixture-of-Experts side of GSPO
(arXiv 2507.18071, §5.3: routing replay, :mod:`grpo_lab.moe`). Its loss adds transformers'
load-balancing term (``router_aux_loss_coef`` of the model config, 0.001) so that the experts
share the tokens.
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
    """Everything that determines a base checkpoint.

    Besides the model, the data mixture (``p_reason``, term counts, digits) and the optimiser
    (AdamW, linear warm-up then cosine decay to ``min_lr_frac * lr``, global-norm clipping):

    * ``filler``, ``p_filler``, ``max_filler``, ``filler_position``: the filler variant of the
      task (:class:`~grpo_lab.tasks.ArithmeticTask`); ``""`` / 0 is the plain task;
    * ``max_new_tokens``: the task's generation budget (tokens), used to evaluate the checkpoint;
    * ``init``: ``""`` (train from the seeded random initialisation) or the name of a checkpoint
      under ``data/checkpoints`` with the same architecture and alphabet to fine-tune.
    """

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
    filler: str = ""
    p_filler: float = 0.0
    max_filler: int = 0
    filler_position: str = "end"
    max_new_tokens: int = 32
    init: str = ""

    def to_dict(self) -> dict:
        """The recipe as a JSON-able dict, ``model`` expanded. The fields added after the first
        shipped checkpoint are recorded only when used: the filler fields (``filler`` …
        ``max_new_tokens``) when ``filler`` is set, ``init`` when set; so the ``recipe.json`` of
        checkpoints made before they existed still equals this dict."""
        d = asdict(self)
        d["model"] = self.model.to_dict()
        if not self.filler:  # the filler fields go together
            for k in ("filler", "p_filler", "max_filler", "filler_position", "max_new_tokens"):
                d.pop(k)
        if not self.init:
            d.pop("init")
        return d


#: The recipe of each shipped base checkpoint, by name — ``python -m grpo_lab.pretrain NAME``
#: writes ``data/checkpoints/NAME-base``. ``arithmetic-filler`` fine-tunes ``arithmetic-base``
#: (``init``; it must exist) for 300 steps on demonstrations that end with a run of 1-12 dots
#: half of the time (mean 3.25 dots per demonstration), so it keeps that checkpoint's arithmetic
#: and learns to pad; its task's generation budget is 64 tokens, so that a padded reasoning
#: answer (at most 25 + 12 characters and EOS) fits with room for the length to grow under RL.
#: ``arithmetic-moe`` is ``arithmetic`` with a Qwen3-MoE-style model (8 experts of width 36, top 2,
#: about the dense model's parameter count: 339,888 against 338,016).
RECIPES = {
    "arithmetic": PretrainRecipe(),
    "arithmetic-filler": PretrainRecipe(filler=".", p_filler=0.5, max_filler=12, filler_position="end",
                                        max_new_tokens=64, init="arithmetic-base", steps=300, lr=1e-3,
                                        warmup=20),
    "arithmetic-moe": PretrainRecipe(model=TinyConfig(arch="qwen3_moe", hidden_size=96, intermediate_size=288,
                                                      num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                                                      moe_intermediate_size=36)),
}


def make_task(recipe: PretrainRecipe) -> ArithmeticTask:
    """The task whose demonstrations ``recipe`` trains on (and whose test set evaluates it).

    Raises:
        ValueError: ``recipe.task`` is not ``"arithmetic"``, or invalid task settings (as
            :class:`~grpo_lab.tasks.ArithmeticTask`).
    """
    if recipe.task != "arithmetic":
        raise ValueError(f"pretrain: unknown task {recipe.task!r}; known: ['arithmetic']")
    return ArithmeticTask(min_terms=recipe.min_terms, max_terms=recipe.max_terms, digits=recipe.digits,
                          p_reason=recipe.p_reason, max_new_tokens=recipe.max_new_tokens, filler=recipe.filler,
                          p_filler=recipe.p_filler, max_filler=recipe.max_filler,
                          filler_position=recipe.filler_position)


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
    extra = {}
    if getattr(task, "filler", ""):
        fill = sframe["completion"].map(task.filler_length)
        extra = {"sampled_filler_frac": round(float((fill > 0).mean()), 4),
                 "sampled_mean_filler": round(float(fill.mean()), 3),
                 "sampled_truncation_rate": round(float(sframe["truncated"].mean()), 4)}
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
        **extra,
    }


def pretrain(recipe: PretrainRecipe, out: str | Path | None = None, *, progress: bool = True,
             evaluate: bool = True, name: str | None = None) -> dict:
    """Train the base policy of ``recipe`` and save it (model, tokenizer, ``recipe.json``).

    Deterministic on a given machine and software stack: fixed seeds, fixed thread count,
    data drawn from a seeded ``numpy`` generator.

    Args:
        recipe: what to train.
        out: output directory (default ``data/checkpoints/<name>-base``; only then is the task's
            fixed test set written to ``data/tasks/`` too).
        progress: tqdm bar.
        evaluate: measure test accuracy after training (``metrics`` in the record; skipping it is
            only useful for quick tests).
        name: the checkpoint's name (a key of :data:`RECIPES`; default ``recipe.task``).

    Returns:
        The record written to ``recipe.json``.

    Raises:
        ValueError: an invalid recipe (as ``make_task``) or an empty ``name``.
    """
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"pretrain: name must be a non-empty string, got {name!r}")
    default_out = checkpoint_dir(f"{name or recipe.task}-base")
    out = Path(out) if out is not None else default_out
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    task = make_task(recipe)
    tokenizer = build_char_tokenizer()
    model = tiny_policy(tokenizer, recipe.model, seed=recipe.seed)
    if recipe.init:  # fine-tune a shipped checkpoint of the same architecture and alphabet
        from .models import load_policy

        init_dir = checkpoint_dir(recipe.init)
        if not (init_dir / "model.safetensors").is_file():
            raise ValueError(f"pretrain: init checkpoint {recipe.init!r} not found at {init_dir}; make it first "
                             f"(python -m grpo_lab.pretrain {recipe.init.removesuffix('-base')})")
        start, init_tok = load_policy(init_dir)
        if init_tok.get_vocab() != tokenizer.get_vocab():
            raise ValueError(f"pretrain: init checkpoint {recipe.init!r} has another alphabet")
        try:
            model.load_state_dict(start.state_dict())
        except RuntimeError as exc:
            raise ValueError(f"pretrain: init checkpoint {recipe.init!r} does not match recipe.model ({exc})") from None
        del start
    moe_kwargs = {"output_router_logits": True} if recipe.model.is_moe else {}
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
        # a MoE model's loss includes its load-balancing term (router_aux_loss_coef of its config)
        loss = model(input_ids=input_ids, attention_mask=attn, labels=labels, use_cache=False, **moe_kwargs).loss
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
    """Command line ``python -m grpo_lab.pretrain TASK [--out DIR] [--steps N] [--quiet]`` (see :data:`RECIPES`)."""
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
    rec = pretrain(recipe, a.out, progress=not a.quiet, name=a.task)
    print(json.dumps({k: rec[k] for k in ("parameters", "final_loss_mean_last100", "metrics", "train_seconds")}, indent=2))


if __name__ == "__main__":
    main()
