"""grpo_lab.export.lint: TRL / verl configs read back as grpo_lab Algorithms (no TRL or verl needed).

The library-side checks (the recorded defaults equal the installed libraries', each reading's loss equals
TRL's and verl's own loss code) are in tests/export/xcheck/test_xcheck_lint.py (``make xcheck``).
"""

import warnings
from pathlib import Path

import pytest
import torch

from grpo_lab.cli import main as cli
from grpo_lab import export as E
from grpo_lab.algo.algorithms import GSPO, VAPO
from grpo_lab.export import lint as L

import _xcheck_common as X

DATA = Path(__file__).parents[1] / "data" / "lint"
#: the loss-relevant Algorithm fields (a reading must equal the export's ``computes`` in them)
LOSS_FIELDS = ("advantage", "ratio_level", "surrogate", "eps_low", "eps_high", "aggregation", "max_tokens", "kl", "beta",
               "kl_importance_correction", "offpolicy_mask_delta", "dynamic_sampling", "overlong_filter",
               "mask_eps_low", "mask_eps_high", "nll_coef", "ntp_coef")


def _read(target: str, config):
    return (L.from_trl if target == "trl" else L.from_verl)(config)


def _export(algo, target: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", E.ApproximateExportWarning)
        return E.translate(algo, target, strict=False, **X.BUDGET)


def _loss_fields(algo) -> dict:
    """The loss fields; GSPO-token reads as GSPO (the export maps both to one setting: equal with one advantage
    per response) and ``max_tokens=None`` as the budget (what the trainer passes)."""
    out = {f: getattr(algo, f) for f in LOSS_FIELDS}
    out["ratio_level"] = {"sequence_token": "sequence"}.get(out["ratio_level"], out["ratio_level"])
    out["max_tokens"] = out["max_tokens"] or X.MAX_NEW_TOKENS
    if algo.advantage in ("group", "batch"):
        out["adv_eps"] = algo.adv_eps
    return out


@pytest.mark.parametrize("target,name", [(t, n) for t in ("trl", "verl") for n in X.exportable(t)])
def test_round_trip_computes_the_exported_loss(target, name):
    """from_X(to_X(p, strict=False)).algorithm computes what the export computes (p itself when exact): the same
    loss fields, advantages, loss and gradient on a float64 batch; exactly, without a departure."""
    algo = X.ALGORITHMS[name]
    tr = _export(algo, target)
    r = _read(target, tr.config)
    assert r.exact, r.inexact
    want = tr.computes
    assert _loss_fields(r.algorithm) == _loss_fields(want)
    assert dict(r.algorithm.params) == dict(want.params)
    b = X.batch()
    adv = X.advantages(want, b["rewards"])
    assert torch.equal(X.advantages(r.algorithm, b["rewards"]), adv)
    loss_r, grad_r, _ = X.lab_loss(r.algorithm, b, adv)
    loss_w, grad_w, _ = X.lab_loss(want, b, adv)
    assert float((loss_r - loss_w).abs()) <= X.TOL and float((grad_r - grad_w).abs().max()) <= X.TOL
    if tr.exact:
        assert _loss_fields(r.algorithm) == _loss_fields(algo)


@pytest.mark.parametrize("target,name,paper", [("trl", "GRPO", "GRPO"), ("trl", "SAPO", "SAPO"),
                                               ("verl", "CISPO", "CISPO"), ("verl", "GMPO", "GMPO"),
                                               ("verl", "DR_GRPO", "DR_GRPO"), ("verl", "KL_COV", "KL_COV")])
def test_an_exact_export_reads_as_its_own_paper(target, name, paper):
    r = _read(target, _export(X.ALGORITHMS[name], target).config)
    assert r.preset == paper, r.summary


def test_trl_default_config_reads_as_grpo_with_a_token_mean_and_no_kl():
    r = L.check_config(DATA / "trl_default.yaml")
    assert r.library == "trl" and r.exact and r.preset == "GRPO"
    a = r.algorithm
    assert (a.aggregation, a.kl, a.beta, a.advantage, a.adv_eps, a.eps_low, a.eps_high) == \
        ("token_mean", None, 0.0, "group", 1e-4, 0.2, 0.2)
    assert r.departures == ("token mean over the whole batch instead of Eq. 3's per-sequence token mean",
                            "no KL term instead of k3 KL with beta = 0.04")
    assert r.named == ("DAPO", "loss_type='dapo'") and r.named_departures == 5
    text = r.report()
    assert "use_bias_correction_kl=True (TRL's default; DeepSeek-V3.2 Eq. 7) has no effect" in text
    assert "lr_scheduler_type = 'linear'" in text and "bf16 = True (TRL's default)" in text


def test_trl_default_kl_is_deepseek_v32_eq7():
    """TRL's use_bias_correction_kl=True default: with beta > 0 the KL is V3.2's importance-corrected one."""
    r = L.from_trl({"beta": 0.04, "loss_type": "grpo"})
    assert r.algorithm.kl == "k3" and r.algorithm.kl_importance_correction
    assert any("V3.2" in n for n in r.notes)
    assert "the importance-corrected KL (V3.2 Eq. 7) instead of the plain KL estimate" in r.departures
    assert not L.from_trl({"beta": 0.04, "use_bias_correction_kl": False}).algorithm.kl_importance_correction


def test_verl_default_grpo_has_the_dual_clip():
    r = L.check_config(DATA / "verl_default_grpo.yaml")
    assert r.library == "verl" and not r.exact and r.preset == "GRPO"
    a = r.algorithm
    assert (a.advantage, a.adv_eps, a.aggregation, a.kl, a.surrogate) == ("group", 1e-6, "token_mean", None, "ppo")
    assert len(r.inexact) == 2 and r.inexact[0].startswith("dual clip c = 3: ")
    assert r.inexact[1].startswith("rollout.n = 1: a group of one response has no baseline")
    assert "[nearest: not exact" in r.report()
    assert "kl_loss_type = 'low_var_kl' would be k3 clamped to [-10, 10]" in r.report()
    off = L.from_verl(["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.clip_ratio_c=1e10",
                       "actor_rollout_ref.rollout.n=8"])
    assert off.exact and off.algorithm == a


def test_verl_default_is_ppo_with_a_critic():
    r = L.from_verl({})
    assert r.algorithm.advantage == "gae" and not r.exact and r.preset == "PPO"
    # verl 0.9.1's recorded defaults (library_defaults.VERL_DEFAULTS, checked by xcheck): gamma = lam = 1,
    # critic.cliprange_value = 0.5, critic.optim.lr = 1e-5, trainer.critic_warmup = 0
    a = r.algorithm
    assert (a.gamma, a.lam, a.value_clip_eps) == (1.0, 1.0, 0.5)
    assert (r.settings["value_lr"], r.settings["value_warmup_steps"]) == (1e-5, 0)
    assert any(i.startswith("verl whitens the GAE advantages over the whole batch") for i in r.inexact)


def test_export_then_check_config_gives_the_critic_back(tmp_path, capsys):
    """PPO with its critic, exported to a verl job by the CLI and read back from the job's overrides.txt: the
    same GAE, value clip, value lr and critic warm-up; verl's batch whitening is the one loss departure."""
    sets = {"gamma": 0.99, "lam": 0.9, "value_clip_eps": 0.3, "value_lr": 2e-6, "value_warmup_steps": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["export", "PPO", "--to", "verl", "--model", "arithmetic-base", "--out", str(tmp_path / "j"),
                         "--approximate", "--gpus-per-node", "1", *(a for k, v in sets.items()
                                                                    for a in ("--set", f"{k}={v}"))]) == 0
    r = L.check_config(tmp_path / "j" / "overrides.txt")
    a = r.algorithm
    assert r.preset == "PPO" and (a.advantage, a.gamma, a.lam, a.value_clip_eps) == ("gae", 0.99, 0.9, 0.3)
    assert (r.settings["value_lr"], r.settings["value_warmup_steps"]) == (2e-6, 3)
    assert [i.split(" ", 2)[:2] for i in r.inexact] == [["verl", "whitens"], ["value_warmup_steps=3:", "verl's"]]
    assert cli.main(["check-config", str(tmp_path / "j" / "overrides.txt")], prog="grpo") == 0
    out = capsys.readouterr().out
    assert "critic: AdamW lr = 2e-06 (value_lr)" in out and "trainer.critic_warmup = 3 (value_warmup_steps)" in out


def test_vapo_without_its_nll_reads_back_as_vapo_less_what_verl_cannot_express():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", E.ApproximateExportWarning)
        r = L.from_verl(E.to_verl(VAPO.replace(nll_coef=0.0), strict=False, group_size=4))
    a = r.algorithm
    assert r.preset == "VAPO" and (a.eps_high, a.aggregation, a.critic_lam, a.lam_alpha) == (0.28, "token_mean",
                                                                                              None, None)
    assert any("length-adaptive" in x and "critic_lam = 1" in x for x in r.departures)
    assert any(x.startswith("no positive-example NLL") for x in r.departures)


def test_verl_critic_settings_no_grpo_lab_critic_has():
    ppo = ["algorithm.adv_estimator=gae", "critic.cliprange_value=inf"]
    assert L.from_verl(ppo).algorithm.value_clip_eps is None  # inf: verl never clips the values
    off = L.from_verl(ppo + ["critic.enable=False"])
    assert any("which no critic computes" in i for i in off.inexact)
    # verl's critic.loss_agg_mode defaults to the actor's: a sequence mean for the critic too
    seq = L.from_verl(ppo + ["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"])
    assert any(i.startswith("critic.loss_agg_mode = 'seq-mean-token-mean' (the actor") for i in seq.inexact)
    assert not any("critic.loss_agg_mode" in i for i in L.from_verl(ppo + ["critic.loss_agg_mode=token-mean"]).inexact)
    grpo = L.from_verl(["algorithm.adv_estimator=grpo", "critic.enable=True", "actor_rollout_ref.rollout.n=4"])
    assert "value_lr" not in grpo.settings and any("no advantage uses" in n for n in grpo.notes)


@pytest.mark.parametrize("name,library,preset,exact,expected", [
    ("trl_dapo.yaml", "trl", "DAPO", True, ["token mean over the whole batch instead of Eq. 12's per-group token mean",
                                             "no dynamic sampling instead of dynamic sampling"]),
    # GSPO's 3e-4 / 4e-4 range is finer than bfloat16 resolves near 1 (TRL's default bf16): not exact
    ("trl_gspo.yaml", "trl", "GSPO", False, []),
    ("trl_dr_grpo.yaml", "trl", "DR_GRPO", True, ["group z-score advantages instead of r - mean advantages (no std)"]),
    ("trl_cispo.yaml", "trl", "CISPO", True, ["group-mean / batch-std advantages instead of group z-score advantages",
                                               "clip range eps_low = 1, eps_high = 4 instead of clip range eps_low = "
                                               "1, eps_high = 0.28"]),
    ("verl_dapo.yaml", "verl", "DAPO", False, ["token mean over the whole batch instead of Eq. 12's per-group token "
                                               "mean", "no Overlong Filtering instead of Overlong Filtering"]),
    ("verl_gspo.yaml", "verl", "GSPO", False, ["std + 1e-06 instead of std + 0.0001"]),
    ("verl_dr_grpo.yaml", "verl", "DR_GRPO", False, []),
    # the README's core settings omit rollout.n, so verl's default n = 1 holds: a group of one, flagged as not exact
    ("verl_cispo.yaml", "verl", "CISPO", False, ["k3 KL with beta = 0.001 instead of no KL term"]),
])
def test_the_docs_example_configs(name, library, preset, exact, expected):
    r = L.check_config(DATA / name)
    assert (r.library, r.preset, r.exact) == (library, preset, exact), r.report()
    for line in expected:
        assert line in r.departures
    assert r.summary.startswith(L._PAPERS[preset][0])


@pytest.mark.parametrize("library,key,value", [("trl", "bf16", None), ("trl", "fp16", True),
                                               ("verl", "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
                                                "bf16")])
def test_a_clip_range_finer_than_the_precision_is_a_departure(library, key, value):
    # GSPO's clip range (3e-4 / 4e-4) against 16-bit precision: grpo_lab.export.optimisation's precision check
    exact = E.to_trl(GSPO) if library == "trl" else E.to_verl(GSPO.replace(adv_eps=1e-6), group_size=8)
    read = L.from_trl if library == "trl" else L.from_verl
    assert read(exact).exact
    changed = {**exact, key: value} if library == "trl" else [*exact, f"{key}={value}"]
    r = read(changed)
    assert not r.exact and any(line.startswith("precision=") and "clip range" in line for line in r.inexact)


def test_verl_dapo_recipe_keys_verl_091_no_longer_reads():
    """The recipe's pre-0.9 keys (use_token_level_loss, custom_reward_function.overlong_buffer) are unknown, so the
    soft overlong punishment is off; reward_model.reward_manager is migrated as verl migrates it."""
    r = L.check_config(DATA / "verl_dapo.yaml")
    assert any(u.startswith("actor_rollout_ref.actor.use_token_level_loss") for u in r.unknown)
    assert sum(u.startswith("custom_reward_function.overlong_buffer.") for u in r.unknown) == 3
    assert r.algorithm.overlong_cache_len is None and r.algorithm.dynamic_sampling
    assert any(i.startswith("dual clip c = 3") for i in r.inexact)
    assert any("reward_model.reward_manager" in n for n in r.notes)


def test_verl_dr_grpo_without_loss_scale_factor_divides_by_the_width():
    r = L.check_config(DATA / "verl_dr_grpo.yaml")
    assert r.algorithm.max_tokens == 512 and r.algorithm.aggregation == "seq_mean_token_sum_norm"
    assert any("padded width" in i for i in r.inexact)


def test_verl_cispo_floor_below_zero_reads_as_no_floor():
    r = L.check_config(DATA / "verl_cispo.yaml")
    assert (r.algorithm.surrogate, r.algorithm.eps_low, r.algorithm.eps_high) == ("cispo", 1.0, 0.2)


@pytest.mark.parametrize("config,words", [
    ({"top_entropy_quantile": 0.2}, "top_entropy_quantile = 0.2"),
    ({"entropy_coef": 0.01}, "entropy bonus"),
    ({"delta": 4.0}, "two-sided clip delta = 4"),
    ({"loss_type": "bnpo"}, "bnpo"),
    ({"loss_type": "luspo", "importance_sampling_level": "sequence"}, "luspo"),
])
def test_trl_settings_no_algorithm_expresses_are_departures(config, words):
    r = L.from_trl(config)
    assert not r.exact and any(words in i for i in r.inexact), r.inexact
    assert L.from_trl({k: v for k, v in config.items() if k != next(iter(config))}).exact or "luspo" in words


def test_trl_overlong_filter_with_a_sequence_mean_is_flagged_by_the_export_check():
    """The reading is exported back: the export's own issue (TRL counts the masked rows in its sequence mean)
    becomes a departure."""
    r = L.from_trl({"loss_type": "grpo", "mask_truncated_completions": True})
    assert r.algorithm.overlong_filter and not r.exact
    assert any("empty rows" in i for i in r.inexact)
    assert L.from_trl({"loss_type": "dapo", "mask_truncated_completions": True}).exact


def test_yaml_numbers_without_a_dot_are_numbers(tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text("loss_type: grpo\nepsilon: 3e-4\nepsilon_high: 4e-4\nlearning_rate: 1e-6\n")
    r = L.check_config(f)
    assert (r.algorithm.eps_low, r.algorithm.eps_high) == (3e-4, 4e-4)


def test_unknown_keys_are_listed_with_a_suggestion():
    r = L.from_trl({"los_type": "grpo"})
    assert r.unknown == ("los_type (did you mean 'loss_type'?)",)
    assert "unknown keys:" in r.report()
    v = L.from_verl(["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.clip_ratio_hgh=0.3", "foo.bar=1"])
    assert v.unknown[0] == ("actor_rollout_ref.actor.clip_ratio_hgh (did you mean "
                            "'actor_rollout_ref.actor.clip_ratio_high'?)")
    assert v.unknown[1].startswith("foo.bar (no such section")


@pytest.mark.parametrize("call,message", [
    (lambda: L.from_trl({"beta": "high"}), "trl config: beta must be a number, got 'high'"),
    (lambda: L.from_trl({"loss_type": "dapoo"}), "unknown loss_type 'dapoo' (did you mean 'dapo'?)"),
    (lambda: L.from_trl({"mask_truncated_completions": "yes"}), "mask_truncated_completions must be true or false"),
    (lambda: L.from_trl([1, 2]), "must be a mapping of GRPOConfig fields"),
    (lambda: L.from_verl({"algorithm": {"adv_estimator": "grpoo"}}), "(did you mean 'grpo'?)"),
    (lambda: L.from_verl(["algorithm.adv_estimator"]), "is not of the form key=value"),
    (lambda: L.from_verl(3), "must be a mapping (as ppo_trainer.yaml) or a list"),
    (lambda: L.from_verl(["actor_rollout_ref.actor.clip_ratio_c=three"]), "clip_ratio_c must be a number"),
    (lambda: L.from_verl(["critic.cliprange_value=wide"]), "critic.cliprange_value must be a number >= 0 (inf: no"),
    (lambda: L.check_config(DATA / "trl_gspo.yaml", "trll"), "unknown library 'trll' (did you mean 'trl'?)"),
])
def test_bad_input_is_one_clear_error(call, message):
    with pytest.raises(ValueError) as exc:
        call()
    assert message in str(exc.value)


def test_files_that_do_not_exist_or_hold_no_mapping(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        L.from_trl(tmp_path / "missing.yaml")
    (tmp_path / "s.yaml").write_text("just a string\n")
    with pytest.raises(ValueError, match="must be a mapping"):
        L.check_config(tmp_path / "s.yaml")
    (tmp_path / "both.yaml").write_text("loss_type: grpo\nalgorithm:\n  adv_estimator: grpo\n")
    with pytest.raises(ValueError, match="ambiguous.*loss_type.*algorithm.*--library trl or --library verl"):
        L.check_config(tmp_path / "both.yaml")
    (tmp_path / "none.yaml").write_text("foo: 1\n")
    with pytest.raises(ValueError, match="none of its keys"):
        L.check_config(tmp_path / "none.yaml")
    assert L.check_config(tmp_path / "both.yaml", library="trl").unknown == ("algorithm",)


def test_cli_check_config(capsys, tmp_path):
    assert cli.main(["check-config", str(DATA / "verl_default_grpo.yaml")], prog="grpo") == 0
    out = capsys.readouterr().out
    assert out.startswith("verl 0.9.1 trainer config (") and "dual clip c = 3" in out
    float32 = tmp_path / "gspo_fp32.yaml"
    float32.write_text((DATA / "trl_gspo.yaml").read_text() + "bf16: false\n")
    assert cli.main(["check-config", str(float32), "--library", "trl"], prog="grpo") == 0
    assert "computes: GSPO (arXiv 2507.18071), exactly" in capsys.readouterr().out
    (tmp_path / "both.yaml").write_text("loss_type: grpo\nalgorithm:\n  adv_estimator: grpo\n")
    assert cli.main(["check-config", str(tmp_path / "both.yaml")], prog="grpo") == 2
    err = capsys.readouterr().err
    assert err.startswith("grpo: error: ") and "TRL" in err and "verl" in err and err.count("\n") == 1
    assert cli.main(["check-config", str(tmp_path / "nope.yaml")], prog="grpo") == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["check-config"], prog="grpo") == 2


def test_cli_check_config_exits_1_on_an_unknown_key(capsys, tmp_path):
    # a typo leaves the library's default in place: the reading may describe another objective, so CI can stop on it
    typo = tmp_path / "typo.yaml"
    typo.write_text("loss_type: grpo\nbetaa: 0.04\n")
    assert cli.main(["check-config", str(typo)], prog="grpo") == 1
    captured = capsys.readouterr()
    assert "betaa (did you mean 'beta'?)" in captured.err and "computes: " in captured.out
