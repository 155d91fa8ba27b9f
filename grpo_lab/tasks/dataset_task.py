"""A task over a dataset of your own, scored by reward functions written in TRL's shape.

:class:`~grpo_lab.tasks.DatasetTask` turns rows of a ``datasets.Dataset`` (or of a local ``.jsonl`` /
``.json`` / ``.parquet`` / ``.csv`` file) into :class:`~grpo_lab.tasks.Problem` and scores
responses with reward functions of the signature TRL's ``GRPOTrainer`` documents::

    def reward_func(prompts, completions, **kwargs) -> list[float | None]

called once per generation round on the whole batch, with every other column of the dataset as a
keyword list (one value per completion). A dataset and reward functions written for TRL run here
unchanged: see :class:`~grpo_lab.tasks.DatasetTask` for what is passed and how several functions combine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import difflib
import importlib
import inspect
import math
import numbers
import os
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .base import Problem, callable_name, source_fingerprint

__all__ = ["DatasetTask", "reward_func_name", "RewardTrainerState", "RewardFunctionError", "RewardModelFunc"]

#: The keyword arguments a reward function gets besides the columns (TRL 1.16's names, ``GRPOTrainer._calculate_rewards``).
_RESERVED = ("prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra")


@dataclass(frozen=True)
class RewardTrainerState:
    """The ``trainer_state`` a reward function gets: the fields of ``transformers.TrainerState`` that TRL's
    reward functions read (curriculum rewards), at the moment the batch is scored.

    Attributes:
        global_step: optimiser updates made so far (TRL's meaning; ``Trainer.opt_steps``).
        max_steps: optimiser updates the ``train`` call will have made at its end (RL steps × epochs ×
            minibatches); 0 outside a trainer.
        epoch: passes over the training rows so far, ``step * prompts_per_step / rows`` (a float; sampling is
            with replacement, so this counts prompts drawn, not distinct rows).
        num_train_epochs: ``epoch`` at the end of the ``train`` call.
        step: grpo_lab's RL steps done (the step being scored is ``step + 1``).
    """

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0
    num_train_epochs: float = 0.0
    step: int = 0


class RewardFunctionError(RuntimeError):
    """A reward function raised. The message names the function, the step and the exception; the original
    exception is ``__cause__``.

    Attributes:
        function: the function's reported name (:func:`reward_func_name`).
        step: the RL step being scored (1-based), ``None`` outside a trainer.
    """

    def __init__(self, function: str, step: int | None, exc: BaseException):
        self.function, self.step = function, step
        at = f" at step {step}" if step is not None else ""
        hint = ("; the steps before it and their checkpoints are kept: fix the function and resume (the command "
                "line's --resume, or Trainer.resume(<checkpoint>, task=...))") if step is not None else ""
        super().__init__(f"reward function {function!r} raised {type(exc).__name__}{at}: {exc}{hint}")

#: File suffixes :class:`~grpo_lab.tasks.DatasetTask` reads, and the ``datasets.load_dataset`` builder of each.
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def reward_func_name(func: Callable) -> str:
    """The name a reward function is reported under: its ``__name__`` (a ``functools.partial``:
    the wrapped function's; any other callable: its class name)."""
    inner = getattr(func, "func", func)
    return getattr(inner, "__name__", None) or type(inner).__name__


def _resolve_func(spec, position: int, processing_class=None) -> Callable:
    """A reward function from a callable, a reward model (a ``torch.nn.Module`` sequence classifier, or an existing
    directory / hub id ``"org/name"`` loaded as one: :class:`RewardModelFunc`) or an import path
    ``"module:name"`` / ``"module.name"``.

    Raises:
        TypeError: neither a callable, a module nor a ``str``.
        ValueError: the path cannot be imported or names nothing callable.
    """
    import torch

    if isinstance(spec, torch.nn.Module):
        return RewardModelFunc(spec, processing_class)
    if callable(spec):
        return spec
    if isinstance(spec, (str, os.PathLike)) and Path(spec).expanduser().is_dir():
        return RewardModelFunc.from_pretrained(str(Path(spec).expanduser()), processing_class)
    if not isinstance(spec, str):
        raise TypeError(f"DatasetTask: reward_funcs[{position}] must be a callable (prompts, completions, **kwargs) "
                        f"-> list[float | None] or an import path 'module:function', got {type(spec).__name__} "
                        f"{spec!r:.60}")
    module, sep, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    try:
        func = getattr(importlib.import_module(module), attr) if module and sep and attr else None
    except (ImportError, AttributeError) as exc:
        from ..policy.models import HUB_ID

        if ":" not in spec and HUB_ID.match(spec):  # TRL's reading of a string: a reward model's hub id
            return RewardModelFunc.from_pretrained(spec, processing_class)
        raise ValueError(f"DatasetTask: reward_funcs[{position}] {spec!r} cannot be imported ({exc})") from None
    if not callable(func):
        raise ValueError(f"DatasetTask: reward_funcs[{position}] {spec!r} names no callable; write it as "
                         "'package.module:function' (a module-level function, importable in a new process)")
    return func


class RewardModelFunc:
    """A sequence-classification reward model used as a reward function, as TRL's ``GRPOTrainer`` uses one: each
    prompt + completion (a conversation: through the tokenizer's chat template) is tokenised without special
    tokens, padded on the right, and the reward is the model's ``logits[:, 0]`` (float32, no grad).

    Args:
        model: a ``torch.nn.Module`` returning an object with ``logits`` ``[B, num_labels]`` (a
            ``transformers`` ``AutoModelForSequenceClassification``).
        tokenizer: its tokenizer; ``None``: ``AutoTokenizer.from_pretrained(model.config._name_or_path)``. One
            without a pad token gets the EOS token as pad token (as TRL does).

    Its name (:func:`reward_func_name`) is the last component of ``model.config._name_or_path`` (TRL's).
    """

    def __init__(self, model, tokenizer=None):
        self.model = model
        path = str(getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)
        self.__name__ = path.rstrip("/").split("/")[-1]
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
            if getattr(model, "config", None) is not None:
                model.config.pad_token_id = tokenizer.pad_token_id
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(cls, name: str, tokenizer=None) -> "RewardModelFunc":
        """A reward model from a local directory or a hub id, loaded with
        ``AutoModelForSequenceClassification.from_pretrained(name, num_labels=1)`` (TRL's reading).

        Raises:
            OSError: it cannot be loaded (the message names it).
        """
        from transformers import AutoModelForSequenceClassification

        try:
            model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=1)
        except (OSError, ValueError) as exc:
            raise OSError(f"DatasetTask: the reward model {name!r} cannot be loaded ({exc})") from exc
        return cls(model.eval(), tokenizer)

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        """``[B]`` float rewards of the ``B`` prompt-completion pairs (see the class docstring)."""
        import torch

        if _is_conversation(prompts[0]):
            texts = [self.tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
        else:
            texts = [p + c for p, c in zip(prompts, completions)]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            logits = self.model(**{k: v.to(device) for k, v in enc.items()}).logits[:, 0]
        return logits.float().cpu().tolist()


def _run_coroutines(coros: list) -> list:
    """Await ``coros`` concurrently (``asyncio.gather``, as TRL runs async reward functions); from a thread of
    its own when an event loop is already running here (a notebook)."""
    async def gather():
        return await asyncio.gather(*coros)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, gather()).result()


def _check_signature(func: Callable, name: str, columns: list[str]) -> bool:
    """Check that ``func`` can be called as the task calls it, with ``prompts``, ``completions``,
    ``completion_ids``, ``trainer_state`` and the ``columns`` as keywords; return whether it
    requires ``completion_ids`` (a parameter of that name without a default). A callable without
    a readable signature passes (calling it will tell).

    Raises:
        ValueError: a required parameter that is none of those names (naming the function, the
            parameter, the columns and a did-you-mean), a required positional-only parameter, or
            no ``**kwargs`` while some of those keywords are not parameters.
    """
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return False
    known = list(_RESERVED) + [c for c in columns if c not in _RESERVED]
    params = list(sig.parameters.values())
    for prm in params:
        if prm.kind in (prm.VAR_POSITIONAL, prm.VAR_KEYWORD) or prm.default is not prm.empty:
            continue
        if prm.kind is prm.POSITIONAL_ONLY or prm.name not in known:
            near = difflib.get_close_matches(prm.name, known, n=1)
            why = ("is positional-only, but every argument is passed by keyword" if prm.kind is prm.POSITIONAL_ONLY
                   else f"is neither one of TRL's arguments {list(_RESERVED)} nor a column of the data ({columns})")
            raise ValueError(f"DatasetTask: reward function {name!r} requires the parameter {prm.name!r}, which {why}"
                             + (f"; did you mean {near[0]!r}?" if near else "")
                             + "; give it a default or read the column through **kwargs")
    if not any(prm.kind is prm.VAR_KEYWORD for prm in params):
        extra = [k for k in known if k not in sig.parameters]
        if extra:
            raise ValueError(f"DatasetTask: reward function {name!r} takes no **kwargs, but it is called with the "
                             f"keywords {known}, and {extra} are not among its parameters; write it as TRL does, "
                             "def f(prompts, completions, **kwargs)")
    ids = sig.parameters.get("completion_ids")
    return ids is not None and ids.default is ids.empty and ids.kind is not ids.VAR_KEYWORD


def _load_tokenizer_named(name: str):
    """The tokenizer ``name`` names, resolved as :func:`grpo_lab.policy.models.load_policy` resolves a
    model: an existing directory, the name of a checkpoint shipped in ``data/checkpoints``
    (e.g. ``"arithmetic-base"``), or a hub id ``"org/name"``; loaded with the loader
    ``load_policy`` uses (so the same tokenizer class).

    Raises:
        FileNotFoundError: ``name`` is none of those (the message lists the shipped checkpoints).
        OSError: it could not be loaded (e.g. a hub id offline and not in the cache).
    """
    from ..policy.models import _CHECKPOINT_NAME, HUB_ID, load_tokenizer
    from ..paths import checkpoint_dir, missing_data_hint, shipped_checkpoints

    path = Path(name).expanduser()
    if not path.exists() and _CHECKPOINT_NAME.match(name):
        path = checkpoint_dir(name)  # a shipped checkpoint by name, as load_policy reads one
        if not path.is_dir():
            shipped = shipped_checkpoints()
            raise FileNotFoundError(f"DatasetTask: tokenizer={name!r} is neither an existing directory nor a shipped "
                                    f"checkpoint (shipped: {', '.join(shipped) if shipped else 'none found'}); "
                                    f"{missing_data_hint()}. A hub tokenizer is named 'org/name'")
    elif not path.exists() and not HUB_ID.match(name):
        raise FileNotFoundError(f"DatasetTask: tokenizer={name!r} is neither an existing directory, a shipped "
                                "checkpoint nor a hub id 'org/name'")
    source = str(path) if path.exists() else name
    try:
        return load_tokenizer(source)
    except OSError as exc:
        raise OSError(f"DatasetTask: could not load the tokenizer {name!r} ({source}): {exc}") from exc


def _load_file(path: Path):
    """A local data file as a ``datasets.Dataset``, offline, through
    ``datasets.load_dataset(<format>, data_files=path, split="train")``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a suffix not in :data:`FILE_FORMATS`, or an empty file (nothing but white space).
    """
    if not path.is_file():
        raise FileNotFoundError(f"DatasetTask: the data file {str(path)!r} does not exist")
    fmt = FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"DatasetTask: cannot read {str(path)!r}: a data file must end in one of "
                         f"{sorted(FILE_FORMATS)}")
    empty = ValueError(f"DatasetTask: the data file {str(path)!r} is empty (no rows); give it one row per prompt")
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head.strip() and path.stat().st_size <= len(head):
        raise empty
    import datasets

    try:
        return datasets.load_dataset(fmt, data_files=str(path), split="train")
    except StopIteration:  # datasets' builders on a file without a row
        raise empty from None


