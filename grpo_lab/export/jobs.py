"""A runnable job, not a fragment: the files that train a grpo_lab algorithm on a grpo_lab task in TRL or verl.

* :func:`trl_job` writes ``train.py`` (``trl.GRPOConfig`` built from :func:`~grpo_lab.export.translation.to_trl`'s
  settings, written as a literal dict, and ``trl.GRPOTrainer(...).train()``; it runs with ``python train.py``
  and ``accelerate launch train.py``), ``dataset.jsonl`` (the task's prompts in TRL's form), ``rewards.py``
  (a TRL reward function that calls the task's own scorer, plus DAPO's soft overlong punishment through
  :func:`~grpo_lab.export.translation.trl_reward_funcs` when the algorithm has it) and ``README.md``;
* :func:`verl_job` writes ``train.parquet`` / ``test.parquet`` in verl's RL dataset schema, ``reward.py``
  (verl's ``custom_reward_function``, ``compute_score``, wrapping the task's scorer: verl's built-in GSM8K
  scorer reads only ``#### <n>``, so grpo_lab's ``\\boxed{}`` answers would score 0 with it),
  ``overrides.txt`` (the Hydra overrides: :func:`~grpo_lab.export.translation.to_verl` plus data, reward, model and
  trainer keys), ``run.sh`` (``python -m verl.trainer.main_ppo ...``) and ``README.md``.

The budget is :func:`~grpo_lab.export.optimisation.budget_from_config` of ``config`` (``TrainerConfig()`` when none is
given) with the keyword arguments on top, and ``max_new_tokens`` from the task when neither sets it, so
nothing is typed twice and the target's defaults never stand in for grpo_lab's. The reward files rebuild
the task from :func:`grpo_lab.tasks.task_spec` and import grpo_lab: the job runs where grpo_lab is
installed (``pip install`` of this checkout), and a task of your own must be a registered dataclass task whose
module registers it on import.
"""

from __future__ import annotations

import difflib
import json
import os
import pprint
import shlex
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from ..algo.algorithms import Algorithm, get_algorithm
from . import job_scripts as _scripts
from .optimisation import budget_from_config
from .translation import TRL_VERSION, VERL_VERSION, Translation, translate

__all__ = ["DEFAULT_STEPS", "VERL_ROLLOUT", "trl_job", "verl_job", "JobCaveatWarning"]


class JobCaveatWarning(UserWarning):
    """A job was written, but it will not do what a user probably means without a change: trained on a
    sample shipped for trying jobs, a model verl cannot prompt, a task module the job cannot import. The
    same text is a caveat of the job's README."""

#: training steps of a job when neither ``steps`` nor ``config.lr_schedule_steps`` gives them
DEFAULT_STEPS = 100
#: the verl rollout engine a job names (``actor_rollout_ref.rollout.name``; ``sglang`` works as well)
VERL_ROLLOUT = "vllm"


#: what a TRL job's README says about what it does not reproduce
_TRL_CAVEATS = [
    "`prompt` is the exact text grpo_lab's policy sees; TRL encodes it with the tokenizer's special tokens "
    "(`add_special_tokens=True`), grpo_lab without them: a tokenizer that adds a BOS token gives TRL's prompts one "
    "more token.",
    "The reward files import grpo_lab (the task's own scorer): install it wherever the job runs.",
]
#: what a verl job's README says about what it does not reproduce
_VERL_CAVEATS = [
    "verl applies the model's chat template to each `prompt` (a list of messages): a model without one (a base "
    "model, the tiny shipped checkpoints) cannot train with this job; its configuration is still valid.",
    "Paths in `overrides.txt` and `run.sh` are absolute: write the job again if the directory moves.",
    "The reward file imports grpo_lab (the task's own scorer): install it on every node.",
]


@dataclass(frozen=True)
class _Job:
    """What both jobs are built from: the algorithm, task, model, translation and sizes, all checked."""

    algo: Algorithm
    task: Any
    spec: dict
    model: str
    out: Path
    translation: Translation
    steps: int
    seed: int


