"""Equivalence with TRL's own loss code: grpo_lab's policy_loss vs ``trl.GRPOTrainer._compute_loss``,
configured by ``grpo_lab.export.to_trl`` (grpo_lab issue 16). Marker ``xcheck``; ``make xcheck``.

TRL computes its loss inside ``GRPOTrainer._compute_loss`` (no standalone function): the tests call
that real method on a minimal stand-in trainer (``object.__new__`` plus the attributes the method
reads, assigned from a real ``trl.GRPOConfig`` built with the exported keyword arguments, exactly as
``GRPOTrainer.__init__`` assigns them) whose log-prob forward returns the batch's log-probs; TRL's
formula is never re-typed here. Both sides get the same float64 advantages (grpo_lab's); TRL's
advantage code lives inside generation (``_generate_and_score_completions``) and is checked only
for its hard-coded epsilon.
"""

import inspect
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from grpo_lab import export as E
from grpo_lab.algo.algorithms import CISPO, DAPO, DR_GRPO, GRPO, GSPO
from grpo_lab.algo.objectives import aggregate, cispo_weight
from grpo_lab.algo.rewards import overlong_penalty
from grpo_lab.algo.selection import overlong_cache_tokens

import _xcheck_common as X

# GRPOConfig (transformers TrainingArguments) warns about its own deprecated fields on construction
pytestmark = [pytest.mark.xcheck, pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")]

try:
    import trl
except ImportError as exc:
    X.unavailable(f"trl does not import ({exc}); pip install '.[xcheck]', see make xcheck")
X.require_version("trl", trl.__version__, E.TRL_VERSION)
from trl import GRPOConfig, GRPOTrainer  # noqa: E402


class _OneProcess:
    """The accelerator calls ``_compute_loss`` makes, for one process (nothing to gather or reduce)."""

    num_processes = 1
    sync_gradients = True

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x, reduction="sum"):
        return x


