"""grpo_lab.export.sampling against TRL 1.16.0 and verl 0.9.1 themselves (marker ``xcheck``; ``make xcheck``).

Each key the sampling export writes exists in TRL's ``GRPOConfig`` / verl's composed Hydra config with the value
written, and means what grpo_lab.export.sampling says:

* the mismatch weight, float64 reference from the TIS / MIS formulas as TRL's ``_generate_and_score_completions``
  and verl's ``compute_rollout_correction_weights`` document them: w = exp(l_old - l_sampler) per token, or
  exp(sum over the response) per sequence; truncate min(w, C); mask w 1[w <= C]. verl's own function is run on
  each exported threshold; TRL computes the weight inline (not callable), so its source is checked for the
  four modes, and its loss is run with a weight to check it multiplies each token's surrogate before the
  aggregation and the KL;
* verl's bypass mode takes the sampler's log-probs as pi_old (source), the rollout dtype / top-p / top-k keys
  compose.
"""

import dataclasses
import inspect
import math
import typing

import pytest
import torch

from grpo_lab.algo.algorithms import GRPO, Algorithm
from grpo_lab.export import sampling as S
from grpo_lab.export import to_verl, translate

import _xcheck_common as X

pytestmark = [pytest.mark.xcheck, pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning"),
              pytest.mark.filterwarnings("ignore::grpo_lab.export.ApproximateExportWarning")]

trl = pytest.importorskip("trl", reason="xcheck: trl is not installed (pip install '.[xcheck]', see make xcheck)")
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from test_xcheck_trl import trl_loss  # noqa: E402
from test_xcheck_verl import compose  # noqa: E402

from verl.trainer.ppo import rollout_corr_helper as RC  # noqa: E402

GRPO_V = GRPO.replace(adv_eps=1e-6)


def lab(algo, **kw):
    """``algo`` with issue 53's Algorithm fields (as tests/export/test_export_sampling.py's helper)."""
    if all(k in Algorithm.__dataclass_fields__ for k in ("mismatch", "keep_sampling_mask")):
        cap = kw.pop("is_cap", None)
        return algo.replace(**kw, **({"params": {**algo.params, "is_cap": cap}} if cap is not None else {}))
    F = dataclasses.field
    sub = dataclasses.make_dataclass("Algorithm53", [("mismatch", typing.Optional[str], F(default=None)),
                                                     ("keep_sampling_mask", bool, F(default=False)),
                                                     ("is_cap", float, F(default=2.0))],
                                     bases=(Algorithm,), frozen=True)
    return sub(**{f.name: getattr(algo, f.name) for f in dataclasses.fields(algo)}, **kw)


def reference_weight(old: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, mode: str, cap: float):
    """The mismatch weight [B, T] in float64 (module docstring); padding 0."""
    level, kind = mode.split("_")
    diff = (old - sampler) * mask
    w = torch.exp(diff.sum(-1, keepdim=True)).expand_as(diff) if level == "sequence" else torch.exp(diff)
    w = w.clamp(max=cap) if kind == "truncate" else torch.where(w <= cap, w, torch.zeros_like(w))
    return w * mask


def _batch():
    """Old and sampler log-probs whose differences put weights on both sides of C = 2, within verl's +-20."""
    b = X.batch(3)
    g = torch.Generator().manual_seed(7)
    sampler = b["old"] + 0.6 * torch.randn(b["old"].shape, generator=g, dtype=torch.float64)
    sampler[0, 0] = b["old"][0, 0] + 15.0  # one tiny weight, e^-15
    return b["old"], sampler, b["mask"]


# --- TRL -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", S.MISMATCH_MODES)
def test_trl_accepts_each_exported_mismatch_setting(mode, tmp_path):
    kw = translate(lab(GRPO, mismatch=mode, is_cap=3.0), "trl", strict=False, top_p=0.9, top_k=20).config
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, **kw)
    assert (args.use_vllm, args.vllm_importance_sampling_correction, args.vllm_importance_sampling_mode) == \
        (True, True, mode)
    assert (args.vllm_importance_sampling_clip_max, args.vllm_importance_sampling_clip_min) == (3.0, None)
    assert (args.top_p, args.top_k) == (0.9, 20)


def test_trls_weight_computation_has_the_four_modes_as_cited():
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for line in ('self.vllm_importance_sampling_mode in ["sequence_mask", "sequence_truncate"]',
                 "per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask",
                 "per_token_logps_diff.sum(dim=-1, keepdim=True)",
                 "vllm_importance_sampling_ratio = torch.exp(logps_diff)",
                 'self.vllm_importance_sampling_mode in ["sequence_truncate", "token_truncate"]',
                 "min=self.vllm_importance_sampling_clip_min",
                 "max=self.vllm_importance_sampling_clip_max",
                 "invalid_mis_mask, value=0.0"):
        assert line in src, line
    # pi_old is recomputed whenever the correction is on (never the sampler's log-probs)
    assert "self.use_vllm and self.vllm_importance_sampling_correction" in src


