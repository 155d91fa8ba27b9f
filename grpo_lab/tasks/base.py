"""The task protocol: what the trainer needs from a task, and a shared evaluator."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import numbers
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["Problem", "Task", "validate_task", "correctness", "save_problems", "load_problems", "file_sha256",
           "rows_sha256", "source_fingerprint", "callable_name", "task_fingerprint", "fingerprint_differences",
           "check_fingerprint"]


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer.

    Attributes:
        prompt: the text given to the policy (no special tokens).
        answer: the reference answer as a canonical string (e.g. ``"18"``).
        meta: task-specific facts used for analysis (e.g. ``{"n_terms": 4}``).
    """

    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@runtime_checkable
class Task(Protocol):
    """The task protocol: what :class:`grpo_lab.training.trainer.Trainer`, :func:`grpo_lab.policy.rollout.evaluate`
    and the checkpoints use from a task. Any object with these members is a task (no base class);
    ``Trainer(...)`` checks it with :func:`validate_task` (a ``TypeError`` naming every problem).

    Attributes:
        name: ``str``, not empty: its key in :data:`grpo_lab.tasks.TASKS` and a checkpoint's ``state.json``.
        max_new_tokens: ``int >= 1``, the generation budget in tokens (EOS included) unless the config sets one.

    Methods, deterministic given their arguments: ``sample(n, rng) -> list[Problem]`` (all randomness from the
    ``numpy.random.Generator`` ``rng``); ``reward(completion, problem) -> float`` (finite; parse, never ``eval``);
    ``is_correct(completion, problem) -> bool`` (raw correctness); ``test_set() -> list[Problem]`` (fixed).
    Optional: ``is_reasoning(completion) -> bool``, ``test_metrics(frame)`` / ``model_metrics(model) -> dict``
    (``test_<name>`` columns), ``extract_answer(completion) -> str | None`` (maj@k), ``answers_equivalent(a, b)
    -> bool`` (how maj@k groups two extracted answers; default: string equality), batched ``rewards`` /
    ``correct(completions, problems)``, ``bind_tokenizer(tokenizer)``, ``fingerprint() -> dict`` (what a
    checkpoint records of its data and reward functions, :func:`grpo_lab.tasks.base.task_fingerprint`). A guide: ``book/own_task.ipynb``.

    >>> import numpy as np
    >>> from dataclasses import dataclass
    >>> from grpo_lab.tasks import Problem, validate_task
    >>> @dataclass
    ... class ReverseTask:  # reverse a word
    ...     name: str = "reverse"
    ...     max_new_tokens: int = 8
    ...     def sample(self, n, rng):
    ...         return [Problem(w + "=", w[::-1]) for w in ("".join(rng.choice(list("abcd"), 4)) for _ in range(n))]
    ...     def is_correct(self, completion, problem): return completion == problem.answer
    ...     def reward(self, completion, problem): return float(self.is_correct(completion, problem))
    ...     def test_set(self): return self.sample(50, np.random.default_rng(12345))
    >>> validate_task(ReverseTask(), call=True)  # returns the task; TypeError listing any problem
    ReverseTask(name='reverse', max_new_tokens=8)
    """

    name: str
    max_new_tokens: int

    def sample(self, n: int, rng: np.random.Generator) -> list[Problem]: ...

    def reward(self, completion: str, problem: Problem) -> float: ...

    def is_correct(self, completion: str, problem: Problem) -> bool: ...

    def test_set(self) -> list[Problem]: ...


#: The methods of the protocol: name -> (the call, the number of positional arguments).
_METHODS = {
    "sample": ("sample(n, rng) -> list[Problem]", 2),
    "reward": ("reward(completion, problem) -> float", 2),
    "is_correct": ("is_correct(completion, problem) -> bool", 2),
    "test_set": ("test_set() -> list[Problem]", 0),
}
_OPTIONAL_METHODS = {"is_reasoning": ("is_reasoning(completion) -> bool", 1),
                     "test_metrics": ("test_metrics(frame) -> dict[str, float]", 1),
                     "model_metrics": ("model_metrics(model) -> dict[str, float]", 1),
                     "extract_answer": ("extract_answer(completion) -> str | None", 1),
                     "answers_equivalent": ("answers_equivalent(a, b) -> bool", 2),
                     "rewards": ("rewards(completions, problems) -> list[float]", 2),
                     "correct": ("correct(completions, problems) -> list[bool]", 2),
                     "bind_tokenizer": ("bind_tokenizer(tokenizer) -> None", 1),
                     "fingerprint": ("fingerprint() -> dict", 0)}


def _method_problems(owner, *, optional: bool) -> list[str]:
    """The protocol methods that ``owner`` (a task or a task class) lacks or cannot be called as
    the trainer calls them; optional methods only when present."""
    out = []
    for name, (call, n_args) in (_OPTIONAL_METHODS if optional else _METHODS).items():
        if not hasattr(owner, name):
            if not optional:
                out.append(f"missing method {call}")
            continue
        member = getattr(owner, name)
        if not callable(member):
            out.append(f"{name} must be a method {call}, got {type(member).__name__} {member!r:.60}")
            continue
        if isinstance(owner, type) and not isinstance(inspect.getattr_static(owner, name), (staticmethod, classmethod)):
            n_args += 1  # an unbound function on the class: self comes first
        try:
            sig = inspect.signature(member)
        except (TypeError, ValueError):  # no signature to read (a builtin): calling it will tell
            continue
        try:
            sig.bind(*([None] * n_args))
        except TypeError as exc:
            out.append(f"{name}{sig} cannot be called as {call} ({exc})")
    return out


def _is_problem_list(value, n: int | None = None) -> str | None:
    """``None`` when ``value`` is a list of :class:`Problem` with a non-empty ``str`` prompt and a
    ``str`` answer (of length ``n`` when given), else what is wrong."""
    if not isinstance(value, (list, tuple)):
        return f"returned {type(value).__name__}, not a list of Problem"
    if n is not None and len(value) != n:
        return f"returned {len(value)} problems, not {n}"
    for i, p in enumerate(value):
        if not isinstance(p, Problem):
            return f"item {i} is {type(p).__name__} {p!r:.60}, not a grpo_lab.tasks.Problem"
        if not isinstance(p.prompt, str) or not p.prompt or not isinstance(p.answer, str):
            return f"item {i} {p!r:.80} needs a non-empty str prompt and a str answer"
    return None


def validate_task(task, *, call: bool = False):
    """Check that ``task`` implements the task protocol (:class:`Task`); return it unchanged.

    The default check runs none of the task's code: ``name`` a non-empty ``str``, ``max_new_tokens``
    an ``int >= 1`` (not a bool), and the required (and present optional) methods callable with the
    arguments the trainer passes (checked on their signatures). ``Trainer(...)`` runs it.

    With ``call=True`` (for a task's author; the trainer never does it) it also calls them once:
    ``sample(2, rng)`` twice with a fresh ``numpy.random.default_rng(0)`` (the same two valid
    :class:`Problem` both times), ``reward`` (a finite real) and ``is_correct`` (a bool) on the first
    problem's answer, ``rewards`` / ``correct`` on a batch of one (equal to ``reward`` /
    ``is_correct``), and ``test_set()`` (a non-empty list of :class:`Problem`). A task that draws from a
    global RNG in ``sample`` advances it here.

    Args:
        task: the object to check.
        call: also call the methods as described above.

    Returns:
        ``task``.

    Raises:
        TypeError: ``task`` does not implement the protocol; the message lists every missing,
            ill-typed or ill-valued member (e.g. ``max_new_tokens=0``), and with ``call=True`` every
            method that raised or returned something of the wrong kind.
    """
    problems = []
    name = getattr(task, "name", None)
    if not hasattr(task, "name"):
        problems.append("missing attribute name: str (the task's registry and checkpoint name)")
    elif not isinstance(name, str) or not name:
        problems.append(f"name must be a non-empty str, got {name!r}")
    if not hasattr(task, "max_new_tokens"):
        problems.append("missing attribute max_new_tokens: int (the generation budget in tokens)")
    else:
        m = task.max_new_tokens
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 1:
            problems.append(f"max_new_tokens must be an int >= 1, got {m!r} ({type(m).__name__})")
    problems += _method_problems(task, optional=False) + _method_problems(task, optional=True)
    if call and not problems:
        problems += _call_problems(task)
    if problems:
        raise TypeError(f"{type(task).__name__} does not implement the task protocol (grpo_lab.tasks.Task):\n  - "
                        + "\n  - ".join(problems))
    return task


def _call_problems(task) -> list[str]:
    """What :func:`validate_task` with ``call=True`` finds wrong when it calls the methods."""
    out = []

    def attempt(what, fn):
        try:
            return True, fn()
        except Exception as exc:  # the task's own error, reported with the others
            out.append(f"{what} raised {type(exc).__name__}: {exc}")
            return False, None

    ok, first = attempt("sample(2, rng)", lambda: task.sample(2, np.random.default_rng(0)))
    if ok:
        wrong = _is_problem_list(first, 2)
        if wrong:
            out.append(f"sample(2, rng) {wrong}")
            ok = False
    if ok:
        ok2, again = attempt("sample(2, rng) (a second time)", lambda: task.sample(2, np.random.default_rng(0)))
        if ok2 and again != first:
            out.append("sample(2, rng) gave different problems for two generators with the same seed: draw every "
                       "random number from rng (not from random, np.random or torch), or resume is not exact")
        p = first[0]
        ok, r = attempt("reward(problem.answer, problem)", lambda: task.reward(p.answer, p))
        if ok:
            real = isinstance(r, numbers.Real) or (hasattr(r, "numel") and r.numel() == 1 and not isinstance(r, str))
            if not real or not math.isfinite(float(r)):
                out.append(f"reward(completion, problem) returned {r!r} ({type(r).__name__}), not a finite real number")
            elif hasattr(task, "rewards"):
                out += _batched_problems(task, p, float(r), attempt)
        ok, c = attempt("is_correct(problem.answer, problem)", lambda: task.is_correct(p.answer, p))
        if ok and not isinstance(c, (bool, np.bool_)):
            out.append(f"is_correct(completion, problem) returned {c!r} ({type(c).__name__}), not a bool")
        elif ok and hasattr(task, "correct"):
            out += _batched_correct_problems(task, p, bool(c), attempt)
    ok, test = attempt("test_set()", task.test_set)
    if ok:
        wrong = _is_problem_list(test) or (None if len(test) else "returned no problems")
        if wrong:
            out.append(f"test_set() {wrong}")
    return out


def _batched_problems(task, p: Problem, single: float, attempt) -> list[str]:
    """What is wrong with ``task.rewards([p.answer], [p])`` (the optional batched reward), given
    ``single``, the value of ``task.reward(p.answer, p)``."""
    ok, rs = attempt("rewards([problem.answer], [problem])", lambda: task.rewards([p.answer], [p]))
    if not ok:
        return []
    if not isinstance(rs, (list, tuple)) or len(rs) != 1 or not isinstance(rs[0], numbers.Real) \
            or not math.isfinite(float(rs[0])):
        return [f"rewards(completions, problems) returned {rs!r:.80} for one completion, not a list of one finite "
                "real number"]
    if float(rs[0]) != single:
        return [f"rewards([completion], [problem]) gave {float(rs[0])} but reward(completion, problem) {single}: "
                "the batched and the per-sample reward must agree"]
    return []


def _batched_correct_problems(task, p: Problem, single: bool, attempt) -> list[str]:
    """What is wrong with ``task.correct([p.answer], [p])`` (the optional batched correctness),
    given ``single``, the value of ``task.is_correct(p.answer, p)``."""
    ok, cs = attempt("correct([problem.answer], [problem])", lambda: task.correct([p.answer], [p]))
    if not ok:
        return []
    if not isinstance(cs, (list, tuple)) or len(cs) != 1 or not isinstance(cs[0], (bool, np.bool_)):
        return [f"correct(completions, problems) returned {cs!r:.80} for one completion, not a list of one bool"]
    if bool(cs[0]) != single:
        return [f"correct([completion], [problem]) gave {bool(cs[0])} but is_correct(completion, problem) {single}: "
                "the batched and the per-sample correctness must agree"]
    return []


