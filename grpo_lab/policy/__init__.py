"""The model side: a ``transformers`` causal LM as the policy, and what is computed with it.

:mod:`~grpo_lab.policy.models` (loading policies and tokenizers, the tiny shipped models, value
heads), :mod:`~grpo_lab.policy.lora` (LoRA adapters through peft), :mod:`~grpo_lab.policy.moe`
(mixture-of-experts routing record and replay), :mod:`~grpo_lab.policy.logprobs` (token
log-probabilities and entropies in chunks) and :mod:`~grpo_lab.policy.rollout` (sampling groups of
completions, greedy evaluation, ``policy_logprobs``). Imports :mod:`grpo_lab.algo` and, for the
``Problem`` type, :mod:`grpo_lab.tasks.base`; nothing from the trainer.
"""

from .lora import LoraSpec
from .models import TinyConfig, load_policy, load_tokenizer, tiny_policy
from .rollout import Rollout, evaluate, generate, policy_logprobs

__all__ = ["load_policy", "load_tokenizer", "TinyConfig", "tiny_policy", "LoraSpec", "Rollout", "generate", "evaluate",
           "policy_logprobs"]
