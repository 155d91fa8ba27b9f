"""Shared by tests/export/xcheck/test_xcheck_trl.py and tests/export/xcheck/test_xcheck_verl.py: one small float64 batch, the
algorithms to check, and grpo_lab's side of each comparison.

The batch: 3 groups of G = 4 responses, padded to T = 8 tokens (the generation budget is 10, so a
constant normaliser that silently became the padded width would show), with

* ragged masks and one fully masked row (row 9: what Overlong Filtering leaves);
* an all-equal-reward group (group 1) next to mixed ones, and a fractional reward;
* tokens left untouched (log-ratio ~1e-5, inside GSPO's 3e-4 range), moderately and far off-policy
  (token ratios below 0.8 and above 1.28, so both sides of every clip act), one negative-advantage
  row with ratios above 3 (where verl's default dual clip would act), and rows whose mean
  ``log(pi_old / pi_theta)`` exceeds V3.2's delta = 0.05 with negative advantages (masked) and with
  positive ones (kept);
* reference log-probs within 0.5 nats of the policy's (k3 far below verl's clamp at 10).

``tests/export/xcheck/test_xcheck_*.py::test_the_batch_covers_every_case`` checks those claims with grpo_lab's own
metrics.
"""

from __future__ import annotations

import os
import warnings

import torch

from grpo_lab import export as E
from grpo_lab.algo.advantages import VALUE_BASELINE_ESTIMATORS
from grpo_lab.algo.algorithms import PRESETS, deepseek_v32
from grpo_lab.algo.objectives import loss_inputs, policy_loss

#: set by ``make xcheck``, which installs the pinned TRL / verl: a missing or other version then FAILS the
#: equivalence tests (a skip there would hide a broken check); a plain ``pytest tests`` skips them
STRICT_ENV = "GRPO_LAB_XCHECK"


def unavailable(why: str) -> None:
    """Skip the calling test module because ``why`` (the library is missing, another version, ...), or fail it
    when :data:`STRICT_ENV` is ``1`` (``make xcheck``)."""
    import pytest

    if os.environ.get(STRICT_ENV) == "1":
        pytest.fail(f"xcheck ({STRICT_ENV}=1): {why}", pytrace=False)
    pytest.skip(f"xcheck: {why}", allow_module_level=True)


def require_version(name: str, installed: str, pinned: str) -> None:
    """:func:`unavailable` unless ``installed`` is the ``pinned`` release that grpo_lab.export was verified against."""
    if installed != pinned:
        unavailable(f"the {name} mapping was read from {name} {pinned}, installed {installed} (make xcheck installs "
                    "requirements/xcheck.txt)")


G, T, MAX_NEW_TOKENS = 4, 8, 10
LENGTHS = [8, 5, 3, 7, 6, 8, 2, 4, 8, 0, 5, 1]
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.0]
B = len(LENGTHS)
#: per row: (scale of the per-token noise of log pi_theta - log pi_old, mean shift of that difference)
ROW_DRIFT = [(1e-5, 0.0), (0.15, -0.3), (0.2, 1.3), (0.5, 0.0),
             (1e-5, 0.0), (0.3, 0.1), (0.2, -0.2), (1e-5, 0.0),
             (0.4, -0.4), (0.1, 0.0), (0.15, -0.1), (0.3, 0.2)]
TOL = 1e-10

V32 = deepseek_v32(beta=0.04, delta=0.05, eps=0.2)
#: every preset that the export can express, and DeepSeek-V3.2 with values of our choosing (the paper reports
#: none). PPO and VAPO need a value model, which neither target is configured for: grpo_lab.export refuses
#: them (tests/export/test_export.py::test_value_model_algorithms_are_refused_with_the_reason)
#: The mismatch presets (TIS, MIS) are left out: their weight is a function of the sampler's log-probs, which this
#: loss-only batch does not hold; tests/export/test_export_sampling.py checks their mapping and read-back and
#: tests/export/xcheck/test_xcheck_sampling.py both libraries' weights.
ALGORITHMS = {**{name: algo for name, algo in PRESETS.items()
                 if algo.advantage not in VALUE_BASELINE_ESTIMATORS and algo.nll_coef == 0 and algo.mismatch is None},
              "DeepSeek-V3.2": V32}
