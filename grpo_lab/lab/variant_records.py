"""The variants as data: one record per paper, and what each preset changes relative to GRPO.

Two halves, kept apart on purpose:

* **what the papers say** -- :data:`RECORDS`, one :class:`VariantRecord` per variant: the paper, its
  arXiv id, the core innovation, the problem it says it solves, a typical use, and who reports using
  it. Every statement comes from the project's reference sheets (``shared/reference/papers.md``, the
  papers' equations, settings and numbers as read from their text; ``anchors.md``, what TRL and verl
  compute) or, for GMPO, SAPO, KL-Cov and Clip-Cov, which those sheets do not cover, from the papers'
  abstracts and the comments of their presets in :mod:`grpo_lab.algo.algorithms`. Where the sheets do not support a claim,
  the record says so (:data:`NOT_STATED` for its users) instead of guessing.
* **what the code does** -- :func:`axes_changed`, computed from the fields of two
  :class:`~grpo_lab.algo.algorithms.Algorithm` values, never typed by hand: a preset's changes can
  therefore not drift from the preset. The fields are grouped into the axes of the design
  (:data:`AXIS_FIELDS`); the hyper-parameters a variant's own functions declare
  (:attr:`~grpo_lab.algo.algorithms.Algorithm.params`, e.g. SAPO's ``tau_pos``) count under the axis
  whose function declares them (:data:`REGISTRY_AXES`), so that "SAPO changes the clipping" and
  not "SAPO changes the clipping and some hyper-parameters".

:func:`check_axes` turns the second half into an exercise with a checkable answer, and
:func:`records_table` puts both halves in one table, one row per variant.

This module imports nothing from the package but :mod:`grpo_lab.algo.algorithms` (and pandas, inside
:func:`records_table` only).
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Union

from ..algo import algorithms
from ..algo.algorithms import GRPO, Algorithm

__all__ = [
    "ADVANTAGE",
    "RATIO_LEVEL",
    "CLIPPING",
    "AGGREGATION",
    "REGULARISER",
    "SAMPLING",
    "VALUE_MODEL",
    "EXTRA_LOSS",
    "AXIS_FIELDS",
    "AXES",
    "ATTRIBUTED_FIELDS",
    "REGISTRY_AXES",
    "ABSENT",
    "NOT_STATED",
    "VariantRecord",
    "RECORDS",
    "axes_changed",
    "changed_axes",
    "describe_changes",
    "check_axes",
    "TABLE_COLUMNS",
    "records_table",
]

#: axis name of the advantage estimator and its ``adv_eps``
ADVANTAGE = "advantage"
#: axis name of the importance ratio (token, sequence, sequence-token; DeepSeek-V3.2's Keep Sampling Mask)
RATIO_LEVEL = "ratio level"
#: axis name of the clipping object (the surrogate) and its ranges
CLIPPING = "clipping"
#: axis name of the token-loss aggregation and its constant normaliser
AGGREGATION = "aggregation"
#: axis name of the KL regulariser to the reference policy
REGULARISER = "regulariser"
#: axis name of which samples train and how rewards are shaped
SAMPLING = "sampling & shaping"
#: axis name of the value model and GAE (PPO, VAPO)
VALUE_MODEL = "value model / GAE"
#: axis name of loss terms added to the policy loss (VAPO's NLL, the RPT ablation's NTP)
EXTRA_LOSS = "extra loss terms"

#: The fields of :class:`~grpo_lab.algo.algorithms.Algorithm` on each axis, in table order. Every field but
#: ``name`` (a label) and ``params`` (see :data:`ATTRIBUTED_FIELDS`) is on exactly one axis, which
#: tests/lab/test_variant_records.py checks, so a new field cannot be left out. ``mask_eps_low`` /
#: ``mask_eps_high`` (MiniMax-M1's token mask, Eqs. 6-7) sit with the other masks, under sampling &
#: shaping.
AXIS_FIELDS: Mapping[str, tuple[str, ...]] = types.MappingProxyType({
    ADVANTAGE: ("advantage", "adv_eps"),
    RATIO_LEVEL: ("ratio_level", "keep_sampling_mask", "mismatch"),
    CLIPPING: ("surrogate", "eps_low", "eps_high"),
    AGGREGATION: ("aggregation", "max_tokens"),
    REGULARISER: ("kl", "beta", "kl_importance_correction"),
    SAMPLING: ("dynamic_sampling", "overlong_filter", "overlong_cache_len", "overlong_cache_frac",
               "offpolicy_mask_delta", "mask_eps_low", "mask_eps_high"),
    VALUE_MODEL: ("gamma", "lam", "lam_alpha", "critic_lam", "value_clip_eps"),
    EXTRA_LOSS: ("nll_coef", "ntp_coef"),
})

#: The axis names in table order (the keys of :data:`AXIS_FIELDS`).
AXES: tuple[str, ...] = tuple(AXIS_FIELDS)

#: Fields whose entries are spread over the axes, each entry under the axis of the function that
#: declares it (:data:`REGISTRY_AXES`), instead of the field sitting on one axis.
ATTRIBUTED_FIELDS: tuple[str, ...] = ("params",)

#: The axis of each registry whose functions :meth:`~grpo_lab.algo.algorithms.Algorithm.functions` lists
#: (``SELECTORS`` is :mod:`grpo_lab.algo.selection`'s group selector). A hyper-parameter in ``params``
#: counts under the axis of the function that declares it; one that no listed function declares
#: itself belongs to a whole-minibatch statistic, which only a surrogate may declare
#: (:mod:`grpo_lab.algo.hparams`), and counts under :data:`CLIPPING`.
REGISTRY_AXES: Mapping[str, str] = types.MappingProxyType({
    "ADVANTAGE_ESTIMATORS": ADVANTAGE,
    "RATIOS": RATIO_LEVEL,
    "MISMATCH_CORRECTIONS": RATIO_LEVEL,
    "SURROGATES": CLIPPING,
    "AGGREGATIONS": AGGREGATION,
    "KL_ESTIMATORS": REGULARISER,
    "SELECTORS": SAMPLING,
})

#: What a record says where the reference sheets support no claim (e.g. a variant's users).
NOT_STATED = "not stated"


class _Absent:
    """The value of a hyper-parameter that one of two compared algorithms does not have."""

    _instance: Optional["_Absent"] = None

    def __new__(cls) -> "_Absent":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "absent"

    def __reduce__(self):
        return (_Absent, ())


#: Stands in :func:`axes_changed` for a hyper-parameter one algorithm has and the other has not
#: (``SAPO``'s ``tau_pos`` against GRPO is ``(ABSENT, 1.0)``); its repr is ``absent``.
ABSENT = _Absent()

_ARXIV = re.compile(r"\d{4}\.\d{5}")


@dataclass(frozen=True)
class VariantRecord:
    """What one paper proposes, in a few plain sentences, with the section each statement comes from.

    Attributes:
        preset: the name of the preset constant in :mod:`grpo_lab.algo.algorithms` (``"DR_GRPO"``).
        paper: short title and authors or organisation.
        arxiv: the arXiv id, ``NNNN.NNNNN``.
        year: the year of the arXiv version (20YY from the id's first two digits).
        innovation: the core innovation, one sentence, with the equation or section.
        pain_point: the problem the paper says it solves, or a sentence saying the reference sheets
            do not record it.
        typical_use: the setting the paper uses it in, and which anchor libraries implement it.
        users: who reports using it, ``((who, citation), ...)`` with the citation naming the source
            and its section, or :data:`NOT_STATED`.
        chapter: the book chapter (file stem, ``"04_gspo"``) that covers it, or None.
        sources: where this record's statements come from (``"papers.md §4"``).

    Raises:
        ValueError: (when built) an empty text field, an arXiv id not of the form ``NNNN.NNNNN``, a
            year that is not the id's, ``users`` neither :data:`NOT_STATED` nor a non-empty tuple of
            ``(who, citation)`` pairs of non-empty strings, or a ``chapter`` that is neither None
            nor a non-empty string.
    """

    preset: str
    paper: str
    arxiv: str
    year: int
    innovation: str
    pain_point: str
    typical_use: str
    users: Union[tuple[tuple[str, str], ...], str]
    chapter: Optional[str]
    sources: str

    def __post_init__(self) -> None:
        for name in ("preset", "paper", "innovation", "pain_point", "typical_use", "sources"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"VariantRecord.{name} must be a non-empty string, got {value!r}")
        if not isinstance(self.arxiv, str) or not _ARXIV.fullmatch(self.arxiv):
            raise ValueError(f"VariantRecord.arxiv must be an arXiv id NNNN.NNNNN, got {self.arxiv!r}")
        if self.year != 2000 + int(self.arxiv[:2]):
            raise ValueError(f"VariantRecord.year {self.year!r} is not the year of arXiv {self.arxiv} "
                             f"({2000 + int(self.arxiv[:2])})")
        if self.users != NOT_STATED:
            ok = isinstance(self.users, tuple) and self.users and all(
                isinstance(u, tuple) and len(u) == 2 and all(isinstance(s, str) and s.strip() for s in u)
                for u in self.users)
            if not ok:
                raise ValueError(f"VariantRecord.users must be {NOT_STATED!r} or a non-empty tuple of "
                                 f"(who, citation) string pairs, got {self.users!r}")
        if self.chapter is not None and (not isinstance(self.chapter, str) or not self.chapter.strip()):
            raise ValueError(f"VariantRecord.chapter must be a chapter file stem or None, got {self.chapter!r}")

    def users_text(self) -> str:
        """``users`` as one string: ``"who (citation); ..."``, or :data:`NOT_STATED`. Raises nothing."""
        if self.users == NOT_STATED:
            return NOT_STATED
        return "; ".join(f"{who} ({cite})" for who, cite in self.users)


# ------------------------------------------------------------------------------------------- records
# Each statement below is taken from papers.md (the section is named in `sources`), anchors.md, or,
# for the four variants papers.md does not cover, the comment above the preset in algorithms.py.

_GRPO = VariantRecord(
    preset="GRPO",
    paper="DeepSeekMath (Shao et al., DeepSeek-AI)",
    arxiv="2402.03300",
    year=2024,
    innovation="A group-relative advantage: each of G responses to a question is scored by its reward "
               "standardised within the group, (r - mean) / std (§4.1.2), inside PPO's per-token clipped "
               "objective with a k3 KL penalty inside the token sum (Eqs. 3-4).",
    pain_point="PPO's value model, 'typically another model of comparable size as the policy model', brings 'a "
               "substantial memory and computational burden', and a reward given only at the last token makes a "
               "per-token value function hard to train (§4.1.1); GRPO's baseline is the group's own mean reward "
               "(Eq. 3, §4.1.2), so no value model is trained.",
    typical_use="RL for maths reasoning: DeepSeekMath-RL 7B on about 144K chain-of-thought GSM8K/MATH "
                "questions, G = 64, beta = 0.04, one update per exploration stage (§4.2); rule-based rewards "
                "at scale in R1-Zero. Implemented by TRL, verl, OpenRLHF and Liger (anchors.md a.1-a.2).",
    users=(("DeepSeekMath-RL 7B (the authors)", "arXiv 2402.03300 §4.2, papers.md §1"),
           ("DeepSeek-R1-Zero and DeepSeek-R1", "arXiv 2501.12948 v1 §2.2.1, Eqs. 1-3, papers.md §1"),
           ("DeepSeek-V3.2, with R - mean advantages and an importance-corrected KL",
            "arXiv 2512.02556 §3.1 'Scaling GRPO', Eqs. 5-9, papers.md §3"),
           ("DeepSeekMath-V2", "DeepSeekMath-V2 PDF §2.1-2.2, papers.md §3"),
           ("RPT (Reinforcement Pre-Training)", "arXiv 2506.08007 Eq. 4 and §3.3, papers.md §8")),
    chapter="01_grpo",
    sources="papers.md §1, §3, §8; anchors.md a.1-a.2",
)

_DAPO = VariantRecord(
    preset="DAPO",
    paper="DAPO: An Open-Source LLM RL System at Scale (Yu et al.)",
    arxiv="2503.14476",
    year=2025,
    innovation="Four changes to GRPO without a KL term (§2.3): Clip-Higher with eps_low 0.2 and eps_high 0.28 "
               "(Eq. 10), Dynamic Sampling of groups whose accuracy is strictly between 0 and 1 (Eq. 11), a "
               "token-level loss normalised by 1 / sum_i |o_i| (Eq. 12), and overlong filtering plus a soft "
               "overlong punishment (§3.4, Eq. 13).",
    pain_point="Naive GRPO reaches AIME24 30 against DAPO's 50 on Qwen2.5-32B (Table 1): with eps = 0.2 a token "
               "at probability 0.01 can rise only to 0.012 (§3.1), groups with accuracy 0 or 1 have zero "
               "advantage (§3.2), the per-sample average gives long responses' tokens less weight (§3.3), and "
               "truncated responses need their own treatment (§3.4).",
    typical_use="Long chain-of-thought RL from a base model: Qwen2.5-32B on DAPO-Math-17K, G = 16, 16 gradient "
                "updates per rollout step, 20,480-token budget (§4.1). verl's DAPO recipe has every part; TRL "
                "has clip-higher, the token mean and overlong filtering, not dynamic sampling or the soft "
                "penalty (anchors.md b.6).",
    users=(("the authors, Qwen2.5-32B (AIME24 50)", "arXiv 2503.14476 §4.1-4.2 and Table 1, papers.md §7"),
           ("MiniMax-M1, DAPO's dynamic sampling and length penalty beside CISPO",
            "arXiv 2506.13585 §3.1, papers.md §5")),
    chapter="02_dapo",
    sources="papers.md §5, §7; anchors.md b.6",
)

_DR_GRPO = VariantRecord(
    preset="DR_GRPO",
    paper="Understanding R1-Zero-Like Training: A Critical Perspective (Liu et al.)",
    arxiv="2503.20783",
    year=2025,
    innovation="Removes GRPO's 1/|o_i| and std(R) terms: the advantage is R - mean(R) and each response's token "
               "sum is divided by a constant, the generation budget MAX_TOKENS (§3.2, Listing 1).",
    pain_point="Two biases of GRPO (§3.1, Fig. 5): the 1/|o_i| factor gives a response-level length bias that "
               "lets incorrect answers grow longer, and dividing by std(R) gives a question-level difficulty "
               "bias that gives questions with low reward spread more weight.",
    typical_use="R1-Zero-like RL straight from a base model: Qwen2.5-Math-7B on MATH levels 3-5 with beta = 0, "
                "27 hours on 8 A100 (the minimalist recipe, whose models Table 4 reports). TRL loss_type='dr_grpo' with "
                "scale_rewards='none', or the authors' oat (anchors.md b.2).",
    users=(("the authors' Oat-Zero-7B, -1.5B and -3B", "arXiv 2503.20783 Table 4, papers.md §2"),),
    chapter="03_dr_grpo",
    sources="papers.md §2; anchors.md b.2",
)

_GSPO = VariantRecord(
    preset="GSPO",
    paper="Group Sequence Policy Optimization (Zheng et al., Qwen)",
    arxiv="2507.18071",
    year=2025,
    innovation="A sequence-level importance ratio, the length-normalised likelihood ratio "
               "s_i = (pi_theta(y_i) / pi_old(y_i))^(1/|y_i|) (Eq. 7), clipped once per response (Eq. 5) with "
               "ranges of 3e-4 and 4e-4 (§5.1).",
    pain_point="GRPO weights each token's gradient by its own ratio (Eq. 11), noise the paper argues accumulates "
               "over long sequences; on an MoE model about 10% of the activated experts change per update, so "
               "GRPO needed Routing Replay to converge (§5.3).",
    typical_use="RL of a large MoE model: a cold-start model from Qwen3-30B-A3B-Base, 4 mini-batches per "
                "rollout batch, no KL (§5.1). TRL importance_sampling_level='sequence', verl loss_mode='gspo' "
                "(anchors.md b.4).",
    users=(("Qwen3: the paper credits GSPO for the latest Qwen3 models' improvements",
            "arXiv 2507.18071, papers.md §4 'Headline numbers'"),
           ("the authors, Qwen3-30B-A3B", "arXiv 2507.18071 §5.1, papers.md §4")),
    chapter="04_gspo",
    sources="papers.md §4; anchors.md b.4",
)

_CISPO = VariantRecord(
    preset="CISPO",
    paper="MiniMax-M1 technical report, CISPO (MiniMax)",
    arxiv="2506.13585",
    year=2025,
    innovation="Clips the importance-sampling weight, not the update: sg(clip(r, 1 - eps_low, 1 + eps_high)) "
               "A log pi_theta with r = pi_theta / pi_old and a token-level normaliser (Eqs. 4-5), so every "
               "token keeps a gradient.",
    pain_point="PPO-style clipping drops the gradient of rare high-ratio tokens such as 'However' or 'Wait' after "
               "the first on-policy update, and DAPO's clip-higher was less effective with 16 off-policy update "
               "rounds per generation batch (§3.1).",
    typical_use="Long-response RL with many off-policy updates per batch: MiniMax-M1, 16 update rounds per "
                "generation batch (§3.1) and a generation window grown from 40K to 80K tokens; zero-RL on "
                "Qwen2.5-32B-base matched DAPO in 50% of its steps (Fig. 2). TRL loss_type='cispo' and verl "
                "'cispo', with different eps conventions (anchors.md b.5).",
    users=(("MiniMax-M1 (456B total, 45.9B active parameters)", "arXiv 2506.13585 §3.1 and §5, papers.md §5"),),
    chapter="05_cispo",
    sources="papers.md §5; anchors.md b.5",
)

_VAPO = VariantRecord(
    preset="VAPO",
    paper="VAPO: Efficient and Reliable RL for Advanced Reasoning Tasks (Yue et al., ByteDance)",
    arxiv="2504.05118",
    year=2025,
    innovation="PPO with a value model made reliable for long reasoning: value pre-training, decoupled GAE "
               "(lambda_critic = 1), length-adaptive lambda_policy = 1 - 1/(alpha l) with alpha = 0.05 "
               "(Eqs. 4-5), clip-higher, a token-level loss, a positive-example LM loss with mu = 0.1 "
               "(Eqs. 9-10) and group sampling (§4, §5.1).",
    pain_point="Vanilla PPO scores AIME24 5 (Table 1): a value model initialised from a reward model values early "
               "tokens low, which biases GAE's advantages positive (§4.1), and with lambda = 0.95 a reward 100 "
               "tokens away carries a TD coefficient of about 0.006 (Eqs. 4-5).",
    typical_use="Value-model-based RL for long chain-of-thought: Qwen2.5-32B, 512 prompts x 16 samples, AIME24 "
                "60.4 within 5,000 steps (§5.1-5.2). No anchor library implements it as published "
                "(anchors.md a.1, §5).",
    users=(("the authors, Qwen2.5-32B (AIME24 60.4)", "arXiv 2504.05118 §5.1-5.2 and Table 1, papers.md §6"),),
    chapter="06_vapo",
    sources="papers.md §6; anchors.md a.1, §5",
)

_RPT = VariantRecord(
    preset="RPT",
    paper="Reinforcement Pre-Training (Dong et al., Microsoft)",
    arxiv="2506.08007",
    year=2025,
    innovation="Next-token reasoning: the model reasons before predicting the next token of a text and is "
               "rewarded by a byte-level prefix match with the true continuation (§3.1, Eq. 3), trained with "
               "GRPO on pure expected reward, KL 0, no language-modelling term (Eq. 4).",
    pain_point="RL with verifiable rewards needs annotated question-answer pairs (Eq. 2) and next-token "
               "prediction (Eq. 1) gives no reward for reasoning; RPT's prefix-matching reward (Eq. 3) needs only "
               "the text's own continuation, so any text becomes an RL task (§1, §3.1).",
    typical_use="Reinforcement pre-training on text: R1-Distill-Qwen-14B on OmniMATH positions kept by a proxy "
                "model's entropy, G = 8, temperature 0.8, KL 0 (§3.3, App. B). No anchor library implements it "
                "(anchors.md a.4).",
    users=(("the authors' RPT-14B", "arXiv 2506.08007 §3.3, App. B and Table 1, papers.md §8"),),
    chapter="07_rpt",
    sources="papers.md §8; anchors.md a.4",
)

_GMPO = VariantRecord(
    preset="GMPO",
    paper="Geometric-Mean Policy Optimization (Zhao et al.)",
    arxiv="2507.20673",
    year=2025,
    innovation="Maximises the geometric mean of the token ratios instead of their arithmetic mean, each token's "
               "log-ratio clipped in log space on the side its advantage pushes, range (e^-0.4, e^0.4) "
               "(Eq. 4, Alg. 1).",
    pain_point="GRPO's arithmetic mean of token-level rewards is sensitive to outlier importance-weighted "
               "rewards, which give extreme ratios and unstable updates (abstract).",
    typical_use="A replacement for GRPO's surrogate with group advantages and no KL (the official script's "
                "beta 0); TRL (experimental GMPOTrainer) and verl ('geo_mean') implement it (anchors.md a.2, b.7).",
    users=(("the authors' GMPO-7B: +4.1% over GRPO on maths benchmarks, +1.4% on multimodal reasoning",
            "arXiv 2507.20673 abstract"),),
    chapter=None,
    sources="the paper's abstract; the GMPO preset's comment in grpo_lab/algo/algorithms.py and its surrogate's docstring in "
            "grpo_lab/algo/objectives.py; anchors.md a.2, b.7",
)

_SAPO = VariantRecord(
    preset="SAPO",
    paper="Soft Adaptive Policy Optimization (Gao et al., Qwen)",
    arxiv="2511.20347",
    year=2025,
    innovation="Replaces the hard clip by a smooth gate 4/tau sigmoid(tau (r - 1)) on each token's ratio, with "
               "temperatures tau_pos = 1.0 for positive and tau_neg = 1.05 for negative advantages (§3).",
    pain_point="Token-level importance ratios have high variance, 'exacerbated in Mixture-of-Experts models', "
               "and a hard clip makes it hard to keep both stability and learning (abstract).",
    typical_use="A replacement for the PPO clip with token ratios, group advantages and no KL; TRL, verl and "
                "Liger implement it as a loss type (anchors.md a.2, b.7).",
    users=(("the Qwen3-VL model series", "arXiv 2511.20347 abstract"),),
    chapter=None,
    sources="the paper's abstract; the SAPO preset's comment in grpo_lab/algo/algorithms.py and its surrogate's docstring in "
            "grpo_lab/algo/objectives.py; anchors.md a.2, b.7",
)

_KL_COV = VariantRecord(
    preset="KL_COV",
    paper="The Entropy Mechanism of RL for Reasoning Language Models, KL-Cov (Cui et al.)",
    arxiv="2505.22617",
    year=2025,
    innovation="The unclipped policy gradient plus a penalty kl_cov_coef |log r| on the small share of tokens "
               "(2e-3 for Qwen2.5-7B, 2e-4 for 32B) with the largest covariance between advantage and "
               "log-probability ('Suppressing Tokens with High Covariances').",
    pain_point="Entropy collapse saturates performance (R = -a e^H + b), and entropy change is driven by the "
               "covariance between a token's log-probability and its advantage (abstract).",
    typical_use="verl's 'kl_cov' policy loss (anchors.md a.2) with a token-mean loss and no KL to a reference; "
                "the paper's ratios for Qwen2.5-7B and 32B (preset comment).",
    users=(("the authors, on Qwen2.5-7B and Qwen2.5-32B", "arXiv 2505.22617 abstract"),),
    chapter=None,
    sources="the paper's abstract; the KL_COV preset's comment in grpo_lab/algo/algorithms.py and its surrogate's docstring in "
            "grpo_lab/algo/objectives.py; anchors.md a.2",
)

_CLIP_COV = VariantRecord(
    preset="CLIP_COV",
    paper="The Entropy Mechanism of RL for Reasoning Language Models, Clip-Cov (Cui et al.)",
    arxiv="2505.22617",
    year=2025,
    innovation="PPO's clipped surrogate with the gradient removed from a random share (2e-4) of the tokens whose "
               "covariance between advantage and log-probability lies in (1, 5) ('Suppressing Tokens with High "
               "Covariances').",
    pain_point="Entropy collapse saturates performance (R = -a e^H + b), and entropy change is driven by the "
               "covariance between a token's log-probability and its advantage (abstract).",
    typical_use="verl's 'clip_cov' policy loss (anchors.md a.2); the authors' verl scripts run it in verl's DAPO "
                "recipe with clip_ratio_low = clip_ratio_high = 1, so the selection is the trust region "
                "(preset comment).",
    users=(("the authors, on Qwen2.5-7B and Qwen2.5-32B", "arXiv 2505.22617 abstract"),),
    chapter=None,
    sources="the paper's abstract; the CLIP_COV preset's comment in grpo_lab/algo/algorithms.py and its surrogate's docstring in "
            "grpo_lab/algo/objectives.py; anchors.md a.2",
)

#: The records by preset name, in the book's order (chapters 1-7, then the 2025 variants GMPO, SAPO,
#: KL-Cov and Clip-Cov, which no chapter covers yet). Read-only. Sources of each record are in its
#: ``sources`` field (papers.md sections 1-8, anchors.md, and the presets' comments).
RECORDS: Mapping[str, VariantRecord] = types.MappingProxyType(
    {r.preset: r for r in (_GRPO, _DAPO, _DR_GRPO, _GSPO, _CISPO, _VAPO, _RPT, _GMPO, _SAPO, _KL_COV, _CLIP_COV)})


# ------------------------------------------------------------------------------- the computed axes
def _algorithm(value: Any, what: str) -> Algorithm:
    """``value`` as an Algorithm: itself, or the preset of that name (case-insensitive)."""
    try:
        return algorithms.get_algorithm(value)
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None


def _param_axes(algo: Algorithm) -> dict[str, str]:
    """``{hyper-parameter in algo.params: axis}``: the axis of the function that declares it
    (:data:`REGISTRY_AXES`), else :data:`CLIPPING` (a surrogate's whole-minibatch statistic)."""
    probe = algo
    if algo.kl is not None and not algo.uses_kl:  # functions() lists the KL estimator only when it acts
        try:
            probe = algo.replace(beta=1.0)
        except ValueError:
            probe = algo
    out: dict[str, str] = {}
    for key, fn in probe.functions().items():
        axis = REGISTRY_AXES.get(key.split("[", 1)[0])
        if fn is None or axis is None:
            continue
        for name in probe.values_for(fn):
            if name in algo.params:
                out.setdefault(name, axis)
    return {name: out.get(name, CLIPPING) for name in algo.params}


def axes_changed(algo: Union[Algorithm, str], reference: Union[Algorithm, str] = GRPO) -> dict[str, dict[str, tuple]]:
    """What ``algo`` changes relative to ``reference``, axis by axis, computed from their fields.

    For each axis of :data:`AXIS_FIELDS` (in that order) that has a difference, ``{field: (reference
    value, algo value)}`` of its fields that differ (``!=``); the hyper-parameters of ``params``
    count under the axis of the function that declares them (:data:`REGISTRY_AXES`), with
    :data:`ABSENT` for one that an algorithm does not have. Raw field values are compared, not
    :meth:`~grpo_lab.algo.algorithms.Algorithm.axes`' view: a field that one algorithm does not read
    (``gamma`` without a value model) still counts when it differs. ``name`` is ignored.

    ``axes_changed(DAPO)`` is ``{"clipping": {"eps_high": (0.2, 0.28)}, "aggregation":
    {"aggregation": ("seq_mean_token_mean", "group_token_mean")}, "regulariser": {"kl": ("k3",
    None), "beta": (0.04, 0.0)}, "sampling & shaping": {...}}``; an algorithm against itself gives
    ``{}``. The papers behind each preset are cited in its comment in :mod:`grpo_lab.algo.algorithms`.

    Args:
        algo: an :class:`~grpo_lab.algo.algorithms.Algorithm` or a preset name (``"DAPO"``).
        reference: the same; default :data:`~grpo_lab.algo.algorithms.GRPO`.

    Returns:
        ``{axis: {field or hyper-parameter: (reference value, algo value)}}``, only axes that differ.

    Raises:
        ValueError: ``algo`` or ``reference`` neither an Algorithm nor a preset name.
    """
    algo, reference = _algorithm(algo, "algo"), _algorithm(reference, "reference")
    found: dict[str, dict[str, tuple]] = {axis: {} for axis in AXES}
    for axis, fields in AXIS_FIELDS.items():
        for f in fields:
            before, after = getattr(reference, f), getattr(algo, f)
            if before != after:
                found[axis][f] = (before, after)
    ref_axes, algo_axes = _param_axes(reference), _param_axes(algo)
    for name in [*reference.params, *(k for k in algo.params if k not in reference.params)]:
        before, after = reference.params.get(name, ABSENT), algo.params.get(name, ABSENT)
        if before is ABSENT or after is ABSENT or before != after:
            found[algo_axes.get(name) or ref_axes[name]][name] = (before, after)
    return {axis: diff for axis, diff in found.items() if diff}


def changed_axes(algo: Union[Algorithm, str], reference: Union[Algorithm, str] = GRPO) -> frozenset[str]:
    """The names of the axes on which ``algo`` differs from ``reference``: the keys of
    :func:`axes_changed` (e.g. ``changed_axes(DR_GRPO) == {"advantage", "aggregation",
    "regulariser"}``), computed from the presets, which cite their papers in :mod:`grpo_lab.algo.algorithms`.

    Returns:
        a frozenset of names from :data:`AXES`; empty when the two agree on every field.

    Raises:
        ValueError: as :func:`axes_changed`.
    """
    return frozenset(axes_changed(algo, reference))


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _diff_text(axis: str, diff: Mapping[str, tuple]) -> str:
    """``"eps_low 0.2 -> 1.0, eps_high 0.2 -> 0.28"``; a field that bears the axis' name is not named."""
    parts = []
    for f, (before, after) in diff.items():
        label = "" if f.replace("_", " ") == axis else f"{f} "
        parts.append(f"{label}{_value_text(before)} -> {_value_text(after)}")
    return ", ".join(parts)


def _axis_text(axis: str, diff: Mapping[str, tuple]) -> str:
    """``"clipping: eps_high 0.2 -> 0.28"``."""
    return f"{axis}: {_diff_text(axis, diff)}"


def describe_changes(algo: Union[Algorithm, str], reference: Union[Algorithm, str] = GRPO) -> str:
    """:func:`axes_changed` as one line, axes separated by ``"; "``, e.g. ``describe_changes(DAPO)``:
    ``"clipping: eps_high 0.2 -> 0.28; aggregation: seq_mean_token_mean -> group_token_mean;
    regulariser: kl k3 -> None, beta 0.04 -> 0.0; sampling & shaping: dynamic_sampling False -> True,
    ..."``. Computed from the presets (whose comments in :mod:`grpo_lab.algo.algorithms` cite the papers).

    Returns:
        the line; ``"none"`` when the two algorithms agree on every field.

    Raises:
        ValueError: as :func:`axes_changed`.
    """
    changes = axes_changed(algo, reference)
    return "; ".join(_axis_text(axis, diff) for axis, diff in changes.items()) or "none"


def _axis_names(named: Any) -> frozenset[str]:
    """``named`` (one axis name or an iterable of them, case and spacing free) as names of :data:`AXES`."""
    if isinstance(named, str):
        named = [named]
    if not isinstance(named, Iterable):
        raise ValueError(f"named must be an axis name or a collection of them, got {type(named).__name__}")
    by_key = {" ".join(a.lower().split()): a for a in AXES}
    out = set()
    for n in named:
        if not isinstance(n, str):
            raise ValueError(f"axis names are strings, got {n!r}")
        axis = by_key.get(" ".join(n.lower().split()))
        if axis is None:
            home = next((a for a, fields in AXIS_FIELDS.items() if n in fields), None)
            hint = f" ({n!r} is a field of the axis {home!r})" if home else ""
            raise ValueError(f"unknown axis {n!r}{hint}; the axes are {list(AXES)}")
        out.add(axis)
    return frozenset(out)


def check_axes(algo: Union[Algorithm, str], named: Union[str, Iterable[str]],
               reference: Union[Algorithm, str] = GRPO) -> bool:
    """Check a reader's answer to "which axes does ``algo`` change relative to ``reference``?".

    ``named`` is compared with :func:`changed_axes` (computed from the presets, whose comments in
    :mod:`grpo_lab.algo.algorithms` cite the papers). Axis names are those of :data:`AXES`, in any case.

    Args:
        algo: an :class:`~grpo_lab.algo.algorithms.Algorithm` or a preset name.
        named: one axis name or a collection of them (``{"clipping", "aggregation"}``).
        reference: the algorithm compared against; default :data:`~grpo_lab.algo.algorithms.GRPO`.

    Returns:
        True when ``named`` is exactly the set of changed axes.

    Raises:
        ValueError: the answer is wrong -- the message names each axis missed, with what changes on
            it, and each axis wrongly named, with the value both algorithms share there; or a name
            that is not an axis (the message lists the axes, and says which axis a field name
            belongs to); or as :func:`axes_changed`.
    """
    algo, reference = _algorithm(algo, "algo"), _algorithm(reference, "reference")
    names = _axis_names(named)
    changes = axes_changed(algo, reference)
    missed = [a for a in AXES if a in changes and a not in names]
    wrong = [a for a in AXES if a in names and a not in changes]
    if not missed and not wrong:
        return True
    problems = []
    if missed:
        problems.append(f"missed {_count(missed)}: " + "; ".join(
            f"{a!r} ({_diff_text(a, changes[a])})" for a in missed))
    if wrong:
        problems.append(f"wrongly named {_count(wrong)}, on which both have the same values: " + "; ".join(
            f"{a!r} (" + ", ".join(f"{f} {_value_text(getattr(algo, f))}" for f in AXIS_FIELDS[a]) + ")"
            for a in wrong))
    raise ValueError(f"{algo.name} against {reference.name}: " + ". ".join(problems)
                     + f". The changed axes are {[a for a in AXES if a in changes]}.")


def _count(axes: list) -> str:
    return f"{len(axes)} axis" if len(axes) == 1 else f"{len(axes)} axes"


# ---------------------------------------------------------------------------------------- the table
#: the columns of :func:`records_table`, in order
TABLE_COLUMNS = ("preset", "paper", "arXiv", "year", "innovation", "pain point", "typical use", "users",
                 "chapter", "changes vs GRPO")


def records_table(records: Optional[Mapping[str, VariantRecord]] = None) -> Any:
    """One row per record: what the paper says beside what its preset changes relative to GRPO.

    Columns (:data:`TABLE_COLUMNS`): ``preset``, ``paper``, ``arXiv``, ``year``, ``innovation``,
    ``pain point``, ``typical use``, ``users`` (:meth:`VariantRecord.users_text`: the users with their
    citations, or ``"not stated"``), ``chapter`` (``"not covered"`` when no chapter covers the
    variant) and ``changes vs GRPO`` (:func:`describe_changes` of the preset against
    :data:`~grpo_lab.algo.algorithms.GRPO`, ``"none"`` for GRPO itself). Each record cites its sources
    (papers.md and anchors.md sections, or the preset's comment) in its ``sources`` field.

    Args:
        records: default :data:`RECORDS`.

    Returns:
        a ``pandas.DataFrame`` with one row per record, in the mapping's order, and no empty cell.

    Raises:
        ValueError: ``records`` not a mapping, a value that is not a :class:`VariantRecord`, or a
            record whose ``preset`` is not a preset of :mod:`grpo_lab.algo.algorithms`.
    """
    import pandas as pd

    if records is not None and not isinstance(records, Mapping):
        raise ValueError(f"records must be a mapping of preset name to VariantRecord (like RECORDS), got "
                         f"{type(records).__name__}")
    rows = []
    for rec in (RECORDS if records is None else records).values():
        if not isinstance(rec, VariantRecord):
            raise ValueError(f"records must hold VariantRecord values, got {type(rec).__name__}")
        algo = _algorithm(rec.preset, f"record {rec.preset!r}")
        rows.append((rec.preset, rec.paper, rec.arxiv, rec.year, rec.innovation, rec.pain_point, rec.typical_use,
                     rec.users_text(), rec.chapter or "not covered", describe_changes(algo, GRPO)))
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
