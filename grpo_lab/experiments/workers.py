"""The worker pool: ``spawn`` processes kept between calls, and what a worker must import.

:func:`~grpo_lab.experiments.map_workers` maps a function (a notebook's too) over items in the pool that
:func:`~grpo_lab.experiments.run` and :func:`~grpo_lab.experiments.run_grid` keep when
``n_jobs > 1``; :func:`~grpo_lab.experiments.shutdown_workers` stops it. A pool is reused while
the registries and the package's files are unchanged. The user modules that define a run's
registered choices and task are imported by each worker before it trains. Documented under
:mod:`grpo_lab.experiments`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from ..algo.algorithms import Algorithm
from .profiles import Profile

__all__ = ["map_workers", "shutdown_workers"]

#: The package's source tree (``grpo_lab/``): a reused worker must have imported these files as they are.
_PACKAGE = Path(__file__).resolve().parents[1]


_FRESH_REGISTRIES = ("Worker processes (n_jobs > 1) start with fresh registries: a choice or task registered in a "
                     "notebook cell or under `if __name__ == '__main__'` does not reach them. Register it at the top "
                     "level of a module (a .py file the notebook or script imports), or use n_jobs=1")


def _user_modules(algo: Algorithm, prof: Profile) -> tuple[str, ...]:
    """The importable modules outside ``grpo_lab`` that define the registry entries ``algo`` calls
    and the task class of ``prof`` (e.g. ``("reverse_task",)`` for a task registered by a module
    of the user's): a worker process imports them before it builds the run, which registers them
    there too. Code defined in ``__main__`` (a notebook cell, a script's main block) is left out."""
    from ..tasks import TASKS

    owners = [*algo.functions().values(), TASKS.get(prof.task)]
    names = {getattr(f, "__module__", None) for f in owners if f is not None}
    return tuple(sorted(m for m in names if m and m not in ("__main__", "__mp_main__")
                        and not (m == "grpo_lab" or m.startswith("grpo_lab."))))


def _module_roots(modules: Sequence[str]) -> tuple[tuple[str, str | None], ...]:
    """``(name, root)`` for each module name: ``root`` the ``sys.path`` directory this process imported
    it from (the directory of ``reverse_task.py`` for ``reverse_task``, the parent of ``pkg/`` for
    ``pkg.mod``), ``None`` when unknown (not imported, or no file). A worker puts ``root`` on its
    ``sys.path`` when it cannot import the name otherwise: a module the caller imported from a file
    path (``python -m grpo_lab --import path/to/my_task.py``) whose directory is not on the
    worker's path."""
    import sys

    out = []
    for name in modules:
        file = getattr(sys.modules.get(name), "__file__", None)
        root = None
        if file:
            path = Path(os.path.abspath(file))
            depth = name.count(".") + (1 if path.name == "__init__.py" else 0)
            root = str(path.parents[depth])
        out.append((name, root))
    return tuple(out)


def _import_user_module(module: str | tuple[str, str | None]) -> None:
    """Import ``module`` (a name, or ``(name, root)`` from :func:`_module_roots`): by name, and if
    that module itself is not found, once more with ``root`` put first on ``sys.path``.

    Raises:
        ValueError: the module cannot be imported (the message names it and says what to do).
    """
    import importlib
    import sys

    name, root = (module, None) if isinstance(module, str) else module
    try:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if root is None or root in sys.path or exc.name not in (name, name.split(".")[0]):
                raise
            sys.path.insert(0, root)
            importlib.invalidate_caches()
            importlib.import_module(name)
    except ImportError as exc:
        raise ValueError(f"run: cannot import {name!r}, which defines the task or a choice of this run, in a "
                         f"worker process ({exc}). {_FRESH_REGISTRIES}") from None


def map_workers(fn, items: Sequence[Any], n_jobs: int = 1) -> list[Any]:
    """``[fn(item) for item in items]``, in the worker processes that :func:`run` and :func:`run_grid`
    keep between calls when ``n_jobs > 1``. For work that is not a trainer run (e.g.
    :func:`grpo_lab.lab.pretrain.continued_ntp_run`).

    With ``n_jobs > 1`` and several items, a function from ``__main__`` (a notebook, a script), a
    lambda or a local function travels *by value* (``cloudpickle``, with a copy of the globals it
    uses, taken now) into a fresh ``spawn`` interpreter: it sees no later change to them and changes
    nothing here (return what you need). Items and results travel by ``cloudpickle`` too. With
    ``n_jobs=1`` or one item, ``fn`` runs here. A script read from stdin cannot start ``spawn``
    workers; save it to a file (with an ``if __name__ == "__main__":`` guard).

    Args:
        fn: a callable of one item: an importable function, a ``functools.partial`` of one, or a
            function defined in a notebook cell (by value).
        items: one argument per call.
        n_jobs: worker processes (``1``: in this process).

    Returns:
        The results, in the order of ``items``.

    Raises:
        ValueError: ``n_jobs < 1``.
        RuntimeError: with ``n_jobs > 1``, called by a script's top-level code outside its
            ``if __name__ == "__main__":`` guard (each spawned worker would run it again).
        TypeError: with ``n_jobs > 1``, ``fn`` (or a global it uses), an item or a result cannot be
            pickled (the message says which).
        Exception: whatever ``fn`` raises, after the workers are stopped; one whose class cannot travel
            back arrives as a ``RuntimeError`` with its class, message and the worker's traceback.
    """
    if not isinstance(n_jobs, int) or isinstance(n_jobs, bool) or n_jobs < 1:
        raise ValueError(f"map_workers: n_jobs must be an int >= 1, got {n_jobs!r}")
    items = list(items)
    if n_jobs == 1 or len(items) <= 1:
        return [fn(item) for item in items]
    import functools
    import pickle

    import cloudpickle

    try:
        payload = cloudpickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise TypeError(f"map_workers: fn cannot be sent to a worker process ({exc}): it, or a global or closure "
                        "variable it uses, cannot be pickled; pass what it needs as arguments, or use "
                        "n_jobs=1") from None
    sent = []
    for i, item in enumerate(items):
        try:
            sent.append(cloudpickle.dumps(item))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise TypeError(f"map_workers: item {i} ({type(item).__name__}) cannot be sent to a worker process "
                            f"({exc}); pass plain data, or use n_jobs=1") from None
    pool = _worker_pool(n_jobs)
    call = functools.partial(_call_pickled, payload)
    futures = [pool.submit(call, item) for item in sent]
    try:
        return [cloudpickle.loads(f.result()) for f in futures]
    except BaseException:
        shutdown_workers(now=True)
        raise


_LOADED: dict[str, Any] = {}


def _call_pickled(payload: bytes, item: bytes) -> bytes:
    """In a worker: ``fn(item)`` for the function ``cloudpickle`` wrote as ``payload`` (loaded once per
    worker and payload: a function's globals are copied once, not once per item) and the item it wrote
    as ``item``; the result as ``cloudpickle`` bytes.

    Raises:
        what ``fn`` raises; ``RuntimeError`` (with the class, message and traceback) in its place when
        its class cannot travel back to the caller; ``TypeError`` for a result that cannot be pickled.
    """
    import hashlib
    import pickle
    import traceback

    import cloudpickle

    key = hashlib.sha256(payload).hexdigest()
    if key not in _LOADED:
        _LOADED.clear()  # one map's function at a time
        _LOADED[key] = cloudpickle.loads(payload)
    try:
        result = _LOADED[key](cloudpickle.loads(item))
    except Exception as exc:
        try:
            pickle.loads(pickle.dumps(exc))  # what the pool does to send it back
        except Exception:
            raise RuntimeError(f"map_workers: fn raised {type(exc).__qualname__}: {exc} (its class cannot travel back "
                               f"from the worker process; the worker's traceback:\n{traceback.format_exc()})") from None
        raise
    try:
        return cloudpickle.dumps(result)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise TypeError(f"map_workers: fn's result ({type(result).__name__}) cannot be sent back from the worker "
                        f"process ({exc}); return plain data (numbers, arrays, tensors, data frames)") from None


def _worker_init(parent_pid: int | None = None) -> None:
    """Worker processes ignore SIGINT: a Ctrl-C (or a Jupyter kernel's interrupt or shutdown, sent
    to the whole process group) reaches the caller, which stops the workers itself
    (:func:`shutdown_workers`), instead of every idle worker printing a traceback. SIGTERM stops a run
    after its step in progress and a checkpoint, and does nothing between runs (:func:`_sigterm_between_runs`;
    the caller forwards it). And they exit when
    the process that started them (``parent_pid``) is gone without stopping them: a Jupyter kernel
    ends with ``os._exit`` when its client has exited, which runs no ``atexit`` handler, and an idle
    worker would otherwise wait for work for ever (about 0.7 GB each)."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _sigterm_between_runs)
    if parent_pid is not None:
        threading.Thread(target=_exit_with_parent, args=(parent_pid,), name="grpo_lab-parent-watch",
                         daemon=True).start()


def _sigterm_between_runs(signum, frame) -> None:
    """A worker's SIGTERM handler: between runs nothing (the parent forwards a SIGTERM to every worker, then
    stops the pool itself); while a run trains, :class:`grpo_lab.training.trainer.Trainer` installs its own (the
    step in progress, a checkpoint, ``Terminated``), which the mark ``defers_to_trainer`` allows."""


_sigterm_between_runs.defers_to_trainer = True


def _exit_with_parent(parent_pid: int, interval_s: float = 1.0) -> None:
    """Exit this worker at once when its parent ``parent_pid`` has gone (the worker re-parented),
    checked every ``interval_s`` seconds."""
    import time

    while os.getppid() == parent_pid:
        time.sleep(interval_s)
    os._exit(0)


_POOL: dict[str, Any] = {"executor": None, "key": None, "atexit": False}


def _pool_key(n_jobs: int) -> str:
    """What a reused worker must share with this process: the worker count, every registry's entries
    (workers start with the registries their imports make, so a choice registered here since the
    pool started must get fresh workers, which then fail with the clear message of
    :func:`_train_one` if it is not importable) and the package's source files (size and
    modification time: an edited package must not be run by workers that imported the old one)."""
    from ..algo import advantages, objectives, selection as sampling
    from ..tasks import TASKS

    regs = {name: sorted((k, getattr(v, "__module__", "?"), getattr(v, "__qualname__", repr(v)))
                         for k, v in reg.items())
            for name, reg in (("advantages", advantages.ADVANTAGE_ESTIMATORS), ("ratios", objectives.RATIOS),
                              ("surrogates", objectives.SURROGATES), ("aggregations", objectives.AGGREGATIONS),
                              ("kl", objectives.KL_ESTIMATORS), ("selectors", sampling.SELECTORS), ("tasks", TASKS))}
    src = _PACKAGE
    files = [(str(f.relative_to(src)), f.stat().st_size, f.stat().st_mtime_ns)
             for f in sorted(src.rglob("*.py")) if "__pycache__" not in f.parts]
    return json.dumps([n_jobs, regs, files], sort_keys=True)


def _is_main_guard(node) -> bool:
    """Whether the top-level statement ``node`` (an ``ast`` node) is ``if __name__ == "__main__":``."""
    import ast

    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.comparators) != 1:
        return False
    sides = [node.test.left, node.test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    consts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return isinstance(node.test.ops[0], ast.Eq) and names == ["__name__"] and consts == ["__main__"]


def _unguarded_main_statement() -> tuple[str, int] | None:
    """``(script, line)`` of the top-level statement of the ``__main__`` script that is running now, when it is
    not an ``if __name__ == "__main__":`` block; ``None`` when it is, and for a notebook, an interactive
    session, ``python -c`` or a package's ``__main__`` module. A ``spawn`` worker imports a script (as
    ``__mp_main__``) before it takes work, running every top-level statement outside that guard: the one found
    here would start worker processes again while the worker is still starting, and the pool would break."""
    import ast
    import sys

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if not path or not str(path).endswith(".py") or (spec is not None and spec.name.endswith("__main__")):
        return None
    frame = sys._getframe()
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:
        return None
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    line = frame.f_lineno
    for node in tree.body:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            return None if _is_main_guard(node) else (str(path), line)
    return None


def _guard_message(where: str) -> str:
    return (f"{where}: n_jobs > 1 starts worker processes ('spawn') that import the script again and would run this "
            "call again: put the script's top-level code under `if __name__ == \"__main__\":` (or use n_jobs=1)")


def _refuse_unguarded_main() -> None:
    """Raise the one-line :func:`_guard_message` where the pool cannot start: called from a script's top-level
    code outside its ``__main__`` guard (:func:`_unguarded_main_statement`), or in a worker process that is
    still importing the main module (then the parent's pool would break)."""
    import multiprocessing as mp

    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(_guard_message("a worker process importing the main script"))
    found = _unguarded_main_statement()
    if found is not None:
        raise RuntimeError(_guard_message(f"{Path(found[0]).name}, line {found[1]} (outside the __main__ guard)"))


def _worker_pool(n_jobs: int):
    """The process pool of :func:`_map`, kept between calls: starting a worker (a fresh ``spawn``
    interpreter importing torch and transformers, then loading its first checkpoint) costs several
    seconds, once per worker instead of once per call. A pool is reused only while
    :func:`_pool_key` is unchanged; otherwise it is shut down and a new one started."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    _refuse_unguarded_main()
    key = _pool_key(n_jobs)
    pool = _POOL["executor"]
    if pool is not None and (_POOL["key"] != key or getattr(pool, "_broken", False)):
        shutdown_workers()
        pool = None
    if pool is None:
        pool = ProcessPoolExecutor(max_workers=n_jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                                   initargs=(os.getpid(),))
        _POOL.update(executor=pool, key=key)
        if not _POOL.get("atexit"):  # stop the workers while the interpreter is still whole
            import atexit

            atexit.register(shutdown_workers)
            _POOL["atexit"] = True
    return pool


def shutdown_workers(now: bool = False) -> None:
    """Stop the worker processes that :func:`run` and :func:`run_grid` keep between calls with
    ``n_jobs > 1`` (they also stop when this interpreter exits). Frees their memory; the next
    parallel call starts new ones.

    Args:
        now: terminate the workers at once, abandoning the runs they are training (what a failed
            or interrupted call does); by default, wait for them to finish their current run.
    """
    pool, _POOL["executor"], _POOL["key"] = _POOL["executor"], None, None
    if pool is None:
        return
    if now:
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            if proc.is_alive():
                proc.kill()  # not SIGTERM: a worker would finish its step and write a checkpoint first
        for proc in processes:
            proc.join(timeout=10)
    else:
        pool.shutdown(wait=True, cancel_futures=True)
