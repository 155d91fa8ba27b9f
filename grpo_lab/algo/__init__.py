"""The subject: the GRPO family as pure tensor functions in registries (torch only).

One module per concern: :mod:`~grpo_lab.algo.algorithms` (the ``Algorithm`` value and the presets),
:mod:`~grpo_lab.algo.objectives` (ratios, surrogates, aggregations, KL estimators, ``policy_loss``,
``value_loss``), :mod:`~grpo_lab.algo.advantages`, :mod:`~grpo_lab.algo.selection` (which groups
train, the loss mask, reward shaping), :mod:`~grpo_lab.algo.rewards`, :mod:`~grpo_lab.algo.hparams`
(declared hyper-parameters), :mod:`~grpo_lab.algo.metrics` and :mod:`~grpo_lab.algo.checks`
(argument checks). Nothing here imports a model, a task or the trainer.

The names a chapter or a user needs are imported here: ``from grpo_lab.algo import GRPO, policy_loss``.
"""

from .advantages import ADVANTAGE_ESTIMATORS, AdvantageBatch, gae, group_advantages, rloo_advantages
from .algorithms import (CISPO, CLIP_COV, DAPO, DR_GRPO, GMPO, GRPO, GSPO, GSPO_TOKEN, KL_COV, MIS, PPO, PRESETS, RPT,
                         RPT_HYBRID, RPT_SAMPLING, SAPO, TIS, VAPO, Algorithm, deepseek_v32, get_algorithm)
from .hparams import declare
from .objectives import (AGGREGATIONS, KL_ESTIMATORS, MISMATCH_CORRECTIONS, RATIOS, SURROGATES, LossContext,
                         LossOutput, kl_estimate, policy_loss, value_loss)
from .selection import SELECTORS

__all__ = ["Algorithm", "PRESETS", "get_algorithm", "deepseek_v32", "GRPO", "DR_GRPO", "DAPO", "GSPO", "GSPO_TOKEN",
           "CISPO", "PPO", "VAPO", "RPT", "RPT_HYBRID", "RPT_SAMPLING", "GMPO", "SAPO", "KL_COV", "CLIP_COV", "TIS",
           "MIS", "policy_loss", "value_loss", "kl_estimate", "LossContext", "LossOutput", "RATIOS", "SURROGATES",
           "AGGREGATIONS", "KL_ESTIMATORS", "MISMATCH_CORRECTIONS", "ADVANTAGE_ESTIMATORS", "AdvantageBatch", "group_advantages",
           "rloo_advantages", "gae", "SELECTORS", "declare"]
