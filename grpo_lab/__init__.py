"""grpo_lab: the GRPO family of RL algorithms for LLMs as pure, tested tensor functions.

The package is in wings, each importing only the ones before it:
``algo`` (the algorithms: ``from grpo_lab.algo import GRPO, policy_loss``) < ``policy`` (models,
rollouts) < ``tasks`` < ``training`` (``Trainer``, ``TrainerConfig``) < ``export`` (TRL / verl) <
``experiments`` (multi-seed runs, results) < ``cli`` (``python -m grpo_lab``) < ``lab`` (the book's
bench, not the library's API). Import the wings you need; importing the package itself is cheap and
pulls in no model code.
"""

__version__ = "0.2.0"
