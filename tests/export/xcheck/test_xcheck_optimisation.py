"""The exported optimisation against the libraries' own optimiser and scheduler code (grpo_lab issue 33).

TRL: ``trl.GRPOConfig(**to_trl(preset, **budget_from_config(cfg)))`` handed to transformers' ``Trainer`` (TRL's
``GRPOTrainer`` inherits ``create_optimizer_and_scheduler`` from it unchanged), which builds its AdamW and
scheduler on a tiny grpo_lab policy as a TRL run would; stepped ``H`` times, its learning rates are grpo_lab's
(:func:`grpo_lab.training.lr_schedule.policy_lr`), its betas, weight decay and decayed parameters those of the
grpo_lab trainer's AdamW. verl: the overrides composed with verl's ``ppo_trainer.yaml`` by Hydra, the horizon
written into the optimiser config as verl's trainer does, and the scheduler built by verl's own FSDP engine code.
Marker ``xcheck``; ``make xcheck`` (which fails rather than skips when the pinned libraries are missing).
"""

import os
from types import SimpleNamespace

import pytest
import torch

from grpo_lab import export as E
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.policy.models import TinyConfig, build_char_tokenizer, tiny_policy
from grpo_lab.training.adamw import build_adamw
from grpo_lab.training.lr_schedule import lr_lambda, policy_lr, schedule_updates
from grpo_lab.training.trainer import TrainerConfig

import _xcheck_common as X

pytestmark = [pytest.mark.xcheck, pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")]

try:
    import trl
except ImportError as exc:
    X.unavailable(f"trl does not import ({exc}); pip install '.[xcheck]', see make xcheck")
X.require_version("trl", trl.__version__, E.TRL_VERSION)
from trl import GRPOConfig  # noqa: E402
from transformers import Trainer  # noqa: E402

TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)
#: (schedule, warm-up, RL steps, minibatches, epochs): every schedule, with and without a warm-up
CASES = [("constant", 3, 4, 2, 1), ("linear", 2, 5, 1, 2), ("cosine", 3, 4, 2, 1), ("cosine", 0, 6, 1, 1)]


def config(schedule, warmup, steps, minibatches, epochs, **kw):
    return TrainerConfig(lr=1e-3, warmup=warmup, lr_schedule=schedule, lr_schedule_steps=steps, minibatches=minibatches,
                         epochs=epochs, prompts_per_step=2, group_size=4, weight_decay=0.1, betas=(0.9, 0.95), **kw)


@pytest.mark.parametrize("case", CASES)
def test_trl_trains_with_grpo_labs_lr_sequence_betas_and_decay(case, tmp_path):
    cfg = config(*case)
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                      **E.to_trl(GRPO, **E.budget_from_config(cfg)))
    policy = tiny_policy(build_char_tokenizer(), TINY, seed=0)
    trainer = Trainer(model=policy, args=args)
    horizon = schedule_updates(cfg)
    assert args.max_steps == horizon
    trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)  # what Trainer.train does
    opt, sched = trainer.optimizer, trainer.lr_scheduler
    lrs = []
    for _ in range(horizon):  # the training loop: an update at the current lr, then scheduler.step()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    transformers_convention = [cfg.lr * lr_lambda(cfg.lr_schedule, cfg.warmup, horizon)(k) for k in range(horizon)]
    assert lrs == pytest.approx(transformers_convention, rel=1e-12, abs=0)
    ours = build_adamw(policy, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas)
    decayed = {(g["weight_decay"], frozenset(map(id, g["params"]))) for g in opt.param_groups if g["params"]}
    assert decayed == {(g["weight_decay"], frozenset(map(id, g["params"]))) for g in ours.param_groups}
    assert {tuple(g["betas"]) for g in opt.param_groups} == {cfg.betas}
    assert not args.bf16 and not args.fp16
    assert lrs == pytest.approx([policy_lr(cfg, k) for k in range(horizon)], rel=1e-12, abs=0)


@pytest.mark.parametrize("precision,bf16,fp16", [("bfloat16", True, False), ("float16", False, True),
                                                 ("float32", False, False)])
def test_trl_precision_flags(precision, bf16, fp16, tmp_path):
    kw = E.to_trl(GRPO, **E.budget_from_config(config("constant", 0, 2, 1, 1, precision=precision)))
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, **kw)
    assert (args.bf16, args.fp16) == (bf16, fp16)  # TRL's bf16=True default overridden for float32


# ------------------------------------------------------------------------------------------- verl
def verl_scheduler(overrides: list, optimizer):
    """verl's composed actor optimiser config and the scheduler its FSDP engine builds from it."""
    try:
        import hydra  # noqa: F401
        import verl
        from hydra import compose, initialize_config_dir
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.engine.fsdp.transformer_impl import FSDPEngine
    except Exception as exc:  # noqa: BLE001 - any import failure means the check cannot run
        X.unavailable(f"verl's FSDP engine / hydra do not import ({type(exc).__name__}: {exc})")
    X.require_version("verl", verl.__version__, E.VERL_VERSION)
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    cfg.actor_rollout_ref.actor.optim.total_training_steps = cfg.trainer.total_training_steps  # as RayPPOTrainer
    optim = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.optim)
    engine = SimpleNamespace(optimizer_config=optim, rank=1)  # what _build_lr_scheduler reads
    return cfg, optim, FSDPEngine._build_lr_scheduler(engine, optimizer)


@pytest.mark.parametrize("schedule,warmup,steps", [("constant", 3, 6), ("cosine", 2, 7), ("cosine", 0, 5)])
def test_verl_builds_grpo_labs_schedule_betas_and_precision(schedule, warmup, steps):
    cfg = config(schedule, warmup, steps, 1, 1, precision="bfloat16")  # one update per RL step: exact in verl
    with pytest.warns(E.ApproximateExportWarning, match="decays every parameter"):
        tr = E.translate(GRPO.replace(adv_eps=1e-6), "verl", strict=False, **E.budget_from_config(cfg))
    assert [i.axis for i in tr.issues] == ["weight_decay"]  # verl decays every parameter
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=cfg.lr)
    composed, optim, sched = verl_scheduler(list(tr.config), opt)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([cfg.lr * lr_lambda(schedule, warmup, steps)(k) for k in range(steps)], rel=1e-12,
                                abs=0)
    assert lrs[0] == (0.0 if warmup else cfg.lr)  # transformers' convention: a warm-up starts at 0
    assert tuple(optim.betas) == cfg.betas and optim.weight_decay == cfg.weight_decay and optim.clip_grad == 1.0
    actor = composed.actor_rollout_ref.actor.fsdp_config
    assert actor.mixed_precision.param_dtype == "bf16" and actor.model_dtype == "fp32"
    assert lrs == pytest.approx([policy_lr(cfg, k) for k in range(steps)], rel=1e-12, abs=0)