def _multi_turn_refusal(task, target: str) -> str:
    """Why ``task`` (multi-turn: it has an ``environment()``) cannot be exported to ``target`` (``"trl"`` or
    ``"verl"``) and what a user changes to train it there: the message of the export's ``ValueError``.

    TRL (``GRPOTrainer(tools=, environment_factory=)``, ``GRPOConfig.max_tool_calling_iterations``) runs tools
    that the model calls in its chat template's tool-call format (parsed by the tokenizer's response template),
    passes them JSON arguments of a Python function's type-hinted signature and renders each result as a
    ``tool`` message of the chat template; it masks the tool message's tokens out of the loss and the length
    counts (``tool_mask``), as grpo_lab's ``observation_mask`` does. verl's multi-turn rollout
    (``actor_rollout_ref.rollout.multi_turn``) runs in its sglang / vLLM server with a tool YAML
    (``tool_config_path``: ``BaseTool`` classes with an OpenAI function schema), again through the chat
    template's tool calls. A grpo_lab environment reads a text protocol of its own instead. (Read in TRL 1.16.0's
    ``trl/trainer/grpo_trainer.py``: ``_tool_call_loop``, and ``trl/chat_template_utils.py``: ``supports_tool_calling``.)
    """
    name = getattr(task, "name", type(task).__name__)
    try:
        env = task.environment()
        stops, turns = list(getattr(env, "stop_strings", ())), getattr(env, "max_turns", "?")
    except Exception:  # noqa: BLE001 (the message only describes the environment)
        stops, turns = [], "?"
    head = (f"task {name!r} is multi-turn: its environment reads the model's tool calls as plain text (a model "
            f"turn ends at one of its stop strings {stops}, the environment's step() answers with an observation "
            f"text, at most {turns} model turns), and grpo_lab trains it with generate_episodes. ")
    forward = ("Train it with grpo_lab (python -m grpo_lab train PRESET --task " + str(name) + "; every preset "
               "runs multi-turn), or, to train ")
    if target == "trl":
        return head + (
            "TRL's GRPOTrainer(tools=..., environment_factory=...) with GRPOConfig(max_tool_calling_iterations=...) "
            "has another contract: the model must write tool calls in its chat template's JSON tool-call format "
            "(TRL parses them with the tokenizer's response template and refuses a tokenizer whose chat template "
            "cannot render user -> assistant tool_calls -> tool; the shipped checkpoints' character tokenizer has "
            "no chat template), the tool is a Python function with type-hinted arguments and a docstring (or a "
            "method of the environment_factory class, whose reset(**row) gets the dataset row), each result enters as a "
            "'tool' chat message, and no per-turn reward exists (get_reward() once per episode). TRL masks the "
            "tool message's tokens out of the loss and the length counts, as grpo_lab does, but the episodes "
            "differ: the job would train another task. " + forward +
            "it with TRL, use a chat model whose template supports tool calls (e.g. Qwen3), write the tool as a "
            "function (for the calculator: def calc(a: int, b: int, op: str) -> int with a docstring), pass "
            "tools=[calc], set max_tool_calling_iterations to the environment's max_turns - 1, and reward the "
            "final answer with a reward function")
    return head + (
        "verl's multi-turn rollout (actor_rollout_ref.rollout.multi_turn.enable=True, "
        "multi_turn.max_assistant_turns, multi_turn.tool_config_path) needs an sglang or vLLM rollout server "
        "(rollout.name=sglang|vllm, mode=async) and a tool YAML of verl BaseTool classes with OpenAI function "
        "schemas, called through the chat template's tool-call format (the shipped checkpoints' character "
        "tokenizer has no chat template); a text protocol read by a stop string is not one of its tool parsers. "
        + forward + "it with verl, use a chat model with tool calling, write the tool as a verl BaseTool with "
        "its function schema in a tool YAML, and set the multi_turn options above")


def _task(task, target: str) -> tuple[Any, dict]:
    """``(task object, its task_spec)``; a name is built with :func:`grpo_lab.tasks.get_task`. ``ValueError``: an
    unknown name, a multi-turn task (an ``environment()``: :func:`_multi_turn_refusal` says why, for ``target``),
    or a spec that is not plain data (function objects)."""
    from ..tasks import TASKS, get_task, task_spec

    if isinstance(task, str):
        if task not in TASKS:
            close = difflib.get_close_matches(task, list(TASKS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown task {task!r}{hint}; known tasks: {sorted(TASKS)}")
        task = get_task(task)
    if callable(getattr(task, "environment", None)):
        raise ValueError(_multi_turn_refusal(task, target))
    try:
        spec = task_spec(task)
        json.dumps(spec)  # the spec is written as a literal: it must be plain data
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the job's reward files rebuild the task from its task_spec, and {exc} (reward functions "
                         "travel as import paths: reward_funcs=['module:function'])") from None
    return task, spec


def _model(model) -> str:
    """A checkpoint directory (absolute), a shipped checkpoint's directory, or a hub id ``org/name``."""
    from ..paths import data_dir

    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a checkpoint directory or a hub id (str), got {type(model).__name__}")
    text = os.fspath(model)
    path = Path(text).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model {text!r}: not a checkpoint directory (no config.json in it)")
        return str(path.resolve())
    shipped = data_dir() / "checkpoints" / text
    if "/" not in text and (shipped / "config.json").is_file():
        return str(shipped.resolve())
    parts = text.split("/")
    if len(parts) == 2 and all(parts) and not text.startswith((".", "~")) and " " not in text:
        return text  # a hub id: the job's machine downloads it
    names = sorted(p.name for p in (data_dir() / "checkpoints").glob("*") if (p / "config.json").is_file())
    close = difflib.get_close_matches(text, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise FileNotFoundError(f"model {text!r}: no such checkpoint directory{hint}; give a directory, a shipped "
                            f"checkpoint ({', '.join(names) or 'none'}) or a hub id org/name")


def _portable_model(model: str) -> str:
    """A checkpoint shipped in ``data/checkpoints`` by its name (``load_policy`` finds it wherever grpo_lab is
    installed), anything else as given."""
    from ..paths import data_dir

    shipped = (data_dir() / "checkpoints").resolve()
    return Path(model).name if Path(model).parent == shipped else model


def _budget(config, task, budget: dict) -> dict:
    """``budget_from_config(config)`` with ``budget`` on top and the task's ``max_new_tokens`` as the default."""
    from ..training.config import TrainerConfig

    if config is None:
        config = TrainerConfig()
    merged = {**budget_from_config(config), **budget}
    merged.setdefault("max_new_tokens", int(task.max_new_tokens))
    return merged


#: the most training prompts a job's data file may hold (steps x prompts_per_step): the file is written in memory
MAX_JOB_PROMPTS = 2_000_000


def _steps(steps, budget: dict) -> int:
    """The job's RL steps: ``steps``, else the budget's ``lr_schedule_steps``, else :data:`DEFAULT_STEPS`; a
    decaying schedule's horizon must be the run's length (the target's ``max_steps`` / ``total_training_steps`` is
    both), and the data file must stay below :data:`MAX_JOB_PROMPTS` prompts."""
    horizon = budget.get("lr_schedule_steps")
    if steps is None:
        steps = horizon or DEFAULT_STEPS
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if horizon is not None and horizon != steps and budget.get("lr_schedule", "constant") != "constant":
        raise ValueError(f"steps={steps} but lr_schedule_steps={horizon}: TRL's max_steps and verl's "
                         "total_training_steps are both the run's length and the decay's horizon, so a job cannot "
                         "decay over another length; give the same number (or leave lr_schedule_steps unset)")
    prompts = steps * int(budget.get("prompts_per_step", 1))
    if prompts > MAX_JOB_PROMPTS:
        raise ValueError(f"steps={steps} x prompts_per_step={budget.get('prompts_per_step', 1)} = {prompts} training "
                         f"prompts, more than a job's data file holds (MAX_JOB_PROMPTS = {MAX_JOB_PROMPTS})")
    return steps


def _prepare(preset, task, model, out, config, steps, strict, target, budget) -> _Job:
    """Check every argument and translate; nothing is written yet."""
    algo = get_algorithm(preset) if isinstance(preset, str) else preset
    if not isinstance(algo, Algorithm):
        raise TypeError(f"preset must be a preset name or an Algorithm, got {type(algo).__name__}")
    task, spec = _task(task, target)
    model = _model(model)
    merged = _budget(config, task, budget)
    steps = _steps(steps, merged)
    if merged.get("lr_schedule", "constant") != "constant":
        merged["lr_schedule_steps"] = steps
    translation = translate(algo, target, strict=strict, **merged)
    out = Path(out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"out {str(out)!r} is a file; the job is a directory")
    out.mkdir(parents=True, exist_ok=True)
    seed = int(getattr(config, "seed", 0) or 0)
    return _Job(algo, task, spec, model, out, translation, steps, seed)


def _own_caveats(job: _Job, target: str) -> list[str]:
    """The caveats of this job (besides the target's fixed ones), each also warned
    (:class:`JobCaveatWarning`) where the job would mislead; a task module from outside grpo_lab is copied in."""
    notes, warned = [], []
    module = job.spec["class"].rsplit(".", 1)[0]
    source = job.spec["params"].get("source")
    if not module.startswith("grpo_lab."):
        path = getattr(sys.modules.get(module), "__file__", None)
        if "." not in module and path and Path(path).is_file():
            if Path(path).resolve() != (job.out / f"{module}.py").resolve():
                shutil.copyfile(path, job.out / f"{module}.py")
            notes.append(f"The task's module `{module}` ({path}) is copied here as `{module}.py`; the reward "
                         "file imports it from this directory: copy it again after editing the original.")
        else:
            warned.append(f"The reward file imports `{module}` (the task's class): make it importable where the job "
                          "runs (install its package, or put it on PYTHONPATH).")
    if source == "fixture":
        warned.append("The problems are the small sample shipped with grpo_lab (source 'fixture'), for trying the job: "
                      "export with source 'hub' or a path for the real data set.")
    elif isinstance(source, str) and source != "hub" and Path(source).is_file():
        notes.append(f"{len(list(job.task.test_set()))} problems of {source} (the file's last third) are the task's "
                     "test split and are not trained on (a single file is split so; pass a directory in the hub "
                     "layout to keep a train split whole).")
    if job.spec["params"].get("tokenizer_name", "absent") is None and hasattr(job.task, "instruction"):
        notes.append("The prompts are formatted without a chat template (the task's tokenizer_name is None); grpo_lab's "
                     "GPU profile formats them with the model's (tokenizer_name=MODEL): export with that for the same "
                     "prompts." if target == "trl" else "verl applies the model's chat template to the messages.")
    if target == "verl" and not _has_chat_template(job.model):
        warned.append(f"The model {job.model} has no chat template, which verl applies to every prompt: this job "
                      "cannot train it (its configuration is still valid).")
    for text in warned:
        warnings.warn(text, JobCaveatWarning, stacklevel=3)
    return warned + notes


def _has_chat_template(model: str) -> bool:
    """False only for a local checkpoint directory whose tokenizer has no chat template (a hub id: unknown, True)."""
    path = Path(model)
    if not path.is_dir():
        return True
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    config = path / "tokenizer_config.json"
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template")) if config.is_file() else False
    except (OSError, ValueError):
        return True


def _problems(job: _Job, n: int) -> list:
    """``n`` training problems drawn as the trainer draws them, with ``numpy.random.default_rng(seed)``."""
    return list(job.task.sample(n, np.random.default_rng(job.seed)))


def _distinct(problems: list) -> str:
    """``"N distinct problems"``: a small task set (GSM8K's shipped fixture: 16 training problems) repeats."""
    n = len({p.prompt for p in problems})
    return f"{n} distinct problem{'s' if n != 1 else ''}" + (", drawn with repetition" if n < len(problems) else "")


def _literal(value: Any) -> str:
    """``value`` as a python literal, one key per line (read back by :func:`ast.literal_eval`)."""
    return pprint.pformat(value, indent=1, width=110, sort_dicts=False)


def _scorer(job: _Job, doc: str) -> str:
    spec, files = _self_contained(job)
    return _scripts.TASK_SCORER.format(doc=doc, spec=_literal(spec), job_files=_literal(files))


def _copy_module(module: str, out: Path) -> bool:
    """Copy the top-level single-file module ``module`` (imported) into ``out``; False when it is none."""
    path = getattr(sys.modules.get(module), "__file__", None)
    if "." in module or module.startswith("grpo_lab") or not path or not Path(path).is_file():
        return False
    if Path(path).resolve() != (out / f"{module}.py").resolve():
        shutil.copyfile(path, out / f"{module}.py")
    return True


def _self_contained(job: _Job) -> tuple[dict, list]:
    """``(task spec, its params that are job files)``: a task's ``reward_funcs`` modules (``"module:function"``)
    copied into the job, its local ``data`` file copied to ``data/<name>`` and named relative to the job."""
    spec = json.loads(json.dumps(job.spec))
    for entry in spec["params"].get("reward_funcs") or ():
        if isinstance(entry, str) and ":" in entry:
            _copy_module(entry.split(":", 1)[0], job.out)
    data = spec["params"].get("data")
    if not isinstance(data, str) or not Path(data).expanduser().is_file():
        return spec, []
    (job.out / "data").mkdir(exist_ok=True)
    target = job.out / "data" / Path(data).name
    if Path(data).expanduser().resolve() != target.resolve():
        shutil.copyfile(Path(data).expanduser(), target)
    spec["params"]["data"] = f"data/{target.name}"
    return spec, ["data"]


def _functions(task) -> list:
    """``[[name, weight], ...]`` of a task with several named reward functions (a DatasetTask), else ``[]``."""
    if not (hasattr(task, "function_rewards") and hasattr(task, "_unique_names")):
        return []
    return [[n, w] for n, w in zip(task._unique_names(), task._check_weights())]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _issue_lines(translation: Translation) -> list[str]:
    notes = [f"- note: {n}" for n in translation.notes]
    issues = [f"- {i.text()}" for i in translation.issues]
    exact = ("The exported settings compute this algorithm exactly." if translation.exact else
             "NOT EXACT: the target computes something else; each difference is listed below.")
    return [exact, "", *issues, *notes]


def _readme(job: _Job, title: str, files: list[tuple[str, str]], commands: list[str], version: str,
            caveats: list[str]) -> str:
    lines = [f"# {title}", "",
             f"Written by `grpo_lab.export` for {version}: the algorithm **{job.algo.name}** on the grpo_lab task "
             f"**{job.spec['name']}** (`{job.spec['class']}`), model `{job.model}`, {job.steps} steps, seed {job.seed}.",
             "", "## Files", "", *[f"- `{name}`: {what}" for name, what in files], "", "## Run", "", "```sh",
             *commands, "```", "", "## Caveats", "", *[f"- {c}" for c in caveats], "", "## The translation", "",
             *_issue_lines(job.translation), ""]
    return "\n".join(lines)


def trl_job(preset: Union[Algorithm, str], task, model: Union[str, os.PathLike], out: Union[str, os.PathLike], *,
            config=None, steps: Optional[int] = None, strict: bool = True, **budget: Any) -> Path:
    """Write a TRL job that trains ``preset`` on ``task`` from ``model``: script, dataset, reward adapter, README.

    Writes into ``out`` (created if needed, files replaced) a ``README.md`` (the translation's notes, commands) and:

    * ``train.py``: ``trl.GRPOConfig`` from :func:`~grpo_lab.export.translation.to_trl` and the run's own keys, the
      policy from :func:`grpo_lab.policy.models.load_policy`; ``build_trainer(argv)`` returns the trainer untrained.
    * ``dataset.jsonl``: ``steps * prompts_per_step`` problems in TRL's form (the prompts grpo_lab's policy sees).
    * ``rewards.py``: the task's own reward (:func:`~grpo_lab.export.translation.trl_reward_funcs`).

    Args:
        preset: an :class:`~grpo_lab.algo.algorithms.Algorithm` or a preset name.
        task: a registered dataclass task (:func:`grpo_lab.tasks.task_spec` describes it) or its name.
        model, out: a checkpoint directory, a shipped checkpoint's name or a hub id; the job's directory.
        config: the :class:`~grpo_lab.training.trainer.TrainerConfig` whose budget and seed the job uses.
        steps: ``GRPOConfig.max_steps``; ``None``: ``config.lr_schedule_steps``, else :data:`DEFAULT_STEPS`.
        strict: as :func:`~grpo_lab.export.translation.translate`.
        **budget: budget keys (:data:`~grpo_lab.export.translation.BUDGET_KEYS`) over the config's.

    Returns:
        ``Path`` of ``out`` (absolute).

    Raises:
        ExportError: (strict) TRL does not compute the algorithm exactly; the message names the alternative.
        ValueError: an unknown task (did-you-mean), a task without a spec, bad ``steps``, a bad budget.
        FileNotFoundError: a model that is no directory, shipped checkpoint or hub id.
        FileExistsError: ``out`` is a file.

    Warns:
        JobCaveatWarning: the job trains on the shipped fixture, or imports a task module (one file: copied to ``out``).
    """
    job = _prepare(preset, task, model, out, config, steps, strict, "trl", budget)
    b = job.translation.budget
    problems = _problems(job, job.steps * int(b.get("prompts_per_step", 1)))
    _write_jsonl(job.out / "dataset.jsonl", [{"prompt": p.prompt, "answer": p.answer, "meta": json.dumps(p.meta)}
                                              for p in problems])
    doc = f"TRL reward functions for the grpo_lab task {job.spec['name']!r}, written by grpo_lab.export.trl_job."
    rewards = _scorer(job, doc) + _scripts.TRL_REWARDS.format(algorithm=_literal(job.algo.describe()),
                                                              max_new_tokens=int(b["max_new_tokens"]),
                                                              functions=_literal(_functions(job.task)))
    (job.out / "rewards.py").write_text(rewards, encoding="utf-8")
    updates = job.steps * int(b.get("epochs", 1)) * int(b.get("minibatches", 1))
    run = {"output_dir": "output", "max_steps": updates, "seed": job.seed, "logging_steps": 1,
           "save_strategy": "no", "report_to": "none"}
    doc = (f"Train {job.algo.name} on the grpo_lab task {job.spec['name']!r} with TRL {TRL_VERSION} "
           "(written by grpo_lab.export.trl_job).\n\nRun: python train.py [--max-steps N] [--cpu], or "
           "accelerate launch train.py")
    (job.out / "train.py").write_text(_scripts.TRL_TRAIN.format(doc=doc, model=repr(_portable_model(job.model)),
                                                                settings=_literal(job.translation.config),
                                                                run=_literal(run)), encoding="utf-8")
    files = [("train.py", "the script: GRPOConfig(**SETTINGS, **RUN), GRPOTrainer(...).train()"),
             ("dataset.jsonl", f"{len(problems)} training prompts ({_distinct(problems)}; columns prompt, answer, "
                               "meta)"),
             ("rewards.py", "the reward adapter: grpo_lab's own scorer of the task as a TRL reward function")]
    world = int(b.get("nnodes", 1)) * int(b.get("n_gpus_per_node", 1))
    launch = (["python train.py                       # one device"] if world == 1 else
              [f"accelerate launch --num_processes {world} train.py   # the {world} devices the budget was sized for"])
    commands = ["pip install /path/to/grpo_lab trl==" + TRL_VERSION + "   # this grpo_lab checkout", *launch,
                "python train.py --cpu --max-steps 2  # a smoke test on the CPU"]
    caveats = _own_caveats(job, "trl")
    (job.out / "README.md").write_text(_readme(job, f"TRL job: {job.algo.name} on {job.spec['name']}", files,
                                               commands, f"TRL {TRL_VERSION}", caveats + _TRL_CAVEATS),
                                       encoding="utf-8")
    return job.out


def _messages(task, problem) -> list[dict]:
    """verl's ``prompt``: the chat messages. A task that formats a question with a system prompt and an
    instruction (GSM8K) gives its turns; any other task's prompt text is the user turn."""
    question = problem.meta.get("question") if isinstance(problem.meta, dict) else None
    if question is None or not hasattr(task, "instruction"):
        return [{"role": "user", "content": problem.prompt}]
    user = f"{question}\n{task.instruction}" if task.instruction else question
    system = getattr(task, "system_prompt", None)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def _verl_rows(job: _Job, problems: list, split: str) -> list[dict]:
    """Rows of verl's RL dataset schema (``verl.utils.dataset.rl_dataset``, its GSM8K example's layout)."""
    source = f"grpo_lab/{job.spec['name']}"
    ability = "math" if job.spec["name"] in ("arithmetic", "gsm8k") else job.spec["name"]
    return [{"data_source": source, "prompt": _messages(job.task, p), "ability": ability,
             "reward_model": {"style": "rule", "ground_truth": p.answer},
             "extra_info": {"split": split, "index": i, "prompt": p.prompt, "meta": json.dumps(p.meta)}}
            for i, p in enumerate(problems)]


def _hydra_value(text: str) -> str:
    """``text`` as a Hydra override value: quoted when it holds a character Hydra's grammar reads."""
    safe = all(c.isalnum() or c in "/._-+:@" for c in text)
    return text if safe else "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _verl_overrides(job: _Job) -> list[str]:
    """:func:`~grpo_lab.export.translation.to_verl`'s overrides plus the job's files, model, engine and trainer keys."""
    exported = [o for o in job.translation.config if not o.startswith("trainer.total_training_steps=")]
    micro = next((o.split("=", 1)[1] for o in exported
                  if o.startswith("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=")), "8")
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in f"{job.algo.name}-{job.spec['name']}")
    return exported + [
        f"data.train_files={_hydra_value(str(job.out / 'train.parquet'))}",
        f"data.val_files={_hydra_value(str(job.out / 'test.parquet'))}",
        f"reward.custom_reward_function.path={_hydra_value(str(job.out / 'reward.py'))}",
        "reward.custom_reward_function.name=compute_score",
        f"actor_rollout_ref.model.path={_hydra_value(job.model)}",
        *([f"critic.model.path={_hydra_value(job.model)}"] if "critic.enable=True" in exported else []),
        f"actor_rollout_ref.rollout.name={VERL_ROLLOUT}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        f"trainer.total_training_steps={job.steps}",
        "trainer.logger=[console]",
        "trainer.project_name=grpo_lab",
        f"trainer.experiment_name={name}",
    ]


def _write_parquet(path: Path, rows: list[dict]) -> None:
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path, index=False)