def trl_loss(kwargs: dict, b: dict, adv: torch.Tensor, tmp_path):
    """``GRPOTrainer._compute_loss`` on the batch with ``GRPOConfig(**kwargs)``: ``(loss, grad w.r.t. logp)``."""
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, **kwargs)
    t = object.__new__(GRPOTrainer)
    # the assignments of GRPOTrainer.__init__ (trl 1.16.0) that _compute_loss reads, from the real config
    t.args = args
    t.max_completion_length = args.max_completion_length
    t.use_vllm = args.use_vllm
    t.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
    t.loss_type = args.loss_type
    t.importance_sampling_level = args.importance_sampling_level
    t.off_policy_mask_threshold = args.off_policy_mask_threshold
    t.top_entropy_quantile = args.top_entropy_quantile
    t.entropy_coef = args.entropy_coef
    t.use_adaptive_entropy = args.use_adaptive_entropy
    t._entropy_bonus_enabled = t.entropy_coef != 0.0 or t.use_adaptive_entropy
    t.epsilon_low = args.epsilon
    t.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    t.beta = args.beta
    t.aux_loss_enabled = False  # a dense policy has no router loss
    # one process, no gradient accumulation, training mode
    t.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    t.accelerator = _OneProcess()
    t.model = SimpleNamespace(training=True)
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    logp = b["logp"].clone().requires_grad_()
    # "a tiny fake model returning the given log-probs": the log-prob forward returns the batch's
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
    mask = b["mask"].long()  # TRL's completion_mask is an integer tensor
    inputs = {
        "prompt_ids": torch.zeros(X.B, 1, dtype=torch.long), "prompt_mask": torch.ones(X.B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(X.B, X.T, dtype=torch.long), "completion_mask": mask,
        "advantages": adv, "old_per_token_logps": b["old"], "ref_per_token_logps": b["ref"],
        "num_items_in_batch": mask.sum(),
    }
    loss = t._compute_loss(None, inputs)
    loss.backward()
    return loss.detach(), logp.grad


def test_stand_in_assigns_what_grpotrainer_init_assigns():
    """If TRL changes how __init__ turns the config into attributes, the stand-in above must follow."""
    src = inspect.getsource(GRPOTrainer.__init__)
    for line in ("self.epsilon_low = args.epsilon",
                 "self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon",
                 "self.loss_type = args.loss_type", "self.beta = args.beta",
                 "self.importance_sampling_level = args.importance_sampling_level",
                 "self.off_policy_mask_threshold = args.off_policy_mask_threshold",
                 "self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy"):
        assert line in src, line


def test_the_batch_covers_every_case():
    b = X.batch()
    assert (b["mask"].sum(1) == 0).any() and (b["mask"].sum(1) > 0).sum() >= X.B - 1   # one empty row
    adv = X.advantages(GRPO, b["rewards"])
    assert (adv.view(-1, X.G) == 0).all(1).any() and (adv != 0).any()                  # an all-equal group
    _, _, m = X.lab_loss(GRPO, b, adv)
    assert m["clip_frac_low"] > 0 and m["clip_frac_high"] > 0 and m["grad_token_frac"] > 0.3
    r = torch.exp(b["logp"] - b["old"])[b["mask"].bool()]
    assert (r > 3).any() and (r < 0.8).any() and (r > 1.28).any()
    _, _, m = X.lab_loss(X.V32, b, X.advantages(X.V32, b["rewards"]))
    assert 0 < m["offpolicy_masked_frac"] < 0.5
    _, _, m = X.lab_loss(GSPO, b, adv)
    assert 0 < m["seq_clip_frac"] < 1


@pytest.mark.parametrize("name", list(X.exportable("trl")))
def test_trl_computes_the_exported_algorithm(name, tmp_path):
    """Every preset and V3.2: grpo_lab's loss and gradient == TRL's (<= 1e-10, float64) for the algorithm the
    export computes exactly (the preset itself, or the alternative its strict export names)."""
    algo = X.ALGORITHMS[name]
    tr, alt, exact = X.exact_alternative(algo, "trl")
    b = X.batch()
    adv = X.advantages(alt, b["rewards"])
    loss_t, grad_t = trl_loss(exact.config, b, adv, tmp_path)
    seq_mean = alt.aggregation in ("seq_mean_token_mean", "seq_mean_token_sum_norm")
    extra = "" if tr.exact else "as " + ", ".join(f"{i.axis}->{i.fix}" for i in tr.issues)
    lab = alt
    if alt.surrogate == "sapo":
        # TRL builds the temperatures with torch.where(A > 0, tau_pos, tau_neg) from python floats: a float32
        # tensor, so 1.05 is 1.0499999523... even in a float64 loss (a relative 5e-8); grpo_lab keeps float64
        f32 = {k: float(torch.tensor(alt.params[k], dtype=torch.float32)) for k in ("tau_pos", "tau_neg")}
        lab = alt.replace(**f32)
        extra += f" (temperatures as TRL's float32: tau_neg {f32['tau_neg']!r})"
    # TRL counts the empty row in its sequence means: grpo_lab's num_sequences says so (see the test below)
    loss_l, grad_l, _ = X.lab_loss(lab, b, adv, num_sequences=X.B if seq_mean else None)
    if alt.surrogate == "cispo":
        # TRL writes -sg(w) A log pi_theta, grpo_lab -sg(w) A log r: values differ by agg(sg(w) A log pi_old)
        w = cispo_weight(b["logp"] - b["old"], alt.eps_low, alt.eps_high)
        shift = aggregate(w * adv[:, None] * b["old"], b["mask"], alt.aggregation)
        extra += f" (value shift {abs(float(shift)):.2f} removed: log pi vs log r)"
        assert abs(float(loss_l - loss_t)) > 1e-3  # the shift is real
        loss_l = loss_l - shift
    dloss, dgrad = abs(float(loss_l - loss_t)), float((grad_l - grad_t).abs().max())
    X.report("trl", name, dloss, dgrad, extra)
    assert dloss <= X.TOL and dgrad <= X.TOL
    assert float(grad_t.abs().max()) > 1e-3  # a gradient to compare


@pytest.mark.parametrize("algo", [GRPO, DR_GRPO])
def test_trl_sequence_means_count_empty_rows(algo, tmp_path):
    """The known default: TRL's grpo / dr_grpo divide by all B rows, grpo_lab by the non-empty ones."""
    b = X.batch()
    adv = X.advantages(algo, b["rewards"])
    loss_t, grad_t = trl_loss(E.to_trl(algo, **X.BUDGET), b, adv, tmp_path)
    loss_l, grad_l, _ = X.lab_loss(algo, b, adv)  # grpo_lab's default: 11 non-empty rows
    rows = float((b["mask"].sum(1) > 0).sum())
    assert abs(float(loss_l - loss_t)) > 1e-4
    assert abs(float(loss_l * rows / X.B - loss_t)) <= X.TOL
    assert float((grad_l * rows / X.B - grad_t).abs().max()) <= X.TOL


def test_trl_default_kl_is_deepseek_v32_eq7_not_deepseekmath(tmp_path):
    """Leaving use_bias_correction_kl at TRL's default trains GRPO with V3.2's importance-corrected KL."""
    b = X.batch()
    adv = X.advantages(GRPO, b["rewards"])
    kw = {k: v for k, v in E.to_trl(GRPO, **X.BUDGET).items() if k != "use_bias_correction_kl"}
    loss_t, grad_t = trl_loss(kw, b, adv, tmp_path)
    loss_v32, grad_v32, _ = X.lab_loss(GRPO.replace(kl_importance_correction=True), b, adv, num_sequences=X.B)
    loss_l, grad_l, _ = X.lab_loss(GRPO, b, adv, num_sequences=X.B)
    assert abs(float(loss_v32 - loss_t)) <= X.TOL and float((grad_v32 - grad_t).abs().max()) <= X.TOL
    assert float((grad_l - grad_t).abs().max()) > 1e-6


def test_trl_cispo_cap_is_absolute(tmp_path):
    """TRL's epsilon_high for cispo is the cap itself: verl's relative 0.28 there would cap weights at 0.28."""
    alt = CISPO.replace(aggregation="token_mean", dynamic_sampling=False)
    b = X.batch()
    adv = X.advantages(alt, b["rewards"])
    kw = E.to_trl(alt, **X.BUDGET)
    assert kw["epsilon_high"] == pytest.approx(1.28)
    _, grad_ok = trl_loss(kw, b, adv, tmp_path)
    _, grad_rel = trl_loss({**kw, "epsilon_high": 0.28}, b, adv, tmp_path)
    _, grad_l, _ = X.lab_loss(alt, b, adv)
    assert float((grad_l - grad_ok).abs().max()) <= X.TOL
    assert float((grad_l - grad_rel).abs().max()) > 1e-3


def test_trl_dapo_alternative_with_two_minibatches_is_not_exact():
    """The export refuses the case where TRL's dapo normaliser is the mean minibatch token count."""
    alt = DAPO.replace(aggregation="token_mean", dynamic_sampling=False)
    with pytest.raises(E.ExportError, match="minibatches"):
        E.to_trl(alt, **{**X.BUDGET, "prompts_per_step": 2, "minibatches": 2})


def test_trl_hard_codes_the_advantage_epsilon():
    """TRL's advantage is inside generation; its epsilon is the literal 1e-4 the export assumes."""
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "advantages = advantages / (std_rewards + 1e-4)" in src
    assert E.TRL_ADV_EPS == 1e-4 == GRPO.adv_eps


def test_trl_soft_overlong_punishment_is_dapos(tmp_path):
    """trl_reward_funcs(DAPO) is TRL's own reward function; it equals grpo_lab's Eq. 13 at every length."""
    for budget in (10, 32, 20480):
        (fn,) = E.trl_reward_funcs(DAPO, max_new_tokens=budget)
        cache = overlong_cache_tokens(DAPO, budget)
        lengths = sorted({0, 1, budget - cache - 1, budget - cache, budget - cache + 1, budget - 1, budget,
                          budget + 1})
        got = fn([[7] * n for n in lengths])
        want = overlong_penalty(lengths, max_len=budget, cache_len=cache).tolist()
        assert got == pytest.approx(want, abs=1e-7)  # grpo_lab returns float32
        assert min(got) == -1.0 and max(got) == 0.0
    assert E.trl_reward_funcs(GRPO, max_new_tokens=32) == []