@pytest.mark.parametrize("mode", S.MISMATCH_MODES)
def test_trls_loss_multiplies_each_tokens_surrogate_by_the_weight(mode, tmp_path):
    old, sampler, mask = _batch()
    b = X.batch(3)
    w = reference_weight(old, sampler, mask, mode, 2.0)
    adv = X.advantages(GRPO, b["rewards"])
    kw = translate(lab(GRPO, mismatch=mode), "trl", strict=False).config
    loss, _ = _trl_loss_with_weight(kw, b, adv, w, tmp_path)
    # float64 reference: loss_t = -min(r A, clip(r) A) w_t + beta k3_t, mean over each response, mean over responses
    r = torch.exp(b["logp"] - b["old"])
    a = adv[:, None]
    surrogate = -torch.minimum(r * a, r.clamp(1 - GRPO.eps_low, 1 + GRPO.eps_high) * a) * w
    k3 = torch.exp(b["ref"] - b["logp"]) - (b["ref"] - b["logp"]) - 1
    per_token = (surrogate + GRPO.beta * k3) * mask
    want = (per_token.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    assert abs(float(loss) - float(want)) < X.TOL


def _trl_loss_with_weight(kw: dict, b: dict, adv: torch.Tensor, w: torch.Tensor, tmp_path):
    """The harness's ``trl_loss`` with the correction on and ``importance_sampling_ratio`` = ``w`` in the inputs
    (what ``_generate_and_score_completions`` hands ``_compute_loss``)."""
    from trl.trainer import grpo_trainer as GT

    calls = {}
    real = GT.GRPOTrainer._compute_loss

    def with_weight(self, model, inputs):
        calls["seen"] = True
        return real(self, model, {**inputs, "importance_sampling_ratio": w})

    GT.GRPOTrainer._compute_loss = with_weight
    try:
        out = trl_loss(kw, b, adv, tmp_path)
    finally:
        GT.GRPOTrainer._compute_loss = real
    assert calls
    return out


# --- verl ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", S.MISMATCH_MODES)
def test_verls_own_weights_equal_the_cited_formula(mode):
    ov = to_verl(lab(GRPO_V, mismatch=mode, is_cap=2.0), **X.BUDGET)
    _, algo_cfg, cfg = compose(ov)
    rc = cfg.algorithm.rollout_correction
    level = mode.split("_")[0]
    assert (rc.rollout_is, rc.bypass_mode, rc.rollout_rs, rc.rollout_is_batch_normalize) == (level, False, None, False)
    assert isinstance(rc.rollout_is_threshold, float if mode.endswith("truncate") else str)
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    assert cfg.actor_rollout_ref.rollout.logprobs_mode == "processed_logprobs"
    old, sampler, mask = _batch()
    got, _ = RC.compute_rollout_correction_weights(old - sampler, mask, rollout_is=rc.rollout_is,
                                                   rollout_is_threshold=rc.rollout_is_threshold,
                                                   rollout_is_batch_normalize=rc.rollout_is_batch_normalize)
    want = reference_weight(old, sampler, mask, mode, 2.0)
    assert float((got - want).abs().max()) < X.TOL, (got, want)
    assert float(want.min()) < 1 < 2 < float(((old - sampler) * mask).exp().max())  # both sides of C exercised


def test_verls_sampler_keys_compose():
    _, _, cfg = compose(to_verl(GRPO_V, rollout_dtype="float16", top_p=0.9, top_k=20, **X.BUDGET))
    r = cfg.actor_rollout_ref.rollout
    assert (r.dtype, r.top_p, r.top_k) == ("float16", 0.9, 20)
    assert cfg.algorithm.rollout_correction.rollout_is is None


def test_verls_bypass_mode_takes_pi_old_from_the_sampler():
    _, _, cfg = compose(to_verl(GRPO_V, old_logp="behaviour", rollout_dtype="bfloat16", **X.BUDGET))
    rc = cfg.algorithm.rollout_correction
    assert (rc.bypass_mode, rc.loss_type, rc.rollout_is) == (True, "ppo_clip", None)
    src = inspect.getsource(RC.apply_bypass_mode)
    assert 'batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]' in src
    assert 'policy_loss_config["loss_mode"] = "bypass_mode"' in src
    from verl.trainer.ppo import core_algos

    bypass = inspect.getsource(core_algos.compute_policy_loss_bypass_mode)
    assert "compute_policy_loss_vanilla(" in bypass and "rollout_is_weights=None" in bypass


def test_the_mask_floor_never_binds_in_verl():
    assert S.VERL_MASK_FLOOR < math.exp(-RC.SAFETY_BOUND)