def correctness(task, completions: Sequence[str], problems: Sequence[Problem]) -> list[bool]:
    """Whether each completion is correct: the task's optional batched ``correct(completions,
    problems)`` called once when it has one, else ``is_correct`` once per completion, in order
    (what the trainer and :func:`grpo_lab.policy.rollout.evaluate` use).

    Args:
        task: a :class:`Task`.
        completions: ``B`` decoded responses.
        problems: the ``B`` problems they answer.

    Returns:
        ``[B]`` list of python bools.

    Raises:
        TypeError: ``correct`` returned something other than a sequence of ``B`` bools (the
            message names the sample, its prompt and its completion).
    """
    completions, problems = list(completions), list(problems)
    if not hasattr(task, "correct"):
        return [bool(task.is_correct(t, p)) for t, p in zip(completions, problems)]
    values = task.correct(completions, problems)
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()  # a tensor or numpy array
    if not isinstance(values, (list, tuple)) or len(values) != len(completions):
        got = f"{len(values)} values" if isinstance(values, (list, tuple)) else f"{type(values).__name__} {values!r:.60}"
        raise TypeError(f"task.correct returned {got} for {len(completions)} completions; it must return a list of "
                        "one bool per completion, in order")
    for i, v in enumerate(values):
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"task.correct returned {v!r:.60} ({type(v).__name__}) for sample {i} (prompt "
                            f"{problems[i].prompt!r:.80}, completion {completions[i]!r:.80}); it must be a bool")
    return [bool(v) for v in values]


