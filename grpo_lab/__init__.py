"""grpo_lab: the GRPO family of RL algorithms for LLMs as pure, tested tensor functions.

The package is in wings, each importing only the ones before it:
``algo`` (the algorithms: ``from grpo_lab.algo import GRPO, policy_loss``) < ``policy`` (models,
rollouts) < ``tasks`` < ``training`` (``Trainer``, ``TrainerConfig``) < ``export`` (TRL / verl) <
``experiments`` (multi-seed runs, results) < ``cli`` (``python -m grpo_lab``) < ``lab`` (the book's
bench, not the library's API). Import the wings you need; importing the package itself is cheap and
pulls in no model code.
"""

__version__ = "0.3.1"

import importlib.abc as _abc
import sys as _sys

#: 0.1.0's module paths that 0.2.0 moved or removed, and what to import instead (CHANGELOG.md): importing an
#: old path fails with a ``ModuleNotFoundError`` that names the new one. Nothing is re-exported under an old name.
MOVED = {
    "grpo_lab.algorithms": "grpo_lab.algo.algorithms (or grpo_lab.algo)",
    "grpo_lab.objectives": "grpo_lab.algo.objectives", "grpo_lab.advantages": "grpo_lab.algo.advantages",
    "grpo_lab.rewards": "grpo_lab.algo.rewards", "grpo_lab.hparams": "grpo_lab.algo.hparams",
    "grpo_lab.metrics": "grpo_lab.algo.metrics", "grpo_lab.sampling": "grpo_lab.algo.selection",
    "grpo_lab.validation": "grpo_lab.algo.checks",
    "grpo_lab.models": "grpo_lab.policy.models", "grpo_lab.lora": "grpo_lab.policy.lora",
    "grpo_lab.moe": "grpo_lab.policy.moe", "grpo_lab.logprobs": "grpo_lab.policy.logprobs",
    "grpo_lab.rollout": "grpo_lab.policy.rollout",
    "grpo_lab.trainer": "grpo_lab.training (Trainer, TrainerConfig) or grpo_lab.training.trainer",
    "grpo_lab.evaluation": "grpo_lab.experiments.evaluation", "grpo_lab.stats": "grpo_lab.experiments.stats",
    "grpo_lab.plotting": "grpo_lab.experiments.plotting", "grpo_lab.memory_model": "grpo_lab.experiments.memory_model",
    "grpo_lab.run_config": "grpo_lab.experiments.config_files", "grpo_lab.cli_report": "grpo_lab.cli.report",
    "grpo_lab.book": "grpo_lab.lab.book", "grpo_lab.pretrain": "grpo_lab.lab.pretrain",
    "grpo_lab.decision_tree": "grpo_lab.lab.decision_tree", "grpo_lab.variant_records": "grpo_lab.lab.variant_records",
    "grpo_lab.experiments.gpu_runs": "grpo_lab.lab.gpu_runs", "grpo_lab.experiments.probes": "grpo_lab.lab.probes",
    "grpo_lab.experiments.rpt_gpu": "grpo_lab.lab.rpt_gpu", "grpo_lab.files": "grpo_lab.paths",
    "grpo_lab.mhc": "book/examples/mhc.py (chapter 3's sidebar, not part of the package)",
    "grpo_lab.experiments.__main__": "python -m grpo_lab (the command line)",
}


def _moved(name: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(f"{name} was moved in grpo_lab 0.2.0: use {MOVED[name]} (CHANGELOG.md)", name=name)


class _MovedModules(_abc.MetaPathFinder):
    """Last on ``sys.meta_path``: reached only by an import no other finder resolves."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            raise _moved(fullname)
        return None


if not any(isinstance(f, _MovedModules) for f in _sys.meta_path):
    _sys.meta_path.append(_MovedModules())


def __getattr__(name: str):
    # ``from grpo_lab import algorithms``: name the new path rather than "cannot import name"
    if f"grpo_lab.{name}" in MOVED:
        raise _moved(f"grpo_lab.{name}")
    raise AttributeError(f"module 'grpo_lab' has no attribute {name!r}")