def _as_dataset(data, split: str, what: str):
    """``data`` (a ``Dataset``, a ``DatasetDict`` and its ``split``, or a file path) as a ``Dataset``."""
    import datasets

    if isinstance(data, (str, os.PathLike)):
        return _load_file(Path(data).expanduser())
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            near = difflib.get_close_matches(split, list(data), n=1)
            raise ValueError(f"DatasetTask: {what} has no split {split!r}"
                             + (f"; did you mean {near[0]!r}?" if near else "") + f" (splits: {sorted(data)})")
        return data[split]
    if isinstance(data, datasets.Dataset):
        return data
    raise TypeError(f"DatasetTask: {what} must be a datasets.Dataset, a DatasetDict or a path to a "
                    f"{'/'.join(sorted(FILE_FORMATS))} file, got {type(data).__name__}")


def _check_columns(dataset, columns: dict[str, str | None], what: str) -> None:
    """``ValueError`` naming every named column ``dataset`` lacks (with a did-you-mean)."""
    have = list(dataset.column_names)
    for role, col in columns.items():
        if col is not None and col not in have:
            near = difflib.get_close_matches(col, have, n=1)
            raise ValueError(f"DatasetTask: {what} has no column {col!r} ({role})"
                             + (f"; did you mean {near[0]!r}?" if near else "") + f"; its columns: {have}")


