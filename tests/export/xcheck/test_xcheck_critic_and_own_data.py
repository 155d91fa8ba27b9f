"""Issue 54: PPO's verl export composes and validates with verl's Hydra config (critic on), our GAE equals verl's
``compute_gae_advantage_return`` in float64 (verl then whitens), and a DatasetTask's TRL job trains 2 steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from grpo_lab import export as E
from grpo_lab.algo.advantages import gae, outcome_token_rewards
from grpo_lab.algo.algorithms import GRPO, PPO

pytestmark = pytest.mark.xcheck

verl = pytest.importorskip("verl")
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.utils import torch_functional as verl_F  # noqa: E402


def test_our_gae_is_verls_before_its_whitening():
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.float64)
    values = torch.randn(3, 6, generator=g, dtype=torch.float64) * mask
    rewards = outcome_token_rewards(torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64), mask)
    adv, ret = gae(rewards, values, mask, gamma=0.99, lam=0.9)
    v_adv, v_ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma=0.99, lam=0.9)
    real = mask.bool()
    adv, ret = adv.double(), ret.double()  # our gae computes in float32; verl in the inputs' float64
    torch.testing.assert_close(ret[real], v_ret[real], rtol=0, atol=1e-6)
    torch.testing.assert_close(verl_F.masked_whiten(adv, mask)[real], v_adv[real], rtol=0, atol=1e-5)
    assert not torch.allclose(adv[real], v_adv[real])  # the whitening is the difference the export names


def test_ppo_job_composes_and_passes_verls_validation(tmp_path):
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = E.verl_job(PPO, "arithmetic", "arithmetic-base", tmp_path / "job", steps=2, nnodes=1, n_gpus_per_node=2,
                         group_size=2, prompts_per_step=4, strict=False, lr=1e-6, value_lr=2e-6)
    lines = (out / "overrides.txt").read_text().splitlines()
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        cfg = compose("ppo_trainer", overrides=lines)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert need_critic(cfg) and cfg.algorithm.adv_estimator == "gae" and cfg.critic.optim.lr == 2e-6
    assert cfg.critic.cliprange_value == 0.2 and cfg.critic.model.path == cfg.actor_rollout_ref.model.path
    assert cfg.critic.loss_agg_mode == "token-mean"


@pytest.mark.slow
def test_dataset_task_trl_job_trains_two_steps_with_one_column_per_function(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "rw54x.py").write_text("def acc(prompts, completions, solution, **kw):\n"
                                  "    return [float(s in c) for c, s in zip(completions, solution)]\n"
                                  "def fmt(completions, **kw):\n    return [0.1 if c else None for c in completions]\n")
    (src / "d.jsonl").write_text("".join(json.dumps({"q": f"{a}+1=", "solution": str(a + 1)}) + "\n"
                                         for a in range(30)))
    sys.path.insert(0, str(src))
    try:
        from grpo_lab.tasks import DatasetTask

        task = DatasetTask(data=str(src / "d.jsonl"), reward_funcs=("rw54x:acc", "rw54x:fmt"), prompt_column="q",
                           answer_column="solution", reward_weights=(1.0, 0.5), test_size=5, max_new_tokens=4)
        job = E.trl_job(GRPO, task, "arithmetic-base", tmp_path / "job", steps=2, group_size=2, prompts_per_step=2,
                        strict=False)
    finally:
        sys.path.remove(str(src))
    moved = tmp_path / "moved"
    job.rename(moved)  # nothing of the job points back to src or to its first directory
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p != str(src)), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(moved / "train.py"), "--cpu", "--max-steps", "2"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

    logged = proc.stdout + proc.stderr
    assert "rewards/acc/mean" in logged and "rewards/fmt/mean" in logged, logged[-2000:]