#: the budget every export of the xcheck tests uses: one minibatch of the whole batch, one device
BUDGET = dict(group_size=G, prompts_per_step=B // G, max_new_tokens=MAX_NEW_TOKENS)


def exportable(target: str) -> dict:
    """The :data:`ALGORITHMS` that ``target`` can express (their ``strict=False`` export does not raise);
    the others are refused with the reason, which tests/export/test_export.py checks (TRL has no GMPO, KL-Cov or
    Clip-Cov). Derived from the registry: a new preset is cross-checked as soon as the export maps it."""
    out = {}
    for name, algo in ALGORITHMS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", E.ApproximateExportWarning)
                E.translate(algo, target, strict=False, **BUDGET)
        except E.ExportError:
            continue
        out[name] = algo
    return out


def batch(seed: int = 0) -> dict:
    """The float64 batch described in the module docstring (``logp`` is not a leaf: clone it)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.float64)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1.0
    old = -(0.05 + 2.45 * torch.rand(B, T, generator=g, dtype=torch.float64))
    old[2] = -(2.0 + torch.rand(T, generator=g, dtype=torch.float64))  # room for ratios above 3
    noise = torch.randn(B, T, generator=g, dtype=torch.float64)
    scale = torch.tensor([s for s, _ in ROW_DRIFT], dtype=torch.float64)[:, None]
    shift = torch.tensor([d for _, d in ROW_DRIFT], dtype=torch.float64)[:, None]
    logp = (old + shift + scale * noise).clamp(max=-1e-3)
    ref = (logp + 0.25 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    # a sampler that is not pi_old: log(pi_old / pi_sampler) in [-0.3, 0.9], on both sides of log 2
    behaviour = (old + 0.3 - 1.2 * torch.rand(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    return {"logp": logp, "old": old, "ref": ref, "mask": mask, "behaviour": behaviour,
            "rewards": torch.tensor(REWARDS, dtype=torch.float64)}


def exact_alternative(algo, target: str):
    """``(translation of algo with strict=False, the algorithm the exported settings compute exactly,
    its strict export)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", E.ApproximateExportWarning)
        tr = E.translate(algo, target, strict=False, **BUDGET)
    alt = tr.computes
    assert alt is not None, tr.warnings
    return tr, alt, E.translate(alt, target, **BUDGET)  # strict: raises unless exact


def advantages(algo, rewards) -> torch.Tensor:
    """grpo_lab's advantages ([B] float32 by contract) as float64: fed to both sides of a loss check."""
    return algo.advantages(rewards, G).to(torch.float64)


def lab_loss(algo, b: dict, adv: torch.Tensor, *, num_sequences=None):
    """grpo_lab's ``policy_loss`` and its gradient w.r.t. ``logp``: ``(loss, grad, metrics)``."""
    logp = b["logp"].clone().requires_grad_()
    torch.manual_seed(0)  # Clip-Cov's draw: the same global-generator state as the target's loss call
    inputs = {"behaviour_logp": b["behaviour"]} if "behaviour_logp" in loss_inputs(algo) else None
    out = policy_loss(logp, b["old"], adv, b["mask"], algo, ref_logp=b["ref"], max_tokens=MAX_NEW_TOKENS,
                      group_size=G, num_sequences=num_sequences, inputs=inputs)
    out.loss.backward()
    return out.loss.detach(), logp.grad, out.metrics


def report(target: str, name: str, dloss: float, dgrad: float, extra: str = "") -> None:
    """One line of the max |dloss| / |dgrad| table (run pytest with -s to see them)."""
    print(f"\nXCHECK {target:<5s} {name:<14s} |dloss|={dloss:.1e} |dgrad|={dgrad:.1e} {extra}")
