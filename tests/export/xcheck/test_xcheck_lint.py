"""grpo_lab.export.lint against the libraries themselves (marker ``xcheck``; ``make xcheck``).

* the defaults recorded in grpo_lab.export.library_defaults equal TRL 1.16.0's ``GRPOConfig`` and verl 0.9.1's
  composed ``ppo_trainer.yaml``, and every key of verl's loss sections is known to the linter;
* each reading is checked by the equivalence harness of tests/export/xcheck/test_xcheck_trl.py / test_xcheck_verl.py: the
  Algorithm read from a config computes the library's own loss and gradient with that config (float64, 1e-10),
  for the export of every preset the export can express and for the docs' example configs read exactly; where
  the reading says it is not exact (verl's dual clip, Dr.GRPO without loss_scale_factor) the library's loss
  differs from the nearest Algorithm's, so the departure is real.
"""

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch

from grpo_lab import export as E
from grpo_lab.export import library_defaults as D
from grpo_lab.export import lint as L
from grpo_lab.export.lint_io import flatten, load_yaml, parse_override
from grpo_lab.algo.objectives import aggregate, cispo_weight, policy_loss

import _xcheck_common as X

pytestmark = [pytest.mark.xcheck, pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")]

trl = pytest.importorskip("trl", reason="xcheck: trl is not installed (pip install '.[xcheck]', see make xcheck)")
from test_xcheck_trl import trl_loss  # noqa: E402  (skips this module as it skips itself)
from test_xcheck_verl import compose, verl_loss  # noqa: E402

DATA = Path(__file__).parents[2] / "data" / "lint"
#: GRPOConfig fields that size the generation batch: the harness runs one batch of X.B rows in groups of X.G
_TRL_SIZES = ("output_dir", "per_device_train_batch_size", "num_generations", "steps_per_generation",
              "gradient_accumulation_steps", "generation_batch_size")
#: verl's sizes for the harness's batch: one minibatch of X.B rows (its sequence means divide by mini x n rows)
_VERL_SIZES = {"data.train_batch_size": X.B // X.G, "actor_rollout_ref.actor.ppo_mini_batch_size": X.B // X.G,
               "actor_rollout_ref.rollout.n": X.G, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": X.B}


def test_recorded_trl_defaults_are_the_installed_ones():
    fields = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    assert set(fields) == set(D.TRL_DEFAULTS) | D.TRL_OTHER_FIELDS
    assert not set(D.TRL_DEFAULTS) & D.TRL_OTHER_FIELDS
    for key, want in D.TRL_DEFAULTS.items():
        f = fields[key]
        got = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert got == want, (key, got, want)
    assert trl.__version__ == D.TRL_DEFAULTS_VERSION


def test_recorded_trl_script_fields_are_the_installed_ones():
    # the dataclasses `trl grpo --config FILE` parses besides GRPOConfig (trl/scripts/grpo.py's make_parser)
    from trl.scripts.grpo import GRPOScriptArguments

    names = {f.name for cls in (GRPOScriptArguments, trl.ModelConfig, trl.DatasetMixtureConfig)
             for f in dataclasses.fields(cls)}
    assert names - {f.name for f in dataclasses.fields(trl.GRPOConfig)} == D.TRL_SCRIPT_FIELDS


def _raw_verl_config():
    """verl's composed ``ppo_trainer`` config, not instantiated (its defaults leave the micro-batch unset)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from test_xcheck_verl import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return hydra_compose("ppo_trainer", overrides=[])


def test_recorded_verl_defaults_are_the_installed_ones():
    from omegaconf import OmegaConf

    cfg = _raw_verl_config()
    for key, want in D.VERL_DEFAULTS.items():
        got = OmegaConf.select(cfg, key)
        got = list(got) if OmegaConf.is_list(got) else got
        assert got == want, (key, got, want)
    leaves = flatten(OmegaConf.to_container(cfg, resolve=False))
    known = set(D.VERL_DEFAULTS) | D.VERL_OTHER_KEYS
    strict = [k for k in leaves if k.startswith(D.VERL_STRICT_SECTIONS) and not k.startswith(D.VERL_OPEN_PREFIXES)]
    assert strict and set(strict) <= known, sorted(set(strict) - known)
    assert {k.split(".", 1)[0] for k in leaves} <= set(D.VERL_SECTIONS)


def lab_loss(algo, b: dict, adv: torch.Tensor, num_sequences=None):
    """grpo_lab's loss and gradient for ``algo`` (its own max_tokens when it has one)."""
    logp = b["logp"].clone().requires_grad_()
    torch.manual_seed(0)
    out = policy_loss(logp, b["old"], adv, b["mask"], algo, ref_logp=b["ref"],
                      max_tokens=algo.max_tokens or X.MAX_NEW_TOKENS, group_size=X.G, num_sequences=num_sequences)
    out.loss.backward()
    return out.loss.detach(), logp.grad


def lab_side(algo, b: dict, adv: torch.Tensor, target: str):
    """grpo_lab's side as the xcheck tests compare it: both libraries count empty rows in their sequence means,
    write CISPO as -sg(w) A log pi (value shift removed), and TRL holds SAPO's temperatures in float32."""
    seq_mean = algo.aggregation in ("seq_mean_token_mean", "seq_mean_token_sum_norm")
    if algo.surrogate == "sapo" and target == "trl":
        algo = algo.replace(**{k: float(torch.tensor(algo.params[k], dtype=torch.float32))
                               for k in ("tau_pos", "tau_neg")})
    loss, grad = lab_loss(algo, b, adv, num_sequences=X.B if seq_mean else None)
    if algo.surrogate == "cispo":
        w = cispo_weight(b["logp"] - b["old"], algo.eps_low, algo.eps_high)
        loss = loss - aggregate(w * adv[:, None] * b["old"], b["mask"], algo.aggregation)
    return loss, grad


def library_side(target: str, config, b: dict, adv: torch.Tensor, tmp_path):
    """The library's own loss and gradient under ``config`` (TRL: GRPOConfig kwargs; verl: overrides)."""
    if target == "trl":
        return trl_loss(config, b, adv, tmp_path)
    return verl_loss(compose(config)[0], b, adv)


def _dev(a, b) -> tuple:
    return abs(float(a[0] - b[0])), float((a[1] - b[1]).abs().max())


@pytest.mark.parametrize("target,name", [(t, n) for t in ("trl", "verl") for n in X.exportable(t)])
def test_each_reading_computes_the_librarys_loss(target, name, tmp_path):
    """from_X(to_X(p)) for every preset the export expresses: the reading's loss == the library's own."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", E.ApproximateExportWarning)
        config = E.translate(X.ALGORITHMS[name], target, strict=False, **X.BUDGET).config
    r = (L.from_trl if target == "trl" else L.from_verl)(config)
    assert r.exact, r.inexact
    b = X.batch()
    adv = X.advantages(r.algorithm, b["rewards"])
    dloss, dgrad = _dev(lab_side(r.algorithm, b, adv, target), library_side(target, config, b, adv, tmp_path))
    X.report(target, "lint " + name, dloss, dgrad)
    assert dloss <= X.TOL and dgrad <= X.TOL


def _fixture_config(name: str, r) -> object:
    """The fixture as the library takes it: TRL kwargs (numbers as numbers, generation sizes left to the
    harness), or verl overrides (without the keys verl 0.9.1 does not have)."""
    content = load_yaml(DATA / name)
    if r.library == "trl":
        return {k: v for k, v in L._coerce(content, D.TRL_DEFAULTS).items() if k not in _TRL_SIZES}
    unknown = {u.split(" ", 1)[0] for u in r.unknown}
    lines = content if isinstance(content, list) else [f"{k}={v}" for k, v in flatten(content).items()]
    lines = [line for line in lines if parse_override(line)[0] not in unknown | set(_VERL_SIZES)]
    return lines + [f"{k}={v}" for k, v in _VERL_SIZES.items()]


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.yaml")))
def test_the_docs_example_configs_against_the_library(name, tmp_path):
    """Each example config: an exact reading computes the library's loss; an inexact one does not (its departure
    from every Algorithm is real on this batch), unless its only departure is the precision (a clip range finer
    than bfloat16 resolves, GSPO's) or verl's default group of one (rollout.n = 1: a size, not the formula): the
    formula is then the library's, which this float64 batch checks."""
    r = L.check_config(DATA / name)
    config = _fixture_config(name, r)
    b = X.batch()
    adv = X.advantages(r.algorithm, b["rewards"])
    dloss, dgrad = _dev(lab_side(r.algorithm, b, adv, r.library), library_side(r.library, config, b, adv, tmp_path))
    X.report(r.library, name, dloss, dgrad, "" if r.exact else "(inexact: " + r.inexact[0][:40] + ")")
    if all(line.startswith(("precision=", "rollout.n = ")) for line in r.inexact):
        assert dloss <= X.TOL and dgrad <= X.TOL
    else:
        assert dgrad > 1e-4


def test_from_trl_reads_a_grpoconfig_object(tmp_path):
    cfg = trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, loss_type="grpo", beta=0.04,
                         use_bias_correction_kl=False)
    r = L.from_trl(cfg)
    assert r.exact and r.preset == "GRPO" and r.unknown == ()
    assert r.departures == () and r.summary == "GRPO (DeepSeekMath, arXiv 2402.03300), exactly"
    assert (r.algorithm.kl, r.algorithm.beta, r.algorithm.kl_importance_correction) == ("k3", 0.04, False)


def test_the_critic_read_back_is_what_verl_composes():
    """PPO with a critic, exported and composed by verl: the linter's gamma, lam, value clip, value lr and critic
    warm-up are verl's composed values (need_critic on), and its critic loss aggregation verl's token mean."""
    from verl.trainer.ppo.utils import need_critic

    from grpo_lab.algo.algorithms import PPO

    algo = PPO.replace(gamma=0.99, lam=0.9, value_clip_eps=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", E.ApproximateExportWarning)
        lines = E.to_verl(algo, strict=False, value_lr=2e-6, value_warmup_steps=3, **X.BUDGET)
    cfg = compose(lines)[2]
    r = L.from_verl(lines)
    a = r.algorithm
    assert need_critic(cfg) and cfg.algorithm.adv_estimator == a.advantage == "gae"
    assert (a.gamma, a.lam, a.value_clip_eps) == (cfg.algorithm.gamma, cfg.algorithm.lam, cfg.critic.cliprange_value)
    assert (r.settings["value_lr"], r.settings["value_warmup_steps"]) == (cfg.critic.optim.lr,
                                                                          cfg.trainer.critic_warmup)
    assert cfg.critic.loss_agg_mode == "token-mean" and r.preset == "PPO"
    assert any(i.startswith("verl whitens the GAE advantages") for i in r.inexact)
