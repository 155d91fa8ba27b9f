"""A task of your own for grpo_lab: reverse a word of lowercase letters.

Used by the book's page "Use it on your own problem" (``book/own_task.ipynb``): a task is any
object with the members of :class:`grpo_lab.tasks.Task`. This one is a dataclass, so that
``Trainer.save`` can store its fields and ``Trainer.resume`` can rebuild it once it is registered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_lab.tasks import Problem, register_task

LETTERS = "abcdefgh"


@register_task("reverse")
@dataclass(frozen=True)
class ReverseTask:
    """Reverse a word: prompt ``"abcd="``, answer ``"dcba"``.

    Attributes:
        name: the registry name (``"reverse"``).
        max_new_tokens: generation budget in tokens (the word, then EOS).
        min_len, max_len: word lengths, drawn uniformly (inclusive).
        test_size: number of test problems (a fixed seed, the same on every call).
    """

    name: str = "reverse"
    max_new_tokens: int = 8
    min_len: int = 3
    max_len: int = 5
    test_size: int = 100

    def sample(self, n: int, rng: np.random.Generator) -> list[Problem]:
        """``n`` problems, every random draw from ``rng`` (what makes runs repeat and resume exactly)."""
        words = ["".join(rng.choice(list(LETTERS), int(rng.integers(self.min_len, self.max_len + 1))))
                 for _ in range(n)]
        return [Problem(prompt=w + "=", answer=w[::-1]) for w in words]

    def is_correct(self, completion: str, problem: Problem) -> bool:
        """The exact reversed word, nothing after it."""
        return completion.strip() == problem.answer

    def reward(self, completion: str, problem: Problem) -> float:
        """1 for the exact answer; otherwise the fraction of the answer's letters right in place,
        halved (a partial credit that still ranks every exact answer above every inexact one)."""
        if self.is_correct(completion, problem):
            return 1.0
        hits = sum(a == b for a, b in zip(completion.strip(), problem.answer))
        return 0.5 * hits / max(len(problem.answer), len(completion.strip()), 1)

    def test_set(self) -> list[Problem]:
        """``test_size`` fixed problems (seed 12345)."""
        return self.sample(self.test_size, np.random.default_rng(12345))


def build_policy(seed: int = 0):
    """The own-task page's policy and tokenizer: a two-layer GPT-2 (64 wide, 4 heads, 0.1 M parameters)
    initialised with ``torch.manual_seed(seed)``, and a character-level tokenizer of ``<pad>``, ``<eos>``,
    ``<unk>``, :data:`LETTERS` and ``=`` (one token per character).

    Returns:
        ``(model, tokenizer)``: a ``transformers.GPT2LMHeadModel`` and a ``PreTrainedTokenizerFast``.
    """
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *LETTERS, "="])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    core.decoder = decoders.Fuse()  # decode without spaces between characters
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    config = GPT2Config(vocab_size=len(vocab), n_positions=32, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config), tokenizer


def warm_start(model, tokenizer, task: ReverseTask, *, steps: int = 50, batch_size: int = 64, lr: float = 3e-3,
               seed: int = 0) -> list[float]:
    """The own-task page's supervised warm start, in place: ``steps`` AdamW steps (constant ``lr``) of
    next-token cross-entropy on ``batch_size`` reversed words drawn from ``numpy.random.default_rng(seed)``,
    the prompt tokens not scored. Stopped early on purpose: the policy is then right only part of the time.

    Returns:
        The loss of every step (nats per scored token).
    """
    import torch

    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        batch = task.sample(batch_size, rng)
        prompts = [tokenizer(p.prompt).input_ids for p in batch]
        seqs = [q + tokenizer(p.answer).input_ids + [tokenizer.eos_token_id] for q, p in zip(prompts, batch)]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
        labels = torch.full((len(seqs), width), -100)  # -100: not scored
        for i, (q, s) in enumerate(zip(prompts, seqs)):
            ids[i, :len(s)] = torch.tensor(s)
            labels[i, len(q):len(s)] = torch.tensor(s[len(q):])
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses
