"""Equivalence with verl's own loss code: grpo_lab's policy_loss vs ``verl.trainer.ppo.core_algos``,
configured by ``grpo_lab.export.to_verl`` (grpo_lab issue 16). Marker ``xcheck``; ``make xcheck``.

The exported overrides are composed with verl's own ``ppo_trainer.yaml`` by Hydra (so every key must
exist in verl's config) and turned into verl's ``ActorConfig`` / ``AlgoConfig`` by verl's
``omega_conf_to_dataclass``, as its trainer does. The loss is then verl's policy-loss function from
its registry (``get_policy_loss_fn(loss_mode)``) plus, when ``use_kl_loss``, ``agg_loss(kl_penalty(...))
* kl_loss_coef``, which is how ``verl.workers.utils.losses.ppo_loss`` (the actor loss of verl
0.9.1's trainer) combines them, with the global batch info that function sets (one device; the
minibatch's token count; ``global_batch_size = ppo_mini_batch_size * rollout.n``, every row of the
minibatch). Advantages: verl's GRPO / RLOO estimators called as ``ray_trainer.compute_advantage``
calls them. verl is installed without its heavy dependencies (``requirements/xcheck.txt``).
"""

import os

import numpy as np
import pytest
import torch

from grpo_lab import export as E
from grpo_lab.algo.algorithms import DR_GRPO, GRPO, GSPO

import _xcheck_common as X

pytestmark = pytest.mark.xcheck

try:
    import hydra  # noqa: F401
    import verl
    from verl.trainer.ppo import core_algos
    from verl.utils.config import omega_conf_to_dataclass
except Exception as exc:  # not installed (ImportError), or omegaconf broken by ci.txt's antlr4 pin (see xcheck.txt)
    X.unavailable(f"verl's core_algos / hydra do not import ({type(exc).__name__}: {exc}); install "
                  "requirements/xcheck.txt (make xcheck)")
X.require_version("verl", verl.__version__, E.VERL_VERSION)

CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def compose(overrides: list):
    """verl's trainer config with ``overrides``: ``(ActorConfig, AlgoConfig)``, built as verl builds them."""
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = hydra_compose("ppo_trainer", overrides=overrides)
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor), omega_conf_to_dataclass(cfg.algorithm), cfg


def verl_loss(actor, b: dict, adv: torch.Tensor):
    """verl's actor loss (as ``workers.utils.losses.ppo_loss`` composes it): ``(loss, grad w.r.t. logp)``."""
    mask = b["mask"].bool()
    actor.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()),
                                   global_batch_size=actor.ppo_mini_batch_size * actor.rollout_n,
                                   loss_scale_factor=actor.loss_scale_factor)
    logp = b["logp"].clone().requires_grad_()
    torch.manual_seed(0)  # Clip-Cov's draw: the same global-generator state as grpo_lab's (X.lab_loss)
    pg_loss, _ = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old_log_prob=b["old"], log_prob=logp, advantages=adv[:, None] * b["mask"], response_mask=mask,
        loss_agg_mode=actor.loss_agg_mode, config=actor, rollout_is_weights=None)
    loss = pg_loss
    if actor.use_kl_loss:
        kld = core_algos.kl_penalty(logprob=logp, ref_logprob=b["ref"], kl_penalty=actor.kl_loss_type)
        loss = loss + core_algos.agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=actor.loss_agg_mode,
                                          **actor.global_batch_info) * actor.kl_loss_coef
    loss.backward()
    return loss.detach(), logp.grad


def verl_advantages(alg, b: dict) -> torch.Tensor:
    """verl's advantage estimator as ``ray_trainer.compute_advantage`` calls it; reward on the first column."""
    rewards = torch.zeros(X.B, X.T, dtype=torch.float64)
    rewards[:, 0] = b["rewards"]
    index = np.array([f"q{i // X.G}" for i in range(X.B)], dtype=object)
    response = torch.ones(X.B, X.T, dtype=torch.float64)  # every row scored (grpo_lab scores truncated rows too)
    if alg.adv_estimator == "grpo":
        adv, _ = core_algos.compute_grpo_outcome_advantage(token_level_rewards=rewards, response_mask=response,
                                                            index=index,
                                                            norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)
    else:
        adv, _ = core_algos.get_adv_estimator_fn(alg.adv_estimator)(token_level_rewards=rewards,
                                                                    response_mask=response, index=index, config=alg)
    return adv[:, 0]


def test_the_batch_covers_every_case():
    b = X.batch()
    assert (b["mask"].sum(1) == 0).sum() == 1
    r = torch.exp(b["logp"] - b["old"])
    adv = X.advantages(GRPO, b["rewards"])
    assert ((r > 3) & (adv[:, None] < 0) & b["mask"].bool()).any()  # where verl's default dual clip acts
    assert (adv.view(-1, X.G) == 0).all(1).sum() == 1


@pytest.mark.parametrize("name", list(X.exportable("verl")))
def test_verl_computes_the_exported_algorithm(name):
    """Every preset and V3.2: grpo_lab's loss and gradient == verl's (<= 1e-10, float64) for the algorithm the
    export computes exactly (the preset itself, or the alternative its strict export names)."""
    algo = X.ALGORITHMS[name]
    tr, alt, exact = X.exact_alternative(algo, "verl")
    actor, alg, _ = compose(exact.config)
    b = X.batch()
    adv = X.advantages(alt, b["rewards"])
    loss_v, grad_v = verl_loss(actor, b, adv)
    seq_mean = alt.aggregation in ("seq_mean_token_mean", "seq_mean_token_sum_norm")
    loss_l, grad_l, _ = X.lab_loss(alt, b, adv, num_sequences=X.B if seq_mean else None)
    extra = "" if tr.exact else "as " + ", ".join(f"{i.axis}->{i.fix}" for i in tr.issues)
    if alt.surrogate == "cispo":
        # verl writes -sg(w) A log pi_theta, grpo_lab -sg(w) A log r: values differ by agg(sg(w) A log pi_old)
        from grpo_lab.algo.objectives import aggregate, cispo_weight

        w = cispo_weight(b["logp"] - b["old"], alt.eps_low, alt.eps_high)
        shift = aggregate(w * adv[:, None] * b["old"], b["mask"], alt.aggregation)
        assert abs(float(loss_l - loss_v)) > 1e-3
        loss_l = loss_l - shift
        extra += f" (value shift {abs(float(shift)):.2f} removed: log pi vs log r)"
    dloss, dgrad = abs(float(loss_l - loss_v)), float((grad_l - grad_v).abs().max())
    X.report("verl", name, dloss, dgrad, extra)
    assert dloss <= X.TOL and dgrad <= X.TOL
    assert float(grad_v.abs().max()) > 1e-3


@pytest.mark.parametrize("algo", [GRPO.replace(adv_eps=1e-6), DR_GRPO, GRPO.replace(advantage="rloo")],
                         ids=["group", "group_mean", "rloo"])
def test_verl_advantage_estimators(algo):
    """verl's estimator == grpo_lab's at float32 rounding (grpo_lab returns float32 advantages by contract);
    the all-equal group gets exactly 0 in both."""
    _, alg, _ = compose(E.to_verl(algo, **X.BUDGET))
    b = X.batch()
    got = verl_advantages(alg, b)
    want = algo.advantages(b["rewards"], X.G).to(torch.float64)
    assert torch.all((got - want).abs() <= 2.0 ** -24 * got.abs() + 1e-12), (got, want)
    assert (got.view(-1, X.G)[1] == 0).all() and (want.view(-1, X.G)[1] == 0).all()


def test_verl_advantage_epsilon_is_1e_6_not_grpo_labs_1e_4():
    """Why to_verl(GRPO) raises: verl's std + 1e-6 against the preset's std + 1e-4."""
    _, alg, _ = compose(E.to_verl(GRPO.replace(adv_eps=1e-6), **X.BUDGET))  # the same overrides as GRPO's
    got = verl_advantages(alg, X.batch())
    want = GRPO.advantages(X.batch()["rewards"], X.G).to(torch.float64)  # adv_eps = 1e-4
    rel = ((got - want).abs() / got.abs().clamp(min=1e-12))[got != 0]
    assert rel.min() > 1e-4  # far above float32 rounding


def test_verls_vectorised_grpo_estimator_is_why_the_export_uses_grpo():
    """Issue 16: verl's grpo_vectorized computes the group mean in float32, so a float64 group of equal rewards
    that float32 does not represent (0.7) gets (0.7 - float32(0.7)) / 1e-6, far from 0; grpo (the export's) and
    grpo_lab give it 0."""
    scores = torch.tensor([0.7] * X.G + [1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    rewards = torch.zeros(2 * X.G, X.T, dtype=torch.float64)
    rewards[:, 0] = scores
    index = np.array([f"q{i // X.G}" for i in range(2 * X.G)], dtype=object)
    kw = dict(token_level_rewards=rewards, response_mask=torch.ones_like(rewards), index=index)
    vec, _ = core_algos.compute_grpo_vectorized_outcome_advantage(**kw)
    loop, _ = core_algos.compute_grpo_outcome_advantage(**kw)
    assert vec[:X.G, 0].abs().max() > 1e-3
    assert loop[:X.G, 0].abs().max() < 1e-9
    assert (GRPO.advantages(scores, X.G)[:X.G] == 0).all()


@pytest.mark.parametrize("override,algo", [
    ("actor_rollout_ref.actor.clip_ratio_c=3.0", GRPO.replace(adv_eps=1e-6)),         # verl's default dual clip
    ("actor_rollout_ref.actor.loss_agg_mode=token-mean", GSPO.replace(adv_eps=1e-6)),  # verl's GSPO default
    ("actor_rollout_ref.actor.loss_scale_factor=null", DR_GRPO),                      # width instead of the budget
    ("actor_rollout_ref.actor.kl_loss_coef=0.001", GRPO.replace(adv_eps=1e-6)),        # verl's default coefficient
])
def test_verls_defaults_would_train_something_else(override, algo):
    """Each setting the export pins matters on this batch: verl's default in its place changes the gradient."""
    b = X.batch()
    adv = X.advantages(algo, b["rewards"])
    ov = E.to_verl(algo, **X.BUDGET)
    key = override.split("=", 1)[0]
    assert any(line.startswith(key + "=") for line in ov)  # the export pins this key
    _, grad_ok = verl_loss(compose(ov)[0], b, adv)
    _, grad_default = verl_loss(compose([line for line in ov if not line.startswith(key + "=")] + [override])[0],
                                b, adv)
    assert float((grad_ok - grad_default).abs().max()) > 1e-4


def test_composed_config_reads_back_every_export():
    """Every override of every export is a key of verl's config and reads back as exported (soft overlong
    punishment, dynamic sampling and sizes included)."""
    for name, algo in X.ALGORITHMS.items():
        _, alt, exact = X.exact_alternative(algo, "verl")
        _, _, cfg = compose(exact.config)
        for line in exact.config:
            key, value = line.lstrip("+").split("=", 1)
            node = cfg
            for part in key.split("."):
                node = node[part]
            want = {"True": True, "False": False, "null": None}.get(value, value)
            if isinstance(node, (int, float)) and not isinstance(node, bool):
                want = float(value)
            assert node == want or str(node).replace(" ", "") == value, (name, line, node)  # lists: [0.9,0.99]
    assert cfg.actor_rollout_ref.actor.rollout_n == X.G


def test_verl_seq_mean_epsilon_vanishes_with_its_bool_mask():
    """verl's seq-mean-token-mean divides row i by |o_i| + 1e-8. Its actor passes a bool response mask
    (``ppo_loss``: ``.to(bool)``), so |o_i| is an integer tensor and |o_i| + 1e-8 is computed in float32, where it
    rounds to |o_i| for every |o_i| >= 1: exact. With a float64 mask the 1e-8 stays: each row's loss is scaled by
    |o_i| / (|o_i| + 1e-8), which this test puts into grpo_lab's row losses by hand."""
    from grpo_lab.algo.objectives import policy_loss

    algo = GRPO.replace(adv_eps=1e-6)
    b = X.batch()
    adv = X.advantages(algo, b["rewards"])
    per_token = torch.rand(X.B, X.T, dtype=torch.float64)
    bool_mask = b["mask"].bool()
    exact = core_algos.agg_loss(loss_mat=per_token, loss_mask=bool_mask, loss_agg_mode="seq-mean-token-mean",
                                global_batch_size=X.B)
    lengths = b["mask"].sum(1)
    want = ((per_token * b["mask"]).sum(1) / lengths.clamp(min=1)).sum() / X.B
    assert abs(float(exact - want)) <= 1e-14
    off = core_algos.agg_loss(loss_mat=per_token, loss_mask=b["mask"], loss_agg_mode="seq-mean-token-mean",
                              global_batch_size=X.B)
    assert 1e-12 < abs(float(off - want)) < 1e-7
    scaled = ((per_token * b["mask"]).sum(1) / lengths.clamp(min=1) * lengths / (lengths + 1e-8)).sum() / X.B
    assert abs(float(off - scaled)) <= 1e-14
    # and the whole verl loss with a float mask against grpo_lab's rows scaled the same way
    _, _, cfg = compose(E.to_verl(algo, **X.BUDGET))
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=X.B, loss_scale_factor=None)
    logp = b["logp"].clone().requires_grad_()
    pg, _ = core_algos.get_policy_loss_fn("vanilla")(old_log_prob=b["old"], log_prob=logp,
                                                     advantages=adv[:, None] * b["mask"], response_mask=b["mask"],
                                                     loss_agg_mode="seq-mean-token-mean", config=actor)
    kl = core_algos.agg_loss(loss_mat=core_algos.kl_penalty(logp, b["ref"], actor.kl_loss_type), loss_mask=b["mask"],
                             loss_agg_mode="seq-mean-token-mean", global_batch_size=X.B)
    rows = torch.zeros((), dtype=torch.float64)
    lab_logp = b["logp"].clone().requires_grad_()
    for i in range(X.B):
        n = float(lengths[i])
        if n:
            out = policy_loss(lab_logp[i:i + 1], b["old"][i:i + 1], adv[i:i + 1], b["mask"][i:i + 1], algo,
                              ref_logp=b["ref"][i:i + 1])
            rows = rows + out.loss * n / (n + 1e-8)
    verl_float = pg + actor.kl_loss_coef * kl
    assert abs(float(verl_float.detach() - rows.detach() / X.B)) <= 1e-14


def test_verl_validates_the_jobs_configuration_and_loads_its_reward_function(tmp_path):
    """``grpo_lab.export.verl_job``: its overrides, composed with verl's ``ppo_trainer.yaml``, pass verl's own
    ``validate_config`` (what ``main_ppo`` runs first), and verl's own loader (``get_custom_reward_fn``) loads
    its ``reward.py``, which scores a ``\\boxed{}`` answer 1 (verl's built-in GSM8K scorer reads only ``####``)."""
    import pandas as pd
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    out = E.verl_job(GRPO.replace(adv_eps=E.VERL_ADV_EPS), "gsm8k", "arithmetic-base", tmp_path / "job", steps=2,
                     nnodes=1, n_gpus_per_node=2, group_size=X.G, prompts_per_step=4)
    overrides = (out / "overrides.txt").read_text().splitlines()
    actor, _, cfg = compose(overrides)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert actor.use_kl_loss and cfg.trainer.n_gpus_per_node == 2 and cfg.trainer.total_training_steps == 2
    assert cfg.data.train_files == str(out / "train.parquet")
    score = get_custom_reward_fn(cfg)
    row = pd.read_parquet(cfg.data.val_files).iloc[0]
    gold, info = row["reward_model"]["ground_truth"], dict(row["extra_info"])
    got = score(data_source=row["data_source"], solution_str=f"... so \\boxed{{{gold}}}", ground_truth=gold,
                extra_info=info)
    assert got == {"score": 1.0, "acc": 1.0}
    assert score(data_source=row["data_source"], solution_str=f"#### {gold}0", ground_truth=gold,
                 extra_info=info)["score"] == 0.0