def verl_job(preset: Union[Algorithm, str], task, model: Union[str, os.PathLike], out: Union[str, os.PathLike], *,
             config=None, steps: Optional[int] = None, nnodes: int = 1, n_gpus_per_node: int = 8, strict: bool = True,
             **budget: Any) -> Path:
    """Write a verl job that trains ``preset`` on ``task`` from ``model``: data, reward function, overrides, command.

    Files written into ``out`` (created if needed, files of the same name replaced):

    * ``train.parquet`` (``steps * prompts_per_step`` problems) and ``test.parquet`` (the test set) in verl's RL
      dataset schema (``prompt`` as chat messages, ``reward_model = {"style": "rule", "ground_truth": answer}``).
    * ``reward.py``: ``compute_score(...)``, the task's own reward, never verl's built-in scorers.
    * ``overrides.txt``: one Hydra override a line (:func:`~grpo_lab.export.translation.to_verl`, then the data,
      reward, model, rollout engine :data:`VERL_ROLLOUT`, steps and logger; absolute paths).
    * ``run.sh``: ``python3 -m verl.trainer.main_ppo <overrides> "$@"`` (on the Ray head node), and a ``README.md``.

    Args:
        preset, task, model, out, config, steps, strict: as :func:`trl_job`.
        nnodes: machines; n_gpus_per_node: GPUs on each (budget keys: they size verl's micro-batches).
        **budget: budget keys (:data:`~grpo_lab.export.translation.BUDGET_KEYS`) over the config's.

    Returns:
        ``Path`` of ``out`` (absolute).

    Raises:
        ExportError: (strict) verl does not compute the algorithm exactly; the message names the alternative.
        ValueError, FileNotFoundError, FileExistsError: as :func:`trl_job`.

    Warns:
        JobCaveatWarning: as :func:`trl_job`, and for a local model without a chat template.
    """
    job = _prepare(preset, task, model, out, config, steps, strict, "verl",
                   {**budget, "nnodes": nnodes, "n_gpus_per_node": n_gpus_per_node})
    train = _problems(job, job.steps * int(job.translation.budget.get("prompts_per_step", 1)))
    test = list(job.task.test_set())
    _write_parquet(job.out / "train.parquet", _verl_rows(job, train, "train"))
    _write_parquet(job.out / "test.parquet", _verl_rows(job, test, "test"))
    doc = f"verl custom reward function for the grpo_lab task {job.spec['name']!r}, written by grpo_lab.export.verl_job."
    (job.out / "reward.py").write_text(_scorer(job, doc) + _scripts.VERL_REWARD.format(), encoding="utf-8")
    overrides = _verl_overrides(job)
    (job.out / "overrides.txt").write_text("\n".join(overrides) + "\n", encoding="utf-8")
    script = ["#!/usr/bin/env bash", f"# {job.algo.name} on the grpo_lab task {job.spec['name']!r} with verl "
              f"{VERL_VERSION}, written by grpo_lab.export.verl_job. Extra Hydra overrides may follow.",
              "set -euo pipefail", "python3 -m verl.trainer.main_ppo \\",
              *[f"    {shlex.quote(o)} \\" for o in overrides], '    "$@"', ""]
    (job.out / "run.sh").write_text("\n".join(script), encoding="utf-8")
    (job.out / "run.sh").chmod(0o755)
    files = [("train.parquet", f"{len(train)} training prompts ({_distinct(train)}) in verl's RL dataset schema"),
             ("test.parquet", f"{len(test)} test prompts (the task's test set)"),
             ("reward.py", "custom_reward_function compute_score: grpo_lab's own scorer of the task"),
             ("overrides.txt", "the Hydra overrides, one a line"), ("run.sh", "the command line")]
    commands = [f"pip install /path/to/grpo_lab verl=={VERL_VERSION} vllm   # this grpo_lab checkout, on every node", "ray start --head   # then "
                "ray start --address=HEAD:6379 on the other nodes", "bash run.sh"]
    title = f"verl job: {job.algo.name} on {job.spec['name']}, {nnodes} x {n_gpus_per_node} GPUs"
    # _own_caveats says it when this model has no chat template: the generic chat-template caveat is then dropped
    fixed = _VERL_CAVEATS if _has_chat_template(job.model) else _VERL_CAVEATS[1:]
    (job.out / "README.md").write_text(_readme(job, title, files, commands, f"verl {VERL_VERSION}",
                                               _own_caveats(job, "verl") + fixed), encoding="utf-8")
    return job.out
