"""grpo_lab.export.sampling: old_logp, rollout_dtype, top-p / top-k, the mismatch correction (TIS / MIS) and Keep
Sampling Mask in TRL 1.16.0's and verl 0.9.1's own settings, or refused / inexact (issue 53; no trl / verl needed).

The expected settings were written by hand from TRL's ``grpo_config.py`` / ``grpo_trainer.py`` (the
``vllm_importance_sampling_*`` fields and their use in ``_generate_and_score_completions``) and verl's
``rollout_correction.yaml`` / ``rollout_corr_helper.py`` / ``ray_trainer.py`` (decoupled and bypass modes); that the
keys exist with these meanings in the installed libraries is tests/export/xcheck/test_xcheck_sampling.py.
"""

import dataclasses
import typing
import warnings

import pytest

from grpo_lab import export as E
from grpo_lab.algo.algorithms import GMPO, GRPO, GSPO
from grpo_lab.export import ApproximateExportWarning, ExportError, to_trl, to_verl, translate
from grpo_lab.export import lint as L
from grpo_lab.export import sampling as S
from grpo_lab.export.lint_io import parse_override
from grpo_lab.export.translation import _hydra_value
from grpo_lab.training.config import TrainerConfig

MODES = S.MISMATCH_MODES
C = "algorithm.rollout_correction."
R = "actor_rollout_ref.rollout."
GRPO_V = GRPO.replace(adv_eps=1e-6)  # GRPO with verl's epsilon: exact in verl


def lab(algo, **kw):
    """``algo`` with issue 53's settings (``mismatch``, ``keep_sampling_mask``, the cap ``is_cap``)."""
    return algo.replace(**kw)


def quiet_translate(algo, target, **budget):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ApproximateExportWarning)
        return translate(algo, target, strict=False, **budget)


def overrides(lines) -> dict:
    return dict(parse_override(line) for line in lines)


# --- the budget ------------------------------------------------------------------------------------------------
def test_budget_from_config_carries_the_sampling_side():
    b = E.budget_from_config(TrainerConfig(old_logp="behaviour", rollout_dtype="bfloat16"))
    assert (b["old_logp"], b["rollout_dtype"], b["top_p"], b["top_k"]) == ("behaviour", "bfloat16", 1.0, 0)
    assert set(S.SAMPLING_KEYS) <= set(E.BUDGET_KEYS)


@pytest.mark.parametrize("key,value,words", [
    ("old_logp", "sampler", "old_logp"), ("rollout_dtype", "int8", "rollout_dtype"), ("top_p", 0.0, "top_p"),
    ("top_p", 1.5, "top_p"), ("top_k", -1, "top_k"), ("top_k", 2.5, "top_k")])
def test_a_bad_sampling_budget_is_named(key, value, words):
    with pytest.raises(ValueError, match=words):
        to_trl(GRPO, **{key: value})


# --- the issue's case: a GRPO run against a bfloat16 sampler with pi_old = the sampler's --------------------------
def test_grpo_with_behaviour_logp_and_a_bfloat16_sampler_is_not_exact_in_trl():
    budget = E.budget_from_config(TrainerConfig(old_logp="behaviour", rollout_dtype="bfloat16"))
    with pytest.raises(ExportError) as err:
        to_trl(GRPO, **budget)
    assert "old_logp" in str(err.value) and "rollout_dtype" in str(err.value)
    tr = quiet_translate(GRPO, "trl", **budget)
    assert not tr.exact and {i.axis for i in tr.issues} == {"old_logp", "rollout_dtype"}
    assert next(i for i in tr.issues if i.axis == "old_logp").budget_fix == {"old_logp": "recompute"}
    with pytest.warns(ApproximateExportWarning, match="old_logp='behaviour'"):
        translate(GRPO, "trl", strict=False, **budget)


def test_the_same_run_in_verl_takes_pi_old_from_the_sampler_with_bypass_mode():
    ov = overrides(to_verl(GRPO_V, old_logp="behaviour", rollout_dtype="bfloat16"))
    assert ov[C + "bypass_mode"] is True and ov[C + "loss_type"] == "ppo_clip" and ov[C + "rollout_is"] is None
    assert ov[R + "dtype"] == "bfloat16" and ov[R + "calculate_log_probs"] is True
    assert ov[R + "logprobs_mode"] == "processed_logprobs" and ov[C + "rollout_rs"] is None


def test_verls_bypass_mode_replaces_gspo_by_the_ppo_clip():
    with pytest.raises(ExportError, match="bypass mode replaces policy_loss.loss_mode=gspo"):
        to_verl(GSPO.replace(adv_eps=1e-6), old_logp="behaviour", rollout_dtype="bfloat16")


@pytest.mark.parametrize("target", ["trl", "verl"])
def test_behaviour_logp_of_a_float32_untruncated_sampler_is_the_policys(target):
    algo = GRPO if target == "trl" else GRPO_V
    tr = translate(algo, target, old_logp="behaviour")
    assert tr.exact and any("equal up to rounding" in n for n in tr.notes)
    assert (C + "bypass_mode=True") not in tr.config