def save_problems(problems: Sequence[Problem], path: str | Path) -> None:
    """Write problems as JSON lines (``prompt``, ``answer``, ``meta``), one per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for p in problems:
            f.write(json.dumps(asdict(p), sort_keys=True) + "\n")


def load_problems(path: str | Path) -> list[Problem]:
    """Read problems written by :func:`save_problems`.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is not a JSON object with string ``prompt`` and ``answer``.
    """
    path = Path(path)
    out = []
    with path.open() as f:
        for k, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                prompt, answer = d["prompt"], d["answer"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"load_problems: {path}:{k} is not a problem record ({e})") from None
            if not isinstance(prompt, str) or not isinstance(answer, str):
                raise ValueError(f"load_problems: {path}:{k}: prompt and answer must be strings")
            out.append(Problem(prompt, answer, d.get("meta", {})))
    return out


# ------------------------------------------------------------------------------ fingerprints
def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, hex. Raises ``OSError`` when it cannot be read."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _jsonable(value):
    """A JSON stand-in for a cell value JSON cannot hold: bytes as hex, arrays and numpy scalars as
    lists and numbers, dates as ISO text, anything else as its ``repr``."""
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return repr(value)


def rows_sha256(rows, columns: Sequence[str] | None = None) -> str:
    """SHA-256 (hex) of rows of data, the same in every process: each row (a mapping, or a
    ``{column: [values]}`` batch) as JSON with sorted keys, in order, after the ``columns`` names.
    Raises nothing for JSON-able rows; other cells as hex (bytes), lists (arrays), ISO text (dates) or ``repr``."""
    h = hashlib.sha256(json.dumps(list(columns or [])).encode())
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, default=_jsonable, ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def source_fingerprint(source) -> dict | None:
    """What a fingerprint records of one data source: a path -> ``{"file": path, "sha256": bytes' hash}``;
    a ``datasets.Dataset`` -> ``{"dataset_sha256": its content's hash}`` (column names and rows, in
    order, 1000 rows at a time; ``Dataset._fingerprint`` is not used: it differs between processes for
    the same content); a ``DatasetDict`` -> the same over its splits, by name; anything else (a split
    name, a test fraction) -> ``None``.

    Raises:
        OSError: a path that cannot be read.
    """
    if isinstance(source, os.PathLike) or (isinstance(source, str) and os.path.isfile(os.path.expanduser(source))):
        path = os.path.expanduser(os.fspath(source))
        return {"file": path, "sha256": file_sha256(path)}
    if hasattr(source, "column_names") and hasattr(source, "num_rows"):
        if isinstance(source.column_names, dict):  # a DatasetDict
            return {"dataset_sha256": rows_sha256([{k: source_fingerprint(source[k])["dataset_sha256"]}
                                                   for k in sorted(source)])}
        if hasattr(source, "iter"):
            return {"dataset_sha256": rows_sha256(source.iter(batch_size=1000), source.column_names)}
    return None


def callable_name(func) -> str:
    """``"module:qualname"`` of a function, method or class; a ``functools.partial`` as
    ``"partial(module:qualname)"``; any other callable object by its class; a ``str`` (an import
    path, a model id) as it is. Raises nothing."""
    if isinstance(func, str):
        return func
    inner = getattr(func, "func", None)
    if inner is not None and callable(inner) and hasattr(func, "args"):
        return f"partial({callable_name(inner)})"
    inner = getattr(func, "__func__", func)  # a bound method: its function
    target = inner if hasattr(inner, "__qualname__") else type(inner)
    return f"{getattr(target, '__module__', '?')}:{target.__qualname__}"


def task_fingerprint(task) -> dict:
    """What a checkpoint records of a task's data and reward functions, compared on resume
    (:func:`grpo_lab.tasks.base.check_fingerprint`): ``{"data": {name: source_fingerprint-like dict}, "reward_funcs":
    [module:qualname, ...]}``. Without the task's optional ``fingerprint()``: no data and the
    qualified name of its ``reward`` method (a generated task's data follows from its fields, which
    the checkpoint holds); with it, its entries replace those. It raises what the task's
    ``fingerprint()`` raises (e.g. ``OSError`` for a data file gone).
    """
    out = {"data": {}, "reward_funcs": [callable_name(getattr(type(task), "reward", type(task)))]}
    own = task.fingerprint() if callable(getattr(task, "fingerprint", None)) else {}
    out.update({k: v for k, v in dict(own).items() if k in ("data", "reward_funcs")})
    return json.loads(json.dumps(out, default=_jsonable))


def fingerprint_differences(saved: dict, now: dict) -> list[str]:
    """What differs between two :func:`grpo_lab.tasks.base.task_fingerprint` results, one phrase each: a data file
    (another path or other bytes), a dataset's content, a data source added or dropped, the reward
    functions. ``[]`` when they agree. Raises nothing for two such dicts."""
    out = []
    old, new = saved.get("data") or {}, now.get("data") or {}
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name) or {}, new.get(name) or {}
        if a == b:
            continue
        if "file" in a and "file" in b:
            same = a["file"] == b["file"]
            out.append(f"data file {name!r}: {b['file']} (sha256 {str(b.get('sha256'))[:12]}) "
                       + (f"has other bytes than when saved (sha256 {str(a.get('sha256'))[:12]})" if same
                          else f"is not the saved {a['file']} (sha256 {str(a.get('sha256'))[:12]})"))
        elif "dataset_sha256" in a and "dataset_sha256" in b:
            out.append(f"dataset content {name!r}: sha256 {b['dataset_sha256'][:12]} (saved {a['dataset_sha256'][:12]})")
        else:
            out.append(f"data {name!r}: {json.dumps(b)[:120] or 'none'} (saved {json.dumps(a)[:120] or 'none'})")
    if list(saved.get("reward_funcs") or []) != list(now.get("reward_funcs") or []):
        out.append(f"reward functions {now.get('reward_funcs')} (saved {saved.get('reward_funcs')})")
    return out


def check_fingerprint(saved: dict | None, task, *, where: str, strict: bool = False) -> None:
    """Compare the fingerprint a checkpoint saved with ``task``'s (:func:`grpo_lab.tasks.base.task_fingerprint`), as
    ``Trainer.resume`` does: a ``RuntimeWarning`` naming each difference, or with ``strict`` a
    ``ValueError``. A checkpoint without one (saved before fingerprints) gets one ``UserWarning`` note
    and nothing is compared, strict or not.

    Args:
        saved: the checkpoint's ``fingerprint`` entry, or ``None``.
        task: the task the run continues with.
        where: the checkpoint, for the messages.
        strict: raise instead of warning.

    Raises:
        ValueError: ``strict`` and the fingerprints differ (the message names every difference).
        OSError: the task's data cannot be read to fingerprint it.
    """
    if not isinstance(saved, dict):
        warnings.warn(f"Trainer.resume: {where} records no fingerprint of its task's data and reward functions "
                      "(saved by an older grpo_lab); resuming without checking them", UserWarning, stacklevel=3)
        return
    diffs = fingerprint_differences(saved, task_fingerprint(task))
    if not diffs:
        return
    message = (f"Trainer.resume: the task's data or reward functions differ from those {where} was trained with: "
               + "; ".join(diffs))
    if strict:
        raise ValueError(message + " (strict=True refuses this; pass strict=False to continue with a warning)")
    warnings.warn(message + "; the run continues on the task given", RuntimeWarning, stacklevel=4)

