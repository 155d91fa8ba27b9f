"""The house rules of the package (design §4c), checked on the source: no function over 60 code
lines (docstrings, comments and blank lines not counted), and no import cycle between grpo_lab's
modules, counting every import (module level, inside functions and under ``TYPE_CHECKING``)."""

import ast
import io
import tokenize
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "grpo_lab"
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


def import_graph() -> dict[str, set[str]]:
    """``{module: the package modules it imports}``, from every import statement anywhere in it."""
    mods = _modules()
    graph = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
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
    assert "grpo_lab.objectives" in graph["grpo_lab.algorithms"]  # the walk sees the imports
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
