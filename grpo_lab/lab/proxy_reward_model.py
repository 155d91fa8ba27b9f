"""The dialogue toy's learned proxy reward model (issue 55): a tiny sequence regressor fitted to the gold reward.

    python -m grpo_lab.lab.proxy_reward_model             # -> data/checkpoints/dialogue-rm/ (seconds, deterministic)
    python -m grpo_lab.lab.proxy_reward_model --out DIR   # anywhere else

:func:`~grpo_lab.lab.proxy_reward_model.build_reward_model` samples continuations of training contexts from
``corpus-base`` (temperature 1), labels each with :func:`~grpo_lab.tasks.dialogue.gold_reward`, and fits a one-layer
Qwen2 sequence classifier (``num_labels = 1``, the last token's score) to those labels by mean squared error, as a
reward model is fitted to human labels of the base policy's samples (InstructGPT, arXiv 2203.02155, §3.5, with a
regression loss instead of the pairwise one). It only ever sees the base policy's distribution, so it can be
over-optimised (Gao et al. 2022, arXiv 2210.10760). ``recipe.json`` records the recipe, the rank correlation with
gold on held-out base samples and the sha256 of the weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..paths import checkpoint_dir

__all__ = ["RewardModelRecipe", "RECIPE", "sample_labelled", "build_reward_model", "main"]


@dataclass(frozen=True)
class RewardModelRecipe:
    """How the proxy is built.

    Attributes:
        policy: the base policy whose samples are labelled. n_train, n_held_out: labelled samples to fit on and
            to measure the fit on (disjoint contexts). max_new_tokens: the sample budget (the task's).
        hidden, layers, heads: the regressor's size. epochs, batch, lr, weight_decay: AdamW on the squared error.
        seed: one seed for sampling and training.
    """

    policy: str = "corpus-base"
    n_train: int = 512
    n_held_out: int = 256
    max_new_tokens: int = 32
    hidden: int = 32
    layers: int = 1
    heads: int = 2
    epochs: int = 30
    batch: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 0


#: The shipped proxy's recipe.
RECIPE = RewardModelRecipe()


def sample_labelled(n: int, *, policy: str = "corpus-base", max_new_tokens: int = 32, seed: int = 0
                    ) -> tuple[list[str], np.ndarray]:
    """``n`` base-policy continuations (one per training context, temperature 1) and their gold rewards.

    Returns:
        ``(texts, gold)``: ``n`` str and a float64 ``[n]`` array in [0, 1].

    Raises:
        ValueError: ``n < 1``.
    """
    from ..policy.models import load_policy
    from ..policy.rollout import generate
    from ..tasks.dialogue import DialogueTask, gold_reward

    if n < 1:
        raise ValueError(f"sample_labelled: n must be >= 1, got {n}")
    model, tok = load_policy(policy)
    problems = DialogueTask(max_new_tokens=max_new_tokens).sample(n, np.random.default_rng(seed))
    torch.manual_seed(seed)
    texts: list[str] = []
    for s in range(0, n, 128):
        texts += generate(model, tok, problems[s:s + 128], max_new_tokens=max_new_tokens, with_logprobs=False).texts
    return texts, np.array([gold_reward(t) for t in texts], dtype=np.float64)


def _regressor(recipe: RewardModelRecipe, tok):
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=recipe.hidden, intermediate_size=4 * recipe.hidden,
                      num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads,
                      num_key_value_heads=recipe.heads, max_position_embeddings=128, num_labels=1,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    return Qwen2ForSequenceClassification(cfg)


def _fit(model, tok, texts: list[str], gold: np.ndarray, recipe: RewardModelRecipe) -> float:
    """AdamW on the squared error of the last token's score; returns the last epoch's mean loss."""
    texts = [t or tok.eos_token for t in texts]  # as DialogueTask.proxy scores an empty response
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    y = torch.tensor(gold, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    gen = torch.Generator().manual_seed(recipe.seed)
    model.train()
    loss_sum = 0.0
    for _ in range(recipe.epochs):
        order, loss_sum = torch.randperm(len(texts), generator=gen), 0.0
        for s in range(0, len(texts), recipe.batch):
            idx = order[s:s + recipe.batch]
            pred = model(input_ids=enc["input_ids"][idx], attention_mask=enc["attention_mask"][idx]).logits[:, 0]
            loss = torch.nn.functional.mse_loss(pred, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += float(loss.detach()) * len(idx)
    return loss_sum / len(texts)


def build_reward_model(out: str | Path | None = None, recipe: RewardModelRecipe = RECIPE) -> dict:
    """Sample, label, fit and save the proxy (model, tokenizer, ``recipe.json``) to ``out`` (default
    ``data/checkpoints/dialogue-rm``); returns the record written to ``recipe.json``: the recipe, the final
    training loss, the Spearman and Pearson correlations of proxy with gold on the held-out base samples, and
    the weights' sha256. Deterministic on one machine (one thread, fixed seeds)."""
    from scipy import stats as sps

    from ..policy.models import load_tokenizer
    from ..tasks.dialogue import DialogueTask

    out = Path(out) if out is not None else checkpoint_dir("dialogue-rm")
    torch.manual_seed(recipe.seed)
    texts, gold = sample_labelled(recipe.n_train + recipe.n_held_out, policy=recipe.policy,
                                  max_new_tokens=recipe.max_new_tokens, seed=recipe.seed)
    tok = load_tokenizer(str(checkpoint_dir(recipe.policy)))
    torch.manual_seed(recipe.seed)
    model = _regressor(recipe, tok)
    loss = _fit(model, tok, texts[:recipe.n_train], gold[:recipe.n_train], recipe)
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(out)
    tok.save_pretrained(out)
    held = texts[recipe.n_train:]
    proxy = np.array(DialogueTask(reward_model=str(out)).proxy(held), dtype=np.float64)
    record = {"recipe": dataclasses.asdict(recipe), "final_train_mse": round(loss, 6),
              "held_out": {"n": len(held), "spearman": round(float(sps.spearmanr(proxy, gold[recipe.n_train:])[0]), 4),
                           "pearson": round(float(np.corrcoef(proxy, gold[recipe.n_train:])[0, 1]), 4),
                           "gold_mean": round(float(gold[recipe.n_train:].mean()), 4),
                           "proxy_mean": round(float(proxy.mean()), 4)},
              "sha256": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()}
    (out / "recipe.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def main(argv=None) -> None:
    """Command line: build the proxy (``--out`` another directory)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="the directory (default data/checkpoints/dialogue-rm)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps(build_reward_model(a.out), indent=2))


if __name__ == "__main__":
    main()
