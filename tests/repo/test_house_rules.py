"""The house rules of the package (design §4c), checked on the source: no function over 60 code
lines (docstrings, comments and blank lines not counted), and no import cycle between grpo_lab's
modules, counting every import (module level, inside functions and under ``TYPE_CHECKING``)."""

import ast
import io
import tokenize
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "grpo_lab"
LIMIT = 60


def _modules() -> dict[str, Path]:
    """``{dotted name: path}`` of every module of the package (``grpo_lab.x``, ``grpo_lab.training.y``)."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _code_lines(src: str, tree: ast.AST) -> set[int]:
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            code.update(range(tok.start[0], tok.end[0] + 1))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                code -= set(range(first.lineno, first.end_lineno + 1))
    return code


def function_sizes() -> list[tuple[int, str]]:
    """``(code lines, "module:line name")`` of every function and method of the package."""
    rows = []
    for name, path in _modules().items():
        src = path.read_text()
        tree = ast.parse(src)
        code = _code_lines(src, tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = sum(node.lineno <= line <= node.end_lineno for line in code)
                rows.append((n, f"{name}:{node.lineno} {node.name}"))
    return rows


def test_no_function_over_60_code_lines():
    sizes = function_sizes()
    assert len(sizes) > 300  # the walk found the package's functions
    too_long = sorted((r for r in sizes if r[0] > LIMIT), reverse=True)
    assert not too_long, f"functions over {LIMIT} code lines: {too_long}"


def imports(name: str, src: str, is_package: bool, modules=None):
    """``(line, dotted target)`` of every import statement anywhere in module ``name`` (source ``src``).
    ``from .x import y`` yields both ``pkg.x`` and ``pkg.x.y`` (``y`` may be a module); given the set of
    ``modules``, only the one of the two that is the module imported (``pkg.x.y`` when it is one)."""
    package = name if is_package else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                if modules is None:
                    yield from ((node.lineno, t) for t in (base, full))
                else:
                    yield node.lineno, full if full in modules else base
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)


def import_graph() -> dict[str, set[str]]:
    """``{module: the package modules it imports}``, from every import statement anywhere in it."""
    mods = _modules()
    graph = {m: set() for m in mods}
    for name, path in mods.items():
        for _, t in imports(name, path.read_text(), path.name == "__init__.py"):
            if t in mods and t != name:
                graph[name].add(t)
    return graph


def _cycle(graph: dict[str, set[str]]):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    graph = import_graph()
    assert "grpo_lab.algo.objectives" in graph["grpo_lab.algo.algorithms"]  # the walk sees the imports
    # a package's __init__ re-exporting its submodules is not a cycle with them: drop those edges
    for m in graph:
        if m.count(".") >= 1 and (PKG.parent / Path(*m.split("."))).is_dir():
            graph[m] = {n for n in graph[m] if not n.startswith(m + ".")}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    sources = "".join(p.read_text() for p in _modules().values())
    assert "TYPE_CHECKING" not in sources


@pytest.mark.parametrize("bad", [{"a": {"b"}, "b": {"a"}}, {"a": {"b"}, "b": {"c"}, "c": {"a"}}])
def test_the_cycle_finder_finds_cycles(bad):
    assert _cycle(bad) is not None and _cycle({"a": {"b"}, "b": set()}) is None


#: The wings of the package, lowest first: a module may import its own wing and the wings before it,
#: never one after it. ``paths`` holds where data lives; ``lab`` is the book's bench, which nothing
#: else imports (grpo_lab/lab/__init__.py states that contract).
WINGS = ("paths", "algo", "policy", "tasks", "training", "export", "experiments", "cli", "lab")
#: The one import that points up, and why: a rollout scores its samples against the task's ``Problem``.
UPWARD_ALLOWED = {("grpo_lab.policy.rollout", "grpo_lab.tasks.base")}


def wing(module: str) -> str:
    """The wing of a dotted module name: ``grpo_lab.algo.objectives`` -> ``algo``; the package's own
    ``__init__`` and ``__main__`` sit above every wing (``top``)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__",):
        return "top"
    if parts[1] not in WINGS:
        raise AssertionError(f"{module} is in no wing: put it in one of {WINGS} (tests/repo/test_house_rules.py)")
    return parts[1]


def wrong_way_imports(sources: dict[str, str]) -> list[str]:
    """``"module:line imports target (wing a -> wing b)"`` for every import of ``sources`` (``{dotted name:
    source}``) that points from a wing to a later one."""
    order = {w: i for i, w in enumerate(WINGS)} | {"top": len(WINGS)}
    packages = {m for m, p in _modules().items() if p.name == "__init__.py"}
    bad = []
    for name, src in sources.items():
        for line, t in sorted(set(imports(name, src, name in packages, modules=sources))):
            if not t.startswith("grpo_lab.") or (name, t) in UPWARD_ALLOWED:
                continue
            a, b = wing(name), wing(t)
            if order[b] > order[a]:
                bad.append(f"{name}:{line} imports {t} ({a} -> {b})")
    return bad


def test_imports_go_one_way_down_the_wings():
    sources = {m: p.read_text() for m, p in _modules().items()}
    assert {wing(m) for m in sources} == set(WINGS) | {"top"}  # every wing exists and every module is in one
    bad = wrong_way_imports(sources)
    assert not bad, "imports against the order of the wings " + " < ".join(WINGS) + ":\n" + "\n".join(bad)


def test_the_wing_rule_names_the_offending_line():
    # hand-made: an algorithm module importing the trainer, on its line 3
    sources = {m: "" for m in _modules()}
    sources["grpo_lab.algo.objectives"] = "import torch\n\nfrom ..training.trainer import Trainer\n"
    assert wrong_way_imports(sources) == [
        "grpo_lab.algo.objectives:3 imports grpo_lab.training.trainer (algo -> training)"]
    sources["grpo_lab.algo.objectives"] = "from ..paths import data_dir\nfrom . import hparams\n"
    assert wrong_way_imports(sources) == []
    sources["grpo_lab.experiments.runs"] = "def f():\n    from grpo_lab.lab import book\n"
    assert wrong_way_imports(sources) == ["grpo_lab.experiments.runs:2 imports grpo_lab.lab.book (experiments -> lab)"]
