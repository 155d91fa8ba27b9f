"""Profiles: the scale of an experiment, by name.

:class:`~grpo_lab.experiments.Profile` fixes the base checkpoint, the task, the step count and the
trainer configuration; ``PROFILES`` holds the ``"cpu"`` profile the book executes and the defaults
of the ``"gpu"`` one, which :func:`~grpo_lab.experiments.gpu_profile` builds (a hub instruct model
on GSM8K, the settings read from ``$GRPO_LAB_GPU_*``) and
:func:`~grpo_lab.experiments.expected_gpu_minutes` prices. The names are documented, and
imported by users, under :mod:`grpo_lab.experiments`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..policy.lora import LoraSpec
from .config_files import check_fields, read_config_file
from ..training.trainer import TrainerConfig
from ..algo.checks import is_int

__all__ = ["Profile", "PROFILES", "GPU_MODEL", "GPU_GSM8K_SOURCE", "GPU_TEST_SIZE", "gpu_profile", "get_profile",
           "GPU_SPEEDS", "expected_gpu_minutes", "COLAB_SEEDS", "COLAB_T4_MEMORY", "COLAB_SETUP_MINUTES", "colab_profile",
           "colab_minutes"]


@dataclass(frozen=True)
class Profile:
    """The scale of an experiment.

    Attributes:
        name: ``"cpu"`` or ``"gpu"`` (any label for a profile of your own).
        base: checkpoint name under ``data/checkpoints`` (or a hub id / path).
        task: the *name* of a registered task (a key of :data:`grpo_lab.tasks.TASKS`), not a task
            object: every run, in worker processes too, builds ``get_task(task, **dict(task_kwargs))``.
        steps: RL steps per seed.
        config: the :class:`~grpo_lab.training.trainer.TrainerConfig`.
        task_kwargs: the task's keyword arguments, a dict or ``(key, value)`` pairs, stored as a tuple
            of pairs sorted by key (equal arguments, equal hashes).
        lora: LoRA adapters to train instead of the whole model (:class:`grpo_lab.policy.lora.LoraSpec`
            or a dict, stored as a ``LoraSpec``; put on the base with each run's seed); ``None``: full
            fine-tuning.

    Raises:
        TypeError: ``task`` is not a ``str`` (the message says how to name a task object), or
            ``task_kwargs`` is neither a mapping nor ``(key, value)`` pairs with ``str`` keys, or
            ``lora`` is neither ``None``, a ``LoraSpec`` nor a dict.
        ValueError: ``task`` is empty, a key repeats in ``task_kwargs``, or ``lora`` has a bad value.
    """

    name: str
    base: str
    task: str
    steps: int
    config: TrainerConfig
    task_kwargs: tuple = ()
    lora: LoraSpec | None = None

    def __post_init__(self):
        if not isinstance(self.task, str):
            raise TypeError(f"Profile: task must be the name (str) of a registered task, got {self.task!r}; "
                            f"{_task_fix(self.task)}")
        if not self.task.strip():
            raise ValueError("Profile: task must be the name of a registered task, got an empty string")
        object.__setattr__(self, "task_kwargs", _task_kwargs(self.task_kwargs))
        object.__setattr__(self, "lora", LoraSpec.from_value(self.lora))


def _task_fix(task: Any) -> str:
    """How to pass the task object ``task`` to :class:`Profile` or :func:`run` instead: register its
    class and give its name, its arguments (the dataclass fields that differ from their defaults) in
    ``task_kwargs``."""
    import dataclasses

    name = getattr(task, "name", None)
    name = name if isinstance(name, str) and name else "mytask"
    cls = task.__name__ if isinstance(task, type) else type(task).__name__
    kwargs = "{...}"
    if dataclasses.is_dataclass(task) and not isinstance(task, type):
        changed = {}
        for f in dataclasses.fields(task):
            if f.name == "name" or not f.init:
                continue
            value = getattr(task, f.name)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if default is dataclasses.MISSING or value != default:
                changed[f.name] = value
        kwargs = repr(changed)
    return (f"register the class (grpo_lab.tasks.register_task({name!r}, {cls})) and pass its name and arguments: "
            f"task={name!r}, task_kwargs={kwargs}")


def _task_kwargs(value: Any) -> tuple:
    """``Profile.task_kwargs`` as a tuple of ``(key, value)`` pairs sorted by key; from a mapping or pairs.

    Raises:
        TypeError: not a mapping or pairs, or a key that is not a ``str``. ValueError: a key repeats.
    """
    if isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        try:
            pairs = [tuple(kv) for kv in value]
        except TypeError:
            pairs = None
        if isinstance(value, (str, bytes)) or pairs is None or any(len(kv) != 2 for kv in pairs):
            raise TypeError(f"Profile: task_kwargs must be a dict such as {{'max_len': 4}} or (key, value) pairs "
                            f"such as (('max_len', 4),), got {value!r}")
    keys = [k for k, _ in pairs]
    bad = [k for k in keys if not isinstance(k, str)]
    if bad:
        raise TypeError(f"Profile: task_kwargs keys must be argument names (str), got {bad!r}")
    if len(set(keys)) != len(keys):
        twice = sorted(k for k in set(keys) if keys.count(k) > 1)
        raise ValueError(f"Profile: task_kwargs names an argument twice: {twice}")
    return tuple(sorted(pairs, key=lambda kv: kv[0]))


# PROFILES: documented where it is exported, in grpo_lab/experiments/__init__.py.
PROFILES = {
    # One thread per run, two runs at a time on two cores (the book's n_jobs=2): the tiny model gains
    # little from more threads, and a fixed count keeps the numbers identical on machines with more
    # cores. Micro-batches of 32 rows, cut in order of length (TrainerConfig.sort_by_length): the
    # same gradient as whole 64-row minibatches, with less padding.
    "cpu": Profile(
        name="cpu", base="arithmetic-base", task="arithmetic", steps=40,
        config=TrainerConfig(prompts_per_step=16, group_size=8, lr=3e-4, warmup=10, minibatches=2, epochs=1,
                             micro_batch_size=32, eval_every=5, threads=1, device="cpu"),
    ),
}


# GPU_MODEL: documented where it is exported, in grpo_lab/experiments/__init__.py.
GPU_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


# GPU_GSM8K_SOURCE: documented where it is exported, in grpo_lab/experiments/__init__.py.
GPU_GSM8K_SOURCE = "hub"


# GPU_TEST_SIZE: documented where it is exported, in grpo_lab/experiments/__init__.py.
GPU_TEST_SIZE = 500


def gpu_profile(model: str | os.PathLike | None = None, *, source: str | os.PathLike | None = None,
                test_size: int | None = GPU_TEST_SIZE, steps: int = 60, environ: Mapping[str, str] | None = None,
                lora: LoraSpec | Mapping[str, Any] | None = None, gpu_memory: int | bool | None = None,
                max_new_tokens: int | None = None, **config: Any) -> Profile:
    """The ``"gpu"`` profile: a hub instruct model trained on GSM8K on one CUDA GPU.

    The model is loaded in float32 and trained with ``precision="auto"`` on :class:`grpo_lab.tasks.gsm8k.GSM8KTask`
    in its chat template, a 512-token budget: 16 questions × G = 8 per step, two minibatches per rollout, lr 1e-6
    (DeepSeekMath §4.2, DAPO §4.1) after 5 warm-up updates, greedy test accuracy every 10 steps (wall time:
    :func:`expected_gpu_minutes`). On CUDA, batch sizes the user did not choose are fitted to the card
    (:func:`grpo_lab.experiments.memory_fit.fit_gpu_config`).

    Args:
        model: a hub id or local hub-layout directory; ``None``: ``$GRPO_LAB_GPU_MODEL`` or :data:`GPU_MODEL`.
        source: GSM8K's source; ``None``: ``$GRPO_LAB_GSM8K_SOURCE`` or :data:`GPU_GSM8K_SOURCE`.
        test_size, steps: the first this many test problems of the hub source (``None``: all); RL steps per seed.
        environ: where the ``$GRPO_LAB_GPU_*`` variables are read (default ``os.environ``; ``{}`` ignores them).
        lora: LoRA adapters instead of full fine-tuning (:attr:`Profile.lora`); the KL reference is then the base
            (pass a larger ``lr`` too).
        gpu_memory: the card's memory in bytes to fit to; ``None``: the CUDA device's; ``False``: no fit.
        max_new_tokens: the generation budget in tokens: the task's, and when given also
            ``TrainerConfig.max_new_tokens`` (as a ``TrainerConfig`` field of that name was before); ``None``: 512 for the
            task, the config's unset.
        **config: :class:`~grpo_lab.training.trainer.TrainerConfig` fields over the above, applied after
            ``$GRPO_LAB_GPU_CONFIG`` (a YAML / JSON file, parsed); ``device``: ``$GRPO_LAB_GPU_DEVICE`` or
            ``"cuda"`` (``"cpu"``: a dry run).

    Returns:
        A :class:`Profile` named ``"gpu"``.

    Raises:
        ValueError: an empty ``model`` or ``source``, an invalid ``TrainerConfig`` field, a bad
            ``$GRPO_LAB_GPU_CONFIG`` or ``lora``; a phase the memory model says will not fit (named, with a fix).
    """
    env_ = os.environ if environ is None else environ
    if max_new_tokens is not None:
        config.setdefault("max_new_tokens", int(max_new_tokens))
    max_new_tokens = 512 if max_new_tokens is None else int(max_new_tokens)
    model = str(model if model is not None else env_.get("GRPO_LAB_GPU_MODEL") or GPU_MODEL)
    source = str(source if source is not None else env_.get("GRPO_LAB_GSM8K_SOURCE") or GPU_GSM8K_SOURCE)
    if not model.strip() or not source.strip():
        raise ValueError(f"gpu_profile: model and source must be non-empty, got {model!r} and {source!r}")
    settings = dict(prompts_per_step=16, group_size=8, temperature=1.0, lr=1e-6, warmup=5, minibatches=2,
                    epochs=1, micro_batch_size=4, eval_every=10, eval_batch_size=64,
                    device=env_.get("GRPO_LAB_GPU_DEVICE") or "cuda", precision="auto")
    settings.update(config.pop("_defaults", {}))  # rpt_gpu_profile's own defaults, before the environment
    env = env_.get("GRPO_LAB_GPU_CONFIG")
    if env:
        extra = _gpu_config_fields(env)
        settings.update(extra)
    explicit = set(extra if env else ()) | set(config)
    settings.update(config)
    task_kwargs = {"source": source, "tokenizer_name": model, "max_new_tokens": int(max_new_tokens),
                   "test_size": test_size if source == "hub" else None}
    given = {k: env_[k] for k in ("GRPO_LAB_GPU_DEVICE", "GRPO_LAB_GPU_CONFIG") if env_.get(k)}
    cfg = _gpu_config(settings, given)
    if gpu_memory is not False:
        from .memory_fit import fit_gpu_config

        cfg = fit_gpu_config(model, cfg, max_new_tokens=int(max_new_tokens), explicit=explicit, total_memory=gpu_memory,
                             lora=LoraSpec.from_value(lora))
    return Profile(name="gpu", base=model, task="gsm8k", steps=steps, config=cfg, task_kwargs=task_kwargs,
                   lora=lora)


def _gpu_config_fields(value: str) -> dict[str, Any]:
    """The :class:`~grpo_lab.training.trainer.TrainerConfig` fields ``$GRPO_LAB_GPU_CONFIG`` gives: the path of a YAML
    (or JSON) file holding a mapping of fields to values, e.g. ``micro_batch_size: 2`` (read with
    :func:`grpo_lab.experiments.config_files.read_config_file`, never evaluated), or, for compatibility with the form it
    had first, an inline JSON object (a value starting with ``{`` or ``[``), e.g. ``{"micro_batch_size": 2}``.

    Raises:
        ValueError: no such file, not YAML / JSON, not a mapping, an unknown field (with a did-you-mean and
            the known fields) or a value of the wrong type; each message names the file or the variable.
    """
    hints = typing.get_type_hints(TrainerConfig)
    known = {f.name: hints[f.name] for f in fields(TrainerConfig)}
    inline = value.lstrip().startswith(("{", "["))
    where = f"$GRPO_LAB_GPU_CONFIG={value!r}" if inline else f"$GRPO_LAB_GPU_CONFIG file {value}"
    try:
        if inline:
            extra = json.loads(value)
            if not isinstance(extra, dict):
                raise ValueError(f"{where} must be a JSON object of TrainerConfig fields")
            unknown = sorted(set(extra) - set(known))
            where += f" (unknown: {unknown})" if unknown else ""
        else:
            extra = read_config_file(value, what="$GRPO_LAB_GPU_CONFIG")
        return check_fields(extra, known, where)
    except json.JSONDecodeError as exc:
        raise ValueError(f"gpu_profile: {where} is not JSON ({exc}); it names a YAML file of TrainerConfig fields, "
                         "or is an inline JSON object") from None
    except ValueError as exc:
        raise ValueError(f"gpu_profile: {exc}") from None


def _gpu_config(settings: dict, given: Mapping[str, str]) -> TrainerConfig:
    """``TrainerConfig(**settings)``; a ValueError names the environment variables among ``given``
    (``$GRPO_LAB_GPU_DEVICE``, ``$GRPO_LAB_GPU_CONFIG``) that were set, since a bad value may come
    from there."""
    try:
        return TrainerConfig(**settings)
    except (TypeError, ValueError) as exc:
        if given:
            where = ", ".join(f"${k}={v!r}" for k, v in given.items())
            raise ValueError(f"gpu_profile: {exc} (the settings include {where})") from None
        raise


PROFILES["gpu"] = gpu_profile(environ={}, gpu_memory=False)  # the defaults; get_profile("gpu") applies the environment


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ``"gpu"`` and ``"colab"`` are built afresh by :func:`gpu_profile` and
    :func:`colab_profile` (so that
    ``$GRPO_LAB_GPU_MODEL`` and ``$GRPO_LAB_GSM8K_SOURCE`` set after import count).

    Raises:
        ValueError: unknown profile.
    """
    if name == "gpu":
        return gpu_profile()
    if name == "colab":
        return colab_profile()
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {sorted(PROFILES)}") from None


# GPU_SPEEDS: documented where it is exported, in grpo_lab/experiments/__init__.py.
GPU_SPEEDS = {
    "T4": {"decode_step_s": 0.045, "train_tokens_per_s": 4_000.0},
    "H100": {"decode_step_s": 0.020, "train_tokens_per_s": 60_000.0},
}


def expected_gpu_minutes(profile: Profile, runs: int, gpu: str, *, steps: int | None = None,
                         prompt_tokens: int = 150, completion_tokens: int = 250,
                         generation_factor: float = 1.0, train_factor: float = 1.0) -> float:
    """Estimated wall time, in minutes, of ``runs`` runs of ``profile`` one after the other on one
    GPU of class ``gpu``, from the assumed speeds of :data:`GPU_SPEEDS`.

    Per step: ``max_new_tokens`` decoding steps (a batch of 128 samples at temperature 1 usually
    has one that uses the whole budget) and ``prompts_per_step × G × (prompt_tokens +
    completion_tokens)`` training tokens; per evaluation (before the first step, every
    ``eval_every`` steps and after the last): ``ceil(test_size / 256)`` greedy batches of
    ``max_new_tokens`` steps, twice that with ``eval_sampled``. An estimate to plan a session with, good to a factor of about two.

    Args:
        profile: the profile (normally :func:`gpu_profile`).
        runs: runs (seeds × settings).
        gpu: a key of :data:`GPU_SPEEDS` (``"T4"``, ``"H100"``).
        steps: RL steps per run (default: the profile's).
        prompt_tokens, completion_tokens: assumed mean prompt and completion lengths in tokens
            (a chat-templated GSM8K question; a Qwen2.5-0.5B-Instruct solution).
        generation_factor: generation per step relative to one batch (DAPO's dynamic sampling
            generates about 1.3 batches per trained batch).
        train_factor: training compute relative to the policy's (a critic of the same size: 2).

    Raises:
        ValueError: an unknown ``gpu``, ``runs < 1`` or ``steps < 1``.
    """
    if gpu not in GPU_SPEEDS:
        raise ValueError(f"expected_gpu_minutes: unknown GPU class {gpu!r}; known: {sorted(GPU_SPEEDS)}")
    if not is_int(runs) or runs < 1:
        raise ValueError(f"expected_gpu_minutes: runs must be an int >= 1, got {runs!r}")
    if steps is not None and (not is_int(steps) or steps < 1):
        raise ValueError(f"expected_gpu_minutes: steps must be an int >= 1 or None, got {steps!r}")
    speed, c = GPU_SPEEDS[gpu], profile.config
    steps = profile.steps if steps is None else int(steps)
    budget = c.max_new_tokens or dict(profile.task_kwargs).get("max_new_tokens") or 512
    test_size = dict(profile.task_kwargs).get("test_size") or GPU_TEST_SIZE
    per_step = (generation_factor * budget * speed["decode_step_s"]
                + train_factor * c.prompts_per_step * c.group_size * (prompt_tokens + completion_tokens)
                / speed["train_tokens_per_s"])
    evals = (1 + steps // c.eval_every + (steps % c.eval_every != 0)) if c.eval_every else 0
    per_eval = -(-test_size // 256) * budget * speed["decode_step_s"] * (2 if c.eval_sampled else 1)
    return runs * (steps * per_step + evals * per_eval) / 60.0


# COLAB_SEEDS, COLAB_T4_MEMORY, COLAB_SETUP_MINUTES: documented where they are exported, in
# grpo_lab/experiments/__init__.py.
COLAB_SEEDS = (0,)
COLAB_T4_MEMORY = 15_835_398_144
COLAB_SETUP_MINUTES = 4.0


def colab_profile(*, steps: int = 30, **config: Any) -> Profile:
    """The ``"colab"`` profile: :func:`gpu_profile` sized for a free Colab T4 (16 GB, float16 + GradScaler).

    Qwen2.5-0.5B-Instruct with LoRA adapters (rank 16 on ``q_proj`` and ``v_proj``, :class:`~grpo_lab.policy.lora.LoraSpec`'s
    default, lr 2e-5, chosen, not tuned; the KL reference is the base with the adapters off, so no copy), 8 questions × G = 8 per step, a 256-token budget, greedy accuracy
    on the first 200 test problems every 10 steps, 30 steps, :data:`COLAB_SEEDS`. The batch sizes are fitted
    to :data:`COLAB_T4_MEMORY` by the memory model (not to the card it runs on, so the run is the same on any
    GPU). Its results are a look, not a claim: one seed, a short run.

    Args:
        steps: RL steps per seed.
        **config: as :func:`gpu_profile` (``model``, ``source``, ``lora``, ``test_size``, ``max_new_tokens``,
            ``TrainerConfig`` fields) over these defaults.

    Returns:
        A :class:`Profile` named ``"colab"``.

    Raises:
        ValueError: as :func:`gpu_profile`.
    """
    defaults = dict(lora=LoraSpec(r=16), test_size=200, max_new_tokens=256, gpu_memory=COLAB_T4_MEMORY,
                    prompts_per_step=8, lr=2e-5)
    prof = gpu_profile(steps=steps, **{**defaults, **config})
    return dataclasses.replace(prof, name="colab")


def colab_minutes(profile: Profile, runs: int, *, steps: int | None = None, generation_factor: float = 1.0,
                  train_factor: float = 1.0) -> float:
    """Predicted minutes of a chapter's GPU cell on Colab's T4: :data:`COLAB_SETUP_MINUTES` plus
    :func:`expected_gpu_minutes` ``(profile, runs, "T4", ...)`` (assumed speeds, never measured).

    Raises:
        ValueError: as :func:`expected_gpu_minutes`.
    """
    return COLAB_SETUP_MINUTES + expected_gpu_minutes(profile, runs, "T4", steps=steps,
                                                      generation_factor=generation_factor, train_factor=train_factor)