# --- the sampler's settings ------------------------------------------------------------------------------------
def test_top_p_and_top_k_map_to_both_libraries():
    kw = to_trl(GRPO, top_p=0.9, top_k=20)
    assert (kw["top_p"], kw["top_k"]) == (0.9, 20)
    ov = overrides(to_verl(GRPO_V, top_p=0.9, top_k=20))
    assert (ov[R + "top_p"], ov[R + "top_k"]) == (0.9, 20)
    assert overrides(to_verl(GRPO_V))[R + "top_k"] == -1  # verl's "off" is -1, grpo_lab's and TRL's 0


def test_verl_samples_in_the_runs_precision_not_its_default_bfloat16():
    assert overrides(to_verl(GRPO_V))[R + "dtype"] == "float32"
    assert overrides(to_verl(GRPO_V, rollout_dtype="float16"))[R + "dtype"] == "float16"


def test_trl_has_no_sampler_precision():
    with pytest.raises(ExportError, match="no sampler precision"):
        to_trl(GRPO, rollout_dtype="bfloat16")
    tr = quiet_translate(GRPO, "trl", rollout_dtype="bfloat16")
    assert [i.budget_fix for i in tr.issues] == [{"rollout_dtype": "float32"}]


# --- the mismatch correction (TIS / MIS) -----------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_each_mismatch_mode_maps_to_trls_vllm_correction(mode):
    tr = quiet_translate(lab(GRPO, mismatch=mode, is_cap=3.0), "trl")
    want = {"use_vllm": True, "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": mode,
            "vllm_importance_sampling_clip_max": 3.0, "vllm_importance_sampling_clip_min": None}
    assert {k: tr.config[k] for k in want} == want
    # TRL corrects vLLM's samples only, and GRPOConfig cannot say vLLM's dtype: inexact, never exact
    assert [i.axis for i in tr.issues] == ["rollout_dtype"]


@pytest.mark.parametrize("mode,level,threshold", [
    ("token_truncate", "token", 3.0), ("sequence_truncate", "sequence", 3.0),
    ("token_mask", "token", "0.000000001_3.0"), ("sequence_mask", "sequence", "0.000000001_3.0")])
def test_each_mismatch_mode_maps_to_verls_rollout_correction(mode, level, threshold):
    tr = translate(lab(GRPO_V, mismatch=mode, is_cap=3.0), "verl")
    ov = overrides(tr.config)
    assert tr.exact
    assert (ov[C + "rollout_is"], ov[C + "rollout_is_threshold"], ov[C + "bypass_mode"]) == (level, threshold, False)
    assert ov[C + "rollout_rs"] is None and ov[C + "rollout_is_batch_normalize"] is False
    assert ov[R + "calculate_log_probs"] is True and ov[R + "logprobs_mode"] == "processed_logprobs"


def test_the_mask_floor_is_below_every_weight_verl_forms():
    import math

    assert 0 < S.VERL_MASK_FLOOR < math.exp(-20)  # verl clamps log w to +-20 before exp


def test_the_default_cap_is_two():
    ov = overrides(to_verl(lab(GRPO_V, mismatch="token_truncate")))
    assert ov[C + "rollout_is_threshold"] == S.IS_CAP_DEFAULT == 2.0


def test_a_mismatch_with_behaviour_logp_is_impossible():
    with pytest.raises(ExportError, match="needs old_logp='recompute'"):
        translate(lab(GRPO_V, mismatch="token_truncate"), "verl", strict=False, old_logp="behaviour")


def test_verls_geo_mean_averages_the_weights():
    tr = quiet_translate(lab(GMPO, mismatch="token_truncate"), "verl")
    assert [i.axis for i in tr.issues if i.axis == "mismatch"] == ["mismatch"]


def test_an_unmapped_mismatch_name_is_refused():
    from grpo_lab.algo import objectives as obj

    obj.MISMATCH_CORRECTIONS["icepop"] = obj.token_mask  # a correction registered from outside, not mapped
    try:
        with pytest.raises(ExportError, match="mismatch='icepop' is not mapped"):
            translate(lab(GRPO_V, mismatch="icepop"), "verl", strict=False)
    finally:
        del obj.MISMATCH_CORRECTIONS["icepop"]


# --- Keep Sampling Mask ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["trl", "verl"])
def test_keep_sampling_mask_is_lost_under_truncation(target):
    algo = lab(GRPO if target == "trl" else GRPO_V, keep_sampling_mask=True)
    with pytest.raises(ExportError, match="no Keep Sampling"):
        translate(algo, target, top_p=0.9)
    tr = quiet_translate(algo, target, top_k=20)
    assert [(i.axis, i.kind, i.fix) for i in tr.issues] == [("keep_sampling_mask", "lost",
                                                              {"keep_sampling_mask": False})]


