"""The reward-function contract and the metric names against TRL 1.16.0 and verl 0.9.1 themselves (marker
``xcheck``; ``make xcheck``), issue 54:

* TRL's own soft overlong punishment (DAPO's, ``trl.rewards.get_soft_overlong_punishment``) used unchanged as a
  DatasetTask reward function gives the values of its formula on the *sampled* lengths (EOS included), as in
  TRL, where ``completion_ids`` are the generated ids;
* every key ``metric_names="trl"`` / ``"verl"`` logs under is one TRL's ``GRPOTrainer`` / verl's trainer logs,
  read from their installed source.
"""

import inspect
import re
import warnings
from pathlib import Path

import datasets
import pytest

from grpo_lab.algo.algorithms import GRPO
from grpo_lab.paths import checkpoint_dir
from grpo_lab.policy.models import load_policy
from grpo_lab.tasks import DatasetTask
from grpo_lab.training.callbacks import TRL_METRIC_NAMES, VERL_METRIC_NAMES
from grpo_lab.training.trainer import Trainer, TrainerConfig

pytestmark = [pytest.mark.xcheck]

trl = pytest.importorskip("trl", reason="xcheck: trl is not installed (pip install '.[xcheck]', see make xcheck)")
verl = pytest.importorskip("verl", reason="xcheck: verl is not installed")
from trl.rewards import get_soft_overlong_punishment  # noqa: E402


def test_trls_soft_overlong_punishment_sees_the_sampled_ids():
    seen = []

    def spy(completions, completion_ids, **kwargs):
        seen.extend(completion_ids)
        return [0.0] * len(completions)

    punish = get_soft_overlong_punishment(max_completion_len=6, soft_punish_cache=3)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10, 16) for b in range(10, 16)]
    policy, tok = load_policy(checkpoint_dir("arithmetic-base"))
    task = DatasetTask(datasets.Dataset.from_list(rows), [punish, spy], max_new_tokens=6)
    cfg = TrainerConfig(prompts_per_step=4, group_size=3, max_new_tokens=6, eval_every=0, progress=False, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        h = Trainer(policy, tok, task, GRPO, cfg).train(1)
    lengths = [len(ids) for ids in seen]
    assert sum(lengths) / len(lengths) == pytest.approx(h["length"].item())  # EOS included, as sampled

    def dapo(n, L=6, cache=3):  # DAPO Eq. 13, by hand
        return 0.0 if n <= L - cache else (L - cache - n) / cache if n <= L else -1.0

    want = [dapo(n) for n in lengths]
    assert punish(completion_ids=seen) == pytest.approx(want)
    assert h["rewards/soft_overlong_punishment_reward/mean"].item() == pytest.approx(sum(want) / len(want))
    assert any(w != 0 for w in want)  # the penalty acts on some row, so an off-by-one length would show


def _source(module) -> str:
    return Path(inspect.getfile(module)).read_text()


def test_trl_names_are_grpo_trainers_metric_keys():
    from trl.trainer import grpo_trainer

    src = _source(grpo_trainer)
    keys = set(re.findall(r'_metrics\[mode\]\["([^"]+)"\]', src))
    assert {"reward", "reward_std", "num_tokens", "kl", "entropy", "frac_reward_zero_std"} <= keys
    assert 'f"rewards/{reward_func_name}/mean"' in src and 'f"rewards/{reward_func_name}/std"' in src
    ours = set(TRL_METRIC_NAMES.values()) - {"num_loss_tokens"}  # grpo_lab's num_tokens, renamed out of TRL's way
    logged = {"learning_rate", "grad_norm", "loss"}  # transformers.Trainer's own log keys
    assert ours - logged <= keys, sorted(ours - logged - keys)


def test_verl_names_are_verls_metric_keys():
    root = Path(verl.__file__).parent  # read, not imported (ray_trainer needs torchdata, not in the xcheck venv)

    def src(rel):
        return (root / rel).read_text()

    literal = set()
    for rel in ("trainer/ppo/metric_utils.py", "trainer/ppo/core_algos.py", "trainer/ppo/ray_trainer.py",
                "workers/utils/losses.py"):
        literal |= set(re.findall(r'"((?:actor|critic|response_length)/[A-Za-z_/]+)"', src(rel)))
    # the workers' own keys, prefixed "actor/" by ray_trainer (rename_dict(actor_output, "actor/"))
    assert 'rename_dict(actor_output, "actor/")' in src("trainer/ppo/ray_trainer.py")
    workers = src("workers/utils/losses.py") + src("workers/engine_workers.py")
    worker = set(re.findall(r'metrics\["([a-z_]+)"\]', workers))
    known = literal | {f"actor/{k}" for k in worker}
    missing = sorted(set(VERL_METRIC_NAMES.values()) - known)
    assert not missing, missing
