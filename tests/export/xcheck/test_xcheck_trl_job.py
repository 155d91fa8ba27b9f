"""The TRL job of ``grpo_lab.export.trl_job`` runs end to end in TRL, and its first step's loss is grpo_lab's.

The job (GRPO on the arithmetic task, the shipped tiny checkpoint ``arithmetic-base``) is written to a
temporary directory and its ``train.py`` run in a subprocess, as ``python train.py --cpu --max-steps 2``
runs it (``runpy.run_path`` under ``__main__``), with three methods of ``trl.GRPOTrainer`` wrapped to
record what TRL computed, unchanged: the rewards (``_calculate_rewards``), and, per loss call
(``_compute_loss``), its inputs (completion mask, advantages, reference log-probs), the policy's
log-probs it computed (``_get_per_token_logps_and_entropies``), its loss and that loss's gradient with
respect to those log-probs. The test then recomputes, on those very tensors, grpo_lab's advantages
(``GRPO.advantages`` of TRL's rewards) and ``policy_loss`` and its gradient: equal in float32. On policy
(one optimiser step per generation) the loss value is ``-mean(A) + beta KL``, near 0; the gradient,
``-A_i / (|o_i| G)`` per token, is what tells aggregation and advantage apart.
Marker ``xcheck``; ``make xcheck``.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from grpo_lab import export as E
from grpo_lab.algo.algorithms import GRPO
from grpo_lab.algo.objectives import policy_loss

pytestmark = [pytest.mark.xcheck, pytest.mark.slow]

trl = pytest.importorskip("trl", reason="xcheck: trl is not installed (pip install '.[xcheck]', see make xcheck)")
if trl.__version__ != E.TRL_VERSION:
    pytest.skip(f"xcheck: the TRL mapping was read from trl {E.TRL_VERSION}, installed {trl.__version__}",
                allow_module_level=True)

G, PROMPTS, MAX_NEW_TOKENS, STEPS = 4, 2, 32, 2

#: run train.py as `python train.py --cpu --max-steps 2` does, recording what TRL computes (nothing changed)
DRIVER = textwrap.dedent('''
    import json, runpy, sys
    import torch, trl

    job, out = sys.argv[1], sys.argv[2]
    T = trl.GRPOTrainer
    calc, comp, logps = T._calculate_rewards, T._compute_loss, T._get_per_token_logps_and_entropies
    gen = T._generate_and_score_completions
    seen = {"rewards": [], "batches": [], "steps": []}

    def generated(self, *args, **kwargs):
        batch = gen(self, *args, **kwargs)
        seen["batches"].append({k: v.detach().clone() for k, v in batch.items() if torch.is_tensor(v)})
        return batch

    def rewards(self, *args, **kwargs):
        value = calc(self, *args, **kwargs)
        seen["rewards"].append(value.detach().clone())
        seen["trainer"] = self
        return value

    def loss(self, model, inputs):
        calls = []

        def recorded(*args, **kwargs):
            result = logps(self, *args, **kwargs)
            calls.append(result[0])
            return result

        self._get_per_token_logps_and_entropies = recorded
        try:
            value = comp(self, model, inputs)
        finally:
            del self._get_per_token_logps_and_entropies
        grad, = torch.autograd.grad(value, calls[0], retain_graph=True)
        seen["steps"].append({"loss": value.detach().clone(), "logp": calls[0].detach().clone(), "grad": grad,
                              **{k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)}})
        return value

    T._calculate_rewards, T._compute_loss, T._generate_and_score_completions = rewards, loss, generated
    sys.argv = [job + "/train.py", "--cpu", "--max-steps", "2", "--output-dir", out]
    runpy.run_path(job + "/train.py", run_name="__main__")
    torch.save({k: seen[k] for k in ("rewards", "batches", "steps")}, out + "/recorded.pt")
    with open(out + "/log_history.json", "w") as fh:
        json.dump(seen["trainer"].state.log_history, fh)
''')


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Write the job, run it for 2 steps on the CPU: ``(job dir, output dir, recorded tensors, log history)``."""
    root = tmp_path_factory.mktemp("trl_job")
    job = E.trl_job(GRPO, "arithmetic", "arithmetic-base", root / "job", steps=50, group_size=G,
                    prompts_per_step=PROMPTS, max_new_tokens=MAX_NEW_TOKENS)
    (root / "driver.py").write_text(DRIVER)
    out = root / "output"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(root / "driver.py"), str(job), str(out)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-4000:]
    recorded = torch.load(out / "recorded.pt", weights_only=False)
    return job, out, recorded, json.loads((out / "log_history.json").read_text())


def test_the_trl_job_trains_two_steps_and_logs_them(run):
    _, out, recorded, history = run
    steps = [h for h in history if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2]
    assert all("rewards/arithmetic/mean" in h and 0.0 <= h["rewards/arithmetic/mean"] <= 1.0 for h in steps)
    assert history[-1].get("train_runtime", 0) > 0 and (out / "model.safetensors").is_file()
    assert len(recorded["steps"]) == STEPS and all(r.shape == (G * PROMPTS, 1) for r in recorded["rewards"])


def order(batch: dict, rec: dict) -> torch.Tensor:
    """The rows of the generated ``batch`` in the order the loss saw them (TRL shuffles the generation batch
    before it splits it into steps: ``shuffle_sequence_dict``); identical rows are interchangeable."""
    key = lambda d: [tuple(r) for r in torch.cat([d["prompt_ids"], d["completion_ids"]], 1).tolist()]  # noqa: E731
    free, perm = key(batch), []
    for row in key(rec):
        j = next(i for i, r in enumerate(free) if r == row)
        free[j] = None
        perm.append(j)
    return torch.tensor(perm)


@pytest.mark.parametrize("step", range(STEPS))
def test_trls_loss_is_grpo_labs_on_the_same_batch(run, step):
    _, _, recorded, _ = run
    rec, batch, rewards = recorded["steps"][step], recorded["batches"][step], recorded["rewards"][step][:, 0]
    adv = GRPO.advantages(rewards, G)  # groups of G consecutive rows, as TRL generates them
    mixed = bool(adv.abs().max() > 0)  # a group of mixed rewards
    assert mixed or step > 0  # the first batch has one (seeded, deterministic): the gradient has a policy part
    torch.testing.assert_close(adv, batch["advantages"], rtol=1e-5, atol=1e-6)  # TRL's advantages are grpo_lab's
    perm = order(batch, rec)
    mask = rec["completion_mask"].to(torch.float32)
    logp = rec["logp"].clone().requires_grad_()
    old = rec.get("old_per_token_logps", rec["logp"])
    out = policy_loss(logp, old, adv[perm], mask, GRPO, ref_logp=rec["ref_per_token_logps"],
                      max_tokens=MAX_NEW_TOKENS, group_size=G)
    out.loss.backward()
    assert abs(float(out.loss.detach() - rec["loss"])) < 1e-6
    assert float((logp.grad * mask - rec["grad"] * mask).abs().max()) < 1e-6
    assert float(rec["grad"].abs().max()) > (1e-3 if mixed else 0.0)  # the gradient compared is not zero