def test_keep_sampling_mask_without_truncation_changes_nothing():
    tr = translate(lab(GRPO_V, keep_sampling_mask=True), "verl")
    assert tr.exact and any("changes nothing" in n for n in tr.notes)


# --- the refusal of an outside function --------------------------------------------------------------------------
def test_an_outside_function_is_refused_without_saying_the_libraries_lack_tis():
    from grpo_lab.algo import objectives as obj

    def tis_surrogate(ctx, *, eps_low: float = 0.2, eps_high: float = 0.2):  # a stand-in from outside grpo_lab
        return obj.ppo_surrogate(ctx, eps_low=eps_low, eps_high=eps_high)

    tis_surrogate.__module__ = "my_variants"
    obj.SURROGATES["tis_outside"] = tis_surrogate
    try:
        algo = GRPO.replace(surrogate="tis_outside")
        for target in ("trl", "verl"):
            with pytest.raises(ExportError) as err:
                translate(algo, target, strict=False)
            text = str(err.value)
            assert "no counterpart" not in text and "Algorithm.mismatch" in text
            assert "vllm_importance_sampling_*" in text and "algorithm.rollout_correction.*" in text
    finally:
        del obj.SURROGATES["tis_outside"]


# --- Hydra ------------------------------------------------------------------------------------------------------
def test_an_icepop_threshold_is_quoted_for_hydra():
    assert _hydra_value("0.000000001_2.0") == "'0.000000001_2.0'"
    assert parse_override("k='0.000000001_2.0'") == ("k", "0.000000001_2.0")
    assert _hydra_value("seq-mean-token-mean") == "seq-mean-token-mean"


# --- the linter reads them back -----------------------------------------------------------------------------------
def _reads_mismatch(r, mode, cap):
    return r.algorithm.mismatch == mode and r.algorithm.params.get("is_cap", 2.0) == cap


@pytest.mark.parametrize("mode", MODES)
def test_trls_correction_reads_back_as_the_mismatch(mode):
    r = L.from_trl(quiet_translate(lab(GRPO, mismatch=mode, is_cap=3.0), "trl").config)
    assert _reads_mismatch(r, mode, 3.0), r.inexact


@pytest.mark.parametrize("mode", MODES)
def test_verls_correction_reads_back_as_the_mismatch(mode):
    r = L.from_verl(to_verl(lab(GRPO_V, mismatch=mode, is_cap=3.0)))
    assert _reads_mismatch(r, mode, 3.0), r.inexact


def test_trls_correction_acts_with_vllm_only():
    r = L.from_trl({"loss_type": "grpo", "beta": 0.0, "vllm_importance_sampling_correction": True})
    assert r.exact and not any("mismatch" in i for i in r.inexact)


def test_trls_lower_bound_is_inexact():
    r = L.from_trl({"use_vllm": True, "vllm_importance_sampling_mode": "token_mask",
                    "vllm_importance_sampling_clip_min": 0.5})
    assert not r.exact and any("clip_min = 0.5" in i for i in r.inexact)


def test_verls_bypass_mode_reads_back_as_behaviour_logp():
    r = L.from_verl(to_verl(GRPO_V, old_logp="behaviour", rollout_dtype="bfloat16", top_p=0.9, group_size=4))
    assert r.exact, r.inexact
    assert any("old_logp='behaviour'" in n for n in r.notes)


@pytest.mark.parametrize("extra,words", [
    ([C + "rollout_rs=token_k1", C + "rollout_rs_threshold=2.0"], "rejection sampling"),
    ([C + "rollout_is=token", C + "rollout_is_batch_normalize=True"], "batch_normalize"),
    ([C + "rollout_is=token", C + "rollout_is_threshold='0.5_2.0'"], "below 0.5"),
    ([C + "bypass_mode=True", C + "loss_type=reinforce"], "REINFORCE")])
def test_verl_corrections_grpo_lab_lacks_are_inexact(extra, words):
    r = L.from_verl(to_verl(GRPO_V) + extra)
    assert not r.exact and any(words in i for i in r.inexact), r.inexact


# --- the job writers take the run's sampling side from its TrainerConfig ----------------------------------------
def test_a_trl_job_of_such_a_run_is_refused(tmp_path):
    cfg = TrainerConfig(old_logp="behaviour", rollout_dtype="bfloat16")
    with pytest.raises(ExportError, match="old_logp='behaviour'"):
        E.trl_job(GRPO, "arithmetic", "arithmetic-base", tmp_path / "job", config=cfg, steps=1)
    assert not (tmp_path / "job").exists()


def test_a_verl_job_samples_as_the_run_did(tmp_path):
    cfg = TrainerConfig(old_logp="behaviour", rollout_dtype="bfloat16", group_size=4)
    out = E.verl_job(GRPO_V, "arithmetic", "arithmetic-base", tmp_path / "job", config=cfg, steps=1)
    lines = (out / "overrides.txt").read_text().split()
    assert R + "dtype=bfloat16" in lines and C + "bypass_mode=True" in lines