def _is_conversation(value) -> bool:
    """A prompt in TRL's conversational format: a list of ``{"role", "content"}`` dicts."""
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m and "content" in m
                                                           for m in value)


def _number(value, func: str, index: int, prompt) -> float | None:
    """One value a reward function returned: ``None`` stays ``None``, a real number becomes a
    finite ``float``; anything else is a ``TypeError`` / ``ValueError`` naming the function and the
    sample."""
    if value is None:
        return None
    if not isinstance(value, numbers.Real) and hasattr(value, "item") and not isinstance(value, str):
        try:
            value = value.item()  # a one-element tensor or numpy array
        except (TypeError, ValueError, RuntimeError):
            pass
    where = f"for sample {index} (prompt {prompt!r:.120})"
    if not isinstance(value, numbers.Real):
        raise TypeError(f"reward function {func!r} returned {value!r:.60} ({type(value).__name__}) {where}; a reward "
                        "must be a real number, or None where the function does not apply")
    r = float(value)
    if not math.isfinite(r):
        raise ValueError(f"reward function {func!r} returned {r} {where}; a reward must be finite (return None where "
                         "the function does not apply)")
    return r


@dataclass(eq=False)
class DatasetTask:
    """A task over the rows of a dataset, rewarded by functions in TRL's ``GRPOTrainer`` shape.

    Each row is a :class:`~grpo_lab.tasks.Problem`: the prompt from ``prompt_column`` (text, or TRL's
    conversational ``[{"role", "content"}]``, written out by the tokenizer's ``apply_chat_template``), the answer
    ``str(row[answer_column])`` (``""`` without one), ``meta`` every column; :meth:`sample` draws rows with
    replacement. Once per generation round (:meth:`rewards`) each reward function is called as TRL calls it,
    ``func(prompts=..., completions=..., completion_ids=..., trainer_state=..., log_metric=..., log_extra=...,
    **columns)`` (conversational completions as assistant messages; ``completion_ids`` the sampled ids, EOS
    included; ``trainer_state`` a :class:`~grpo_lab.tasks.dataset_task.RewardTrainerState`; ``log_metric(name, value)`` a history column,
    ``log_extra(column, values)`` a column of the completions table; each column repeated per completion), and
    returns a real or ``None`` (does not apply) per completion. Async functions are awaited together after the
    others; a reward model (``nn.Module``, directory or hub id, with ``reward_processing_classes``) is a
    :class:`~grpo_lab.tasks.dataset_task.RewardModelFunc`; a function that raises gives a :class:`~grpo_lab.tasks.dataset_task.RewardFunctionError` naming it and the step. The reward is ``sum_f w_f r_f`` over those that applied (TRL's ``nansum``;
    none: 0 and a ``RuntimeWarning``). Departure from TRL: NaN / inf is an error, not "does not apply".
    Registered as ``"dataset"``: ``Trainer.resume`` rebuilds it when every field is JSON.

    Args:
        data: a ``datasets.Dataset``, a ``DatasetDict`` or a local ``.jsonl``/``.json``/``.parquet``/``.csv`` path.
        reward_funcs: a reward function or a sequence of them (callables or ``"module:function"``).
        prompt_column, answer_column: column names (``answer_column=None``: no answer).
        reward_weights: one finite weight per function; ``None``: 1 each.
        test: a fraction in (0, 1) held out (seed ``split_seed``), a split name, another path, or a ``Dataset``.
        test_size, train_split: at most this many test rows (the first); the ``DatasetDict`` split trained on.
        chat_template: ``None`` templates conversations only, ``True`` plain text too, ``False`` nothing.
        tokenizer: an object or a name (as :func:`grpo_lab.policy.models.load_policy`); ``None``: the trainer's.
        correct_reward, correct_threshold: correct when that reward (``None``: the total) is at least the threshold.
        reward_processing_classes: the tokenizer of each reward model (TRL's argument; a list, one per function,
            or one for all); ``None``: the model's own.

    Raises:
        TypeError: a field of the wrong type (e.g. a reward function neither callable nor a path).
        ValueError: a missing column or split, a bad suffix, mismatched weights, a bad ``test`` or ``correct_reward``,
            a reward function's parameter neither TRL's nor a column, a conversation with ``chat_template=False``.
        FileNotFoundError: a missing data file; a ``tokenizer`` name that is no checkpoint (when first needed).
    """

    data: Any
    reward_funcs: Any
    prompt_column: str = "prompt"
    answer_column: str | None = "answer"
    reward_weights: Sequence[float] | None = None
    test: Any = 0.1
    test_size: int | None = None
    split_seed: int = 0
    train_split: str = "train"
    max_new_tokens: int = 64
    chat_template: bool | None = None
    tokenizer: Any = None
    correct_reward: str | None = None
    correct_threshold: float = 1.0
    name: str = "dataset"
    reward_processing_classes: Any = None

    def __post_init__(self):
        funcs = self.reward_funcs
        funcs = list(funcs) if isinstance(funcs, (list, tuple)) else [funcs]
        if not funcs:
            raise ValueError("DatasetTask: reward_funcs is empty; give at least one reward function")
        procs = self.reward_processing_classes
        procs = list(procs) if isinstance(procs, (list, tuple)) else [procs] * len(funcs)
        self._funcs = [_resolve_func(f, i, procs[i] if i < len(procs) else None) for i, f in enumerate(funcs)]
        self._names = self._unique_names()
        self._weights = self._check_weights()
        if self.correct_reward is not None and self.correct_reward not in self._names:
            near = difflib.get_close_matches(str(self.correct_reward), self._names, n=1)
            raise ValueError(f"DatasetTask: correct_reward={self.correct_reward!r} is none of the reward functions"
                             + (f"; did you mean {near[0]!r}?" if near else "") + f" ({self._names})")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, numbers.Integral) \
                or self.max_new_tokens < 1:
            raise ValueError(f"DatasetTask: max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if self.chat_template not in (None, True, False):
            raise ValueError(f"DatasetTask: chat_template must be None, True or False, got {self.chat_template!r}")
        self._train, self._test = self._load_splits()
        columns = [c for c in self._train.column_names if c != self.prompt_column and c in self._test.column_names]
        self._needs_ids = {n: _check_signature(f, n, columns) for n, f in zip(self._names, self._funcs)}
        self._raw_prompts: dict[str, Any] = {}
        self._chat_tokenizer = None if isinstance(self.tokenizer, str) else self.tokenizer
        self._bound_tokenizer = None  # the trainer's (bind_tokenizer), used when tokenizer is None
        self._last: tuple | None = None  # (completions, problems, values) of the last call of every function
        self._test_problems: list[Problem] | None = None
        self._logs: dict = {"metrics": {}, "extra": {}}  # what the functions logged in the last call

    def _unique_names(self) -> list[str]:
        """The functions' names; a repeated name gets ``#2``, ``#3``... (two lambdas, say)."""
        names = []
        for f in self._funcs:
            base, k = reward_func_name(f), 2
            name = base
            while name in names:
                name, k = f"{base}#{k}", k + 1
            names.append(name)
        return names

    def _check_weights(self) -> list[float]:
        """The weights as floats, one per function (1 each when ``reward_weights`` is ``None``)."""
        if self.reward_weights is None:
            return [1.0] * len(self._funcs)
        w = list(self.reward_weights) if isinstance(self.reward_weights, (list, tuple, np.ndarray)) else None
        if w is None or len(w) != len(self._funcs):
            raise ValueError(f"DatasetTask: reward_weights must be a list of {len(self._funcs)} numbers, one per "
                             f"reward function ({self._names}), got {self.reward_weights!r}")
        bad = [x for x in w if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x)]
        if bad:
            raise ValueError(f"DatasetTask: reward_weights must be finite numbers, got {bad[0]!r}")
        return [float(x) for x in w]

    def _load_splits(self):
        """The train and test ``Dataset``s, with their columns checked."""
        import datasets

        train = _as_dataset(self.data, self.train_split, "data")
        columns = {"prompt_column": self.prompt_column, "answer_column": self.answer_column}
        _check_columns(train, columns, "data")
        t = self.test
        if isinstance(t, numbers.Real) and not isinstance(t, bool):
            if not 0 < t < 1:
                raise ValueError(f"DatasetTask: a test fraction must be in (0, 1), got {t!r}")
            if len(train) < 2:
                raise ValueError(f"DatasetTask: data has {len(train)} row(s): too few to hold out a test set")
            parts = train.train_test_split(test_size=float(t), seed=self.split_seed)
            train, test = parts["train"], parts["test"]
        elif isinstance(t, str) and Path(t).suffix.lower() not in FILE_FORMATS:
            if not isinstance(self.data, datasets.DatasetDict):
                raise ValueError(f"DatasetTask: test={t!r} is neither a file ending in {sorted(FILE_FORMATS)} nor a "
                                 "split (data is not a DatasetDict)")
            test = _as_dataset(self.data, t, "data")
        else:
            test = _as_dataset(t, "test", "test")
        _check_columns(test, columns, "the test rows")
        clash = sorted(set(train.column_names) & set(_RESERVED))
        if clash:
            raise ValueError(f"DatasetTask: the column(s) {clash} would clash with the reward functions' own "
                             f"arguments {_RESERVED}; rename them (Dataset.rename_column)")
        if self.test_size is not None:
            if isinstance(self.test_size, bool) or not isinstance(self.test_size, numbers.Integral) \
                    or self.test_size < 1:
                raise ValueError(f"DatasetTask: test_size must be an int >= 1 or None, got {self.test_size!r}")
            test = test.select(range(min(int(self.test_size), len(test))))
        for what, ds in (("the training rows", train), ("the test rows", test)):
            if len(ds) == 0:
                raise ValueError(f"DatasetTask: {what} are empty")
        return train, test

    # ------------------------------------------------------------------ prompts
    def bind_tokenizer(self, tokenizer) -> None:
        """Keep ``tokenizer`` (the policy's; ``Trainer(...)`` calls this, the task protocol's
        optional hook) for chat templates and ``completion_ids`` when the task was given no
        ``tokenizer`` of its own; with one, the task's own is used. Raises nothing."""
        self._bound_tokenizer = tokenizer

    def _tokenizer(self):
        """The tokenizer in use: ``tokenizer`` itself, the one it names (loaded on first use,
        :func:`_load_tokenizer_named`), else the bound one (:meth:`bind_tokenizer`), else ``None``."""
        if self._chat_tokenizer is None and isinstance(self.tokenizer, str):
            self._chat_tokenizer = _load_tokenizer_named(self.tokenizer)
        return self._chat_tokenizer if self._chat_tokenizer is not None else self._bound_tokenizer

    def chat_tokenizer(self):
        """The tokenizer that applies chat templates: ``tokenizer`` itself, the one it names
        (resolved and loaded as :func:`grpo_lab.policy.models.load_policy` does, on first use), or the
        one a trainer bound (:meth:`bind_tokenizer`).

        Raises:
            ValueError: no tokenizer was given, or it has no chat template.
            FileNotFoundError, OSError: a ``tokenizer`` name that cannot be resolved or loaded.
        """
        tok = self._tokenizer()
        if tok is None or not getattr(tok, "chat_template", None):
            raise ValueError("DatasetTask: a chat template is needed (conversational prompts or chat_template=True) "
                             + ("but no tokenizer was given: pass tokenizer=<the policy's tokenizer or its name> "
                                "(a Trainer hands the task its own)"
                                if tok is None else f"but the tokenizer {type(tok).__name__} has none"))
        return tok

    def format_prompt(self, cell, index: int | None = None) -> str:
        """The text the policy sees for one prompt cell (see the class docstring).

        Raises:
            ValueError: a conversation with ``chat_template=False``, or a cell that is neither
                text nor a conversation (``index`` names the row).
        """
        row = f" (row {index})" if index is not None else ""
        if isinstance(cell, str) and cell and not self.chat_template:
            return cell
        if isinstance(cell, str) and cell:
            messages = [{"role": "user", "content": cell}]
        elif _is_conversation(cell):
            if self.chat_template is False:
                raise ValueError(f"DatasetTask: the prompt{row} is a conversation, which needs a chat template; "
                                 "leave chat_template=None (or True) and pass tokenizer=")
            messages = cell
        else:
            raise ValueError(f"DatasetTask: the prompt{row} in column {self.prompt_column!r} must be non-empty text "
                             f"or a list of {{'role', 'content'}} messages, got {cell!r:.80}")
        return self.chat_tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _problem(self, row: dict, index: int) -> Problem:
        cell = row[self.prompt_column]
        text = self.format_prompt(cell, index)
        if text is not cell:
            self._raw_prompts[text] = cell
        answer = row.get(self.answer_column) if self.answer_column is not None else None
        meta = {k: v for k, v in row.items() if k != self.prompt_column}
        return Problem(text, "" if answer is None else str(answer), meta)

    # ------------------------------------------------------------------ the protocol
    def sample(self, n: int, rng: np.random.Generator) -> list[Problem]:
        """``n`` training rows drawn with replacement with ``rng.integers(len(train), size=n)``."""
        idx = rng.integers(len(self._train), size=n)
        return [self._problem(self._train[int(i)], int(i)) for i in idx]

    def test_set(self) -> list[Problem]:
        """The fixed test rows, in order (built once and kept)."""
        if self._test_problems is None:
            self._test_problems = [self._problem(self._test[i], i) for i in range(len(self._test))]
        return list(self._test_problems)

    def function_rewards(self, completions: Sequence[str], problems: Sequence[Problem], *,
                         completion_ids: Sequence[Sequence[int]] | None = None,
                         trainer_state: RewardTrainerState | None = None) -> dict[str, list]:
        """Every reward function's values on a batch, before weighting (each function called once; the async
        ones concurrently, after the others, as TRL runs them). What they log (``log_metric``, ``log_extra``)
        is kept for :meth:`reward_logs`.

        Args:
            completions: ``B`` decoded responses.
            problems: the ``B`` problems they answer (from :meth:`sample` / :meth:`test_set`).
            completion_ids: the ``B`` sampled token-id lists (EOS included, no padding), as TRL passes them;
                ``None``: the completions encoded with the task's tokenizer (no special tokens).
            trainer_state: passed as ``trainer_state``; ``None``: a zero :class:`~grpo_lab.tasks.dataset_task.RewardTrainerState`.

        Returns:
            ``{function name: [B] list of float or None}``, in the order of ``reward_funcs``.

        Raises:
            TypeError: a function returned something other than a list of ``B`` values, or a
                value that is neither a real number nor ``None`` (the message names the function,
                the sample index and its prompt).
            ValueError: a NaN or infinite value (same details), ``B`` differs between the
                arguments, or a function requires ``completion_ids`` and the task has no tokenizer.
            RewardFunctionError: a function raised (the message names it and the step).
        """
        table = self._values(completions, problems, self._names, completion_ids, trainer_state)
        self._last = (list(completions), list(problems), {k: list(v) for k, v in table.items()})
        return table

    def _values(self, completions: Sequence[str], problems: Sequence[Problem], names: Sequence[str],
                ids=None, state: RewardTrainerState | None = None) -> dict:
        """The values of the functions ``names`` on a batch (see :meth:`function_rewards`)."""
        if len(completions) != len(problems) or (ids is not None and len(ids) != len(problems)):
            raise ValueError(f"DatasetTask: {len(completions)} completions (and {'no' if ids is None else len(ids)} "
                             f"completion_ids) for {len(problems)} problems")
        funcs = dict(zip(self._names, self._funcs))
        state = state if state is not None else RewardTrainerState()
        metrics, extra = defaultdict(list), defaultdict(list)
        kwargs = self._reward_kwargs(list(completions), list(problems), ids)
        kwargs.update(trainer_state=state, log_metric=lambda name, value: metrics[name].append(float(value)),
                      log_extra=lambda column, values: extra[column].extend(_extra_values(column, values,
                                                                                          len(problems))))
        step = state.step + 1 if state.max_steps else None
        raw, pending = {}, []
        for name in names:
            if kwargs["completion_ids"] is None and self._needs_ids[name]:
                raise ValueError(f"DatasetTask: reward function {name!r} requires completion_ids, but the task has no "
                                 "tokenizer to encode the completions with: pass tokenizer=<the policy's tokenizer or "
                                 "its name>, or use the task through a Trainer (which hands it its own)")
            try:
                raw[name] = funcs[name](**kwargs)
            except Exception as exc:
                raise RewardFunctionError(name, step, exc) from exc
            if inspect.isawaitable(raw[name]):
                pending.append(name)
        if pending:
            async def awaited(name):
                try:
                    return await raw[name]
                except Exception as exc:
                    raise RewardFunctionError(name, step, exc) from exc
            raw.update(zip(pending, _run_coroutines([awaited(n) for n in pending])))
        self._logs = {"metrics": {k: float(np.mean(v)) for k, v in metrics.items() if v}, "extra": dict(extra)}
        return {name: self._checked(name, raw[name], kwargs["prompts"]) for name in names}

    def _checked(self, name: str, values, prompts: list) -> list:
        """One function's returned ``values`` as ``[B]`` floats or ``None`` (errors: :meth:`function_rewards`)."""
        n = len(prompts)
        if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
            values = values.tolist()  # a tensor or numpy array
        if not isinstance(values, (list, tuple)) or len(values) != n:
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else \
                f"{type(values).__name__} {values!r:.60}"
            raise TypeError(f"reward function {name!r} returned {got} for a batch of {n} "
                            "completions; it must return a list with one float (or None) per completion")
        return [_number(v, name, i, prompts[i]) for i, v in enumerate(values)]

    def reward_logs(self) -> dict:
        """What the reward functions logged in the last call of every function (:meth:`rewards`,
        :meth:`function_rewards`): ``{"metrics": {name: mean of the values given to log_metric},
        "extra": {column: the values given to log_extra, in call order}}`` (TRL averages ``log_metric``
        values over a logging step and puts ``log_extra`` columns in its completions table)."""
        return {"metrics": dict(self._logs["metrics"]), "extra": {k: list(v) for k, v in self._logs["extra"].items()}}

    @property
    def num_train_rows(self) -> int:
        """Rows of the training split (``RewardTrainerState.epoch`` counts passes over them)."""
        return len(self._train)

    def last_function_rewards(self, completions: Sequence[str], problems: Sequence[Problem]) -> dict | None:
        """The values of the last :meth:`function_rewards` / :meth:`rewards` call when it was on these very problems
        (the same objects, in order) and equal completions (``{name: [B] float or None}``), else ``None``."""
        table = self._cached(completions, problems)
        return None if table is None else {k: list(v) for k, v in table.items()}

    def _cached(self, completions: Sequence[str], problems: Sequence[Problem]) -> dict | None:
        """The values of the last :meth:`function_rewards` call when it was on these very problems
        (the same objects, in order) and equal completions, else ``None``."""
        if self._last is None:
            return None
        texts, probs, table = self._last
        if len(probs) != len(problems) or any(a is not b for a, b in zip(probs, problems)) \
                or list(completions) != texts:
            return None
        return table

    def _reward_kwargs(self, completions: list[str], problems: list[Problem], ids=None) -> dict:
        """The keyword arguments of a reward function call (TRL's names; see the class docstring), without
        ``trainer_state``, ``log_metric`` and ``log_extra``; ``ids``: the sampled ids (else re-encoded text)."""
        prompts = [self._raw_prompts.get(p.prompt, p.prompt) for p in problems]
        conv = [_is_conversation(c) for c in prompts]
        comps = [[{"role": "assistant", "content": t}] if c else t for t, c in zip(completions, conv)]
        tok = self._tokenizer()
        if ids is not None:
            ids = [[int(t) for t in row] for row in ids]
        elif tok is not None:
            ids = [tok(t, add_special_tokens=False).input_ids for t in completions]
        kwargs = {"prompts": prompts, "completions": comps, "completion_ids": ids}
        for col in dict.fromkeys(k for p in problems for k in p.meta):
            kwargs[col] = [p.meta.get(col) for p in problems]
        return kwargs

    def _totals(self, table: dict) -> tuple[list[float], list[int]]:
        """Per sample, ``sum_f w_f r_f`` over the functions that returned a number, and the
        indices of the samples for which none did (they get 0.0)."""
        n = len(next(iter(table.values())))
        totals, unscored = [], []
        for i in range(n):
            vals = [(w, col[i]) for w, col in zip(self._weights, table.values()) if col[i] is not None]
            if not vals:
                unscored.append(i)
            totals.append(float(sum(w * v for w, v in vals)))
        return totals, unscored

    def rewards(self, completions: Sequence[str], problems: Sequence[Problem], *,
                completion_ids: Sequence[Sequence[int]] | None = None,
                trainer_state: RewardTrainerState | None = None) -> list[float]:
        """The batched reward (the optional batched method of :class:`~grpo_lab.tasks.Task`): per
        sample, ``sum_f w_f r_f`` over the functions that returned a number (``None``: left out,
        as TRL's ``nansum``); a sample for which every function returned ``None`` gets 0.0 and a
        ``RuntimeWarning`` naming the first such sample. Calls every function once
        (:meth:`function_rewards`, whose values :meth:`correct` then reuses for the same batch).

        ``completion_ids``, ``trainer_state``: as :meth:`function_rewards` (the collection stage passes both).

        Returns:
            ``[B]`` list of finite floats.

        Raises:
            TypeError, ValueError, RewardFunctionError: as :meth:`function_rewards`.
        """
        totals, unscored = self._totals(self.function_rewards(completions, problems, completion_ids=completion_ids,
                                                              trainer_state=trainer_state))
        if unscored:
            i = unscored[0]
            warnings.warn(f"DatasetTask: every reward function returned None for {len(unscored)} of {len(problems)} "
                          f"samples, e.g. sample {i} (prompt {problems[i].prompt!r:.80}, completion "
                          f"{completions[i]!r:.80}); they get the reward 0 (as TRL's nansum)", RuntimeWarning,
                          stacklevel=2)
        return totals

    def reward(self, completion: str, problem: Problem) -> float:
        """:meth:`rewards` of one response (a batch of one)."""
        return self.rewards([completion], [problem])[0]

    def correct(self, completions: Sequence[str], problems: Sequence[Problem]) -> list[bool]:
        """Batched correctness (the optional batched method of :class:`~grpo_lab.tasks.Task`):
        whether the value of ``correct_reward`` (default: the weighted total, without the warning
        :meth:`rewards` gives) is at least ``correct_threshold`` (a ``None`` from that function:
        ``False``). Reuses the values of the last :meth:`rewards` / :meth:`function_rewards` call
        when it was on the same problems (the same objects) and completions; otherwise calls
        ``correct_reward`` alone (every function for the weighted total), once.

        Returns:
            ``[B]`` list of bools.

        Raises:
            TypeError, ValueError: as :meth:`function_rewards`.
        """
        table = self._cached(completions, problems)
        if table is None:
            names = self._names if self.correct_reward is None else [self.correct_reward]
            table = self._values(completions, problems, names)
        values = self._totals(table)[0] if self.correct_reward is None else table[self.correct_reward]
        return [v is not None and v >= self.correct_threshold for v in values]

    def is_correct(self, completion: str, problem: Problem) -> bool:
        """:meth:`correct` of one response (a batch of one)."""
        return self.correct([completion], [problem])[0]

    def fingerprint(self) -> dict:
        """What a checkpoint records (:func:`grpo_lab.tasks.base.task_fingerprint`): ``data`` and ``test``
        as :func:`grpo_lab.tasks.base.source_fingerprint` gives them (a file's sha256, a ``Dataset``'s content
        hash; ``test`` only when it is a file or a ``Dataset``), and each reward function's ``module:qualname``.
        Computed on the first call and kept. Raises ``OSError`` when a data file can no longer be read."""
        if getattr(self, "_fingerprint", None) is None:
            data = {k: fp for k, fp in (("data", source_fingerprint(self.data)), ("test", source_fingerprint(self.test)))
                    if fp is not None}
            self._fingerprint = {"data": data, "reward_funcs": [callable_name(f) for f in self._funcs]}
        return self._fingerprint


def _extra_values(column: str, values, n: int) -> list:
    """``values`` of a ``log_extra(column, values)`` call as a list of one value per completion; ``ValueError`` naming
    the column when the batch has another number of completions (TRL's completions table needs one each)."""
    values = list(values)
    if len(values) != n:
        raise ValueError(f"log_extra({column!r}, ...): {len(values)} values for a batch of {n} completions (one per "
                         "completion, as TRL's completions table needs)")
    return values
