"""Hygiene of the book's sources: notebooks, jupytext twins, table of contents, citations, build.

The committed ``book/*.ipynb`` are both the chapters and the nbval reference, so they must be a
clean fresh-kernel run (``python -m grpo_lab.lab.book execute book/NN_slug.ipynb``): valid, executed
top to bottom from count 1, no errors, PNG figures only, paired with an identical
``book/_py/NN_slug.py`` twin, and listed in ``book/_toc.yml``. The last test builds the whole
book with warnings as errors, exactly as CI does.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
TWINS = BOOK / "_py"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"

#: Bibliography keys that chapters rely on; renaming one breaks citations across the book.
REQUIRED_BIB_KEYS = {
    "shao2024deepseekmath",
    "deepseekai2025r1",
    "liu2025drgrpo",
    "deepseekai2025v32",
    "xie2025mhc",
    "shao2025deepseekmathv2",
    "zheng2025gspo",
    "minimax2025m1",
    "yue2025vapo",
    "yu2025dapo",
    "dong2025rpt",
    "schulman2016gae",
    "schulman2017ppo",
    "schulman2020kl",
    "ahmadian2024rloo",
    "williams1992reinforce",
}

#: A notebook file above this size almost certainly stores something it should not.
MAX_NOTEBOOK_BYTES = 3_000_000
#: Tags under which a cell may legitimately write to stderr (nbval does not compare it).
STDERR_OK_TAGS = {"nbval-ignore-output", "nbval-skip"}
#: Tags of cells that nbclient does not execute.
SKIPPED_TAGS = {"skip-execution"}

_EXCLUDED_PARTS = {"_build", "_py", ".ipynb_checkpoints", "__pycache__"}


def _book_files(suffix: str) -> list[Path]:
    """Book sources with ``suffix`` (recursively), ignoring build output, twins and checkpoints."""
    return sorted(
        p for p in BOOK.rglob(f"*{suffix}") if not _EXCLUDED_PARTS.intersection(p.relative_to(BOOK).parts)
    )


NOTEBOOKS = _book_files(".ipynb")
MARKDOWN = _book_files(".md")


def _docname(path: Path) -> str:
    """Sphinx document name of a book source: path relative to book/, no suffix, '/' separated."""
    return path.relative_to(BOOK).with_suffix("").as_posix()


def _read(path: Path):
    import nbformat

    return nbformat.read(path, as_version=4)


def _tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def _code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


notebook_param = pytest.mark.parametrize("path", NOTEBOOKS, ids=[_docname(p) for p in NOTEBOOKS])


# ---------------------------------------------------------------------------- table of contents


def _toc_entries() -> list[str]:
    """All ``root`` / ``file`` entries of book/_toc.yml, in order, without suffixes."""
    import yaml

    toc = yaml.safe_load((BOOK / "_toc.yml").read_text(encoding="utf-8"))
    assert toc.get("format") == "jb-book", "book/_toc.yml must use `format: jb-book`"
    entries = [toc["root"]]

    def walk(node) -> None:
        if isinstance(node, dict):
            if "file" in node:
                entries.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k not in ("root", "format")})
    return [re.sub(r"\.(md|ipynb)$", "", e) for e in entries]


def test_toc_entries_exist_and_are_unique():
    entries = _toc_entries()
    assert len(entries) == len(set(entries)), f"duplicate entries in _toc.yml: {entries}"
    for entry in entries:
        candidates = [BOOK / f"{entry}.md", BOOK / f"{entry}.ipynb"]
        found = [c for c in candidates if c.exists()]
        assert len(found) == 1, f"_toc.yml entry {entry!r}: expected exactly one of {candidates}, found {found}"


def test_every_book_source_is_in_the_toc():
    listed = set(_toc_entries())
    sources = {_docname(p) for p in NOTEBOOKS + MARKDOWN}
    missing = sorted(sources - listed)
    assert not missing, f"book sources not listed in book/_toc.yml (never rendered): {missing}"


def test_no_markdown_shares_a_basename_with_a_notebook():
    # Sphinx sees two files for one document name; fatal under -W.
    clash = sorted({_docname(p) for p in NOTEBOOKS} & {_docname(p) for p in MARKDOWN})
    assert not clash, f".md and .ipynb with the same name in book/: {clash}"


def _toc_chapters() -> list[str]:
    """The chapter-level entries of book/_toc.yml (each part's ``chapters``, not their ``sections``)."""
    import yaml

    toc = yaml.safe_load((BOOK / "_toc.yml").read_text(encoding="utf-8"))
    chapters = [c["file"] for part in toc.get("parts", []) for c in part.get("chapters", []) if "file" in c]
    chapters += [c["file"] for c in toc.get("chapters", []) if "file" in c]
    return [re.sub(r"\.(md|ipynb)$", "", c) for c in chapters]


#: ``{doc}`target``` or ``{doc}`text <target>```: a link to another page of the book.
_DOC_LINK = re.compile(r"\{doc\}`(?:[^`<]*<)?/?([^`>]+?)>?`")
#: How the intro names a chapter that does not exist yet: ``*planned* (`06_vapo`)``.
_PLANNED = re.compile(r"\*planned\*\s*\(`([^`]+)`\)")


def _intro_text() -> str:
    return _strip_code((BOOK / "intro.md").read_text(encoding="utf-8"))


def test_doc_link_and_planned_patterns():
    text = "{doc}`01_grpo`, {doc}`the API <api>`, {doc}`/references`; 6\\. VAPO, *planned* (`06_vapo`)"
    assert _DOC_LINK.findall(text) == ["01_grpo", "api", "references"]
    assert _PLANNED.findall(text) == ["06_vapo"]


def test_intro_links_every_chapter_and_only_pages_that_exist():
    """The intro's chapter list links each chapter of the table of contents, and nothing else.

    A chapter added to _toc.yml must be listed in the intro; a planned chapter must not be linked
    (it is named as ``*planned* (`NN_slug`)`` until its page exists).
    """
    linked = _DOC_LINK.findall(_intro_text())
    assert linked, "book/intro.md links no chapter with {doc}"
    not_in_toc = sorted(set(linked) - set(_toc_entries()))
    assert not not_in_toc, f"book/intro.md links pages that are not in book/_toc.yml: {not_in_toc}"
    unlisted = [c for c in _toc_chapters() if c not in linked]
    assert not unlisted, f"chapters of book/_toc.yml that book/intro.md does not list with {{doc}}: {unlisted}"


def test_intro_planned_chapters_do_not_exist_yet():
    """A chapter the intro marks as planned has no page; once written, move it to the linked list."""
    planned = _PLANNED.findall(_intro_text())
    entries = set(_toc_entries())
    written = sorted(p for p in planned if p in entries or (BOOK / f"{p}.ipynb").exists() or (BOOK / f"{p}.md").exists())
    assert not written, f"book/intro.md marks as planned chapters that exist: {written}; link them with {{doc}}"
    assert len(planned) == len(set(planned)), f"a planned chapter is named twice: {planned}"


# ---------------------------------------------------------------------------- notebooks


@notebook_param
def test_notebook_is_valid_nbformat(path: Path):
    import nbformat

    assert path.stat().st_size <= MAX_NOTEBOOK_BYTES, f"{path.name} is {path.stat().st_size} bytes"
    json.loads(path.read_text(encoding="utf-8"))
    nb = _read(path)
    nbformat.validate(nb)
    assert nb.nbformat == 4


@notebook_param
def test_notebook_kernelspec_is_python3(path: Path):
    spec = _read(path).metadata.get("kernelspec", {})
    assert spec.get("name") == "python3", f"{path.name}: kernelspec {spec!r}; execute with python -m grpo_lab.lab.book"
    assert spec.get("language", "python") == "python"


@notebook_param
def test_notebook_has_stored_outputs(path: Path):
    cells = _code_cells(_read(path))
    assert cells, f"{path.name} has no code cells"
    assert any(c.outputs for c in cells), f"{path.name} stores no outputs: execute it before committing"
    not_run = [i for i, c in enumerate(cells) if c.source.strip() and c.execution_count is None and not (_tags(c) & SKIPPED_TAGS)]
    assert not not_run, f"{path.name}: code cells {not_run} (0-based among code cells) were never executed"


@notebook_param
def test_notebook_execution_counts_are_a_fresh_run(path: Path):
    counts = [
        c.execution_count
        for c in _code_cells(_read(path))
        if c.source.strip() and not (_tags(c) & SKIPPED_TAGS)
    ]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..{len(counts)}; re-execute from a fresh kernel"
    )


@notebook_param
def test_notebook_has_no_error_outputs(path: Path):
    bad = [
        i
        for i, c in enumerate(_code_cells(_read(path)))
        if "raises-exception" not in _tags(c) and any(o.output_type == "error" for o in c.outputs)
    ]
    assert not bad, f"{path.name}: error outputs in code cells {bad} (tag `raises-exception` if intended)"


@notebook_param
def test_notebook_has_no_svg_outputs(path: Path):
    bad = [
        (i, key)
        for i, c in enumerate(_code_cells(_read(path)))
        for o in c.outputs
        for key in o.get("data", {})
        if key.endswith("image/svg+xml")
    ]
    assert not bad, f"{path.name}: inline SVG outputs {bad}; figures must be PNG (book.setup_notebook())"


@notebook_param
def test_notebook_writes_stderr_only_in_ignored_cells(path: Path):
    bad = [
        i
        for i, c in enumerate(_code_cells(_read(path)))
        if not (_tags(c) & STDERR_OK_TAGS)
        and any(o.output_type == "stream" and o.get("name") == "stderr" for o in c.outputs)
    ]
    assert not bad, (
        f"{path.name}: code cells {bad} write to stderr (warnings, progress bars); silence them or tag "
        f"the cell one of {sorted(STDERR_OK_TAGS)}"
    )


#: Tags under which nbval does not compare a cell's outputs.
UNCOMPARED_TAGS = {"nbval-ignore-output", "nbval-skip"}

# Numbers whose printed digits depend on the order of a float sum, i.e. on the BLAS / vector
# kernels the processor gets (MKL, ATen, numpy dispatch), so a fresh run on another CPU prints
# other digits and strict nbval fails:
#: a tiny residue in scientific notation, 1e-10 and below (where exact math gives 0) ...
_RESIDUE = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?[eE]-(?:1\d|[2-9]\d|\d{3,})\b")
#: ... unless it is a bound ("< 1e-12" is how a chapter should print a residue) ...
_BOUND_BEFORE = re.compile(r"(?:<|<=|≤)\s*$")
#: ... a negative zero, the sign of a residue rounded away ("-0.0", "-0.0000") ...
_NEGATIVE_ZERO = re.compile(r"(?<![\w.])-0(?:\.0+)?(?![\w.])")
#: ... or a decimal with a long tail: >= 10 significant digits or >= 10 decimals, e.g. the repr
#: of a float32 mean, 0.6449999809265137 (float32 has ~7 meaningful digits, float64 ~16).
_DECIMAL = re.compile(r"(?<![\w.])[-+]?(\d*)\.(\d+)(?:[eE][-+]?\d+)?(?![\w.])")
_LONG_TAIL_DIGITS = 10


def rounding_dependent_numbers(text: str) -> list[str]:
    """The numbers in ``text`` whose printed digits depend on float rounding (see above)."""
    found: dict[int, str] = {}
    for m in _RESIDUE.finditer(text):
        if not _BOUND_BEFORE.search(text[: m.start()]):
            found[m.start()] = m.group(0)
    for m in _NEGATIVE_ZERO.finditer(text):
        found[m.start()] = m.group(0)
    for m in _DECIMAL.finditer(text):
        integer, decimals = m.group(1), m.group(2)
        if len((integer + decimals).lstrip("0")) >= _LONG_TAIL_DIGITS or len(decimals) >= _LONG_TAIL_DIGITS:
            found.setdefault(m.start(), m.group(0))
    return [found[k] for k in sorted(found)]


@functools.lru_cache(maxsize=1)
def _sanitize_patterns() -> list:
    from nbval.plugin import get_sanitize_patterns

    return get_sanitize_patterns(SANITIZE.read_text(encoding="utf-8"))


def _compared_texts(cell) -> list[tuple[str, str]]:
    """``(stream name or mimetype, text)`` of each textual output, sanitized as nbval does."""
    texts = []
    for o in cell.outputs:
        if o.output_type == "stream":
            texts.append((o.get("name", "stream"), o.get("text", "")))
        elif o.output_type in ("execute_result", "display_data"):  # glue records included
            texts += [(k, v) for k, v in o.get("data", {}).items() if "image/" not in k and isinstance(v, str)]
    out = []
    for key, text in texts:
        for regex, replace in _sanitize_patterns():
            text = re.sub(regex, replace, text)
        out.append((key, text))
    return out


def test_rounding_dependent_number_detector():
    flagged = ["6.43e-17", "k1   7.71e-17  True", "-1.2E-16", "1e-10", "x = 3.3e-123", "-0.0", "-0.0000",
               "loss 0.6449999809265137", "0.30000000000000004", "1234567.891", "0.00000000012"]
    clean = ["1.28e+00", "1e-4", "eps=1e-06", "atol 1e-9", "k1   < 1e-12  True", "error <= 1e-15", "≤1e-10",
             "0.645 ± 0.012", "-0.0137", "-0.4999", "0.0", "338,016 parameters", "v2.13.0+cpu",
             "commit a30abb5e", "uuid 1b4e28ba-2fa1-11d2-883f", "17.1", "1.0000", "{16385: -0.000244}",
             "123456789", "e-10", "0.123456789"]
    for text in flagged:
        assert rounding_dependent_numbers(text), text
    for text in clean:
        assert not rounding_dependent_numbers(text), (text, rounding_dependent_numbers(text))


@notebook_param
def test_compared_outputs_print_no_rounding_dependent_numbers(path: Path):
    """No output that nbval compares prints digits that depend on the processor's float kernels.

    Float64 residues (``6.43e-17`` where exact math gives 0), negative zeros and long float tails
    change with the summation order, which MKL / oneDNN / ATen choose per processor, so a fresh
    clone on another CPU failed strict nbval. Assert such values instead, or print them at a
    precision that means something (``< 1e-12``, ``:.4f``); or tag the cell ``nbval-ignore-output``
    if its numbers are an experiment's results.
    """
    pytest.importorskip("nbval.plugin")
    bad = []
    for i, cell in enumerate(_code_cells(_read(path))):  # i: nbval's "Cell i"
        if _tags(cell) & UNCOMPARED_TAGS:
            continue
        for key, text in _compared_texts(cell):
            numbers = rounding_dependent_numbers(text)
            if numbers:
                bad.append(f"code cell {i} ({key}): {sorted(set(numbers))}")
    assert not bad, f"{path.name}: compared outputs print rounding-dependent numbers:\n  " + "\n  ".join(bad)


@notebook_param
def test_first_code_cell_is_hidden_colab_setup(path: Path):
    first = _code_cells(_read(path))[0]
    assert "remove-cell" in _tags(first), f"{path.name}: first code cell must be tagged `remove-cell`"
    assert "colab" in first.source.lower(), f"{path.name}: first code cell must be the Colab setup cell"


@notebook_param
def test_parameters_cell_defines_cpu_profile(path: Path):
    params = [c for c in _code_cells(_read(path)) if "parameters" in _tags(c)]
    assert len(params) == 1, f"{path.name}: expected one cell tagged `parameters`, found {len(params)}"
    assert re.search(r"^PROFILE\s*=\s*[\"']cpu[\"']", params[0].source, flags=re.MULTILINE), (
        f"{path.name}: the parameters cell must define PROFILE = \"cpu\" (the committed, CI profile)"
    )


def _cells_for_comparison(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    return [
        (c.cell_type, c.source.strip(), tuple(sorted(_tags(c))))
        for c in nb.cells
        if c.cell_type in ("code", "markdown", "raw")
    ]


@notebook_param
def test_jupytext_twin_matches_notebook(path: Path):
    import jupytext

    twin = TWINS / path.relative_to(BOOK).with_suffix(".py")
    assert twin.exists(), f"missing jupytext twin {twin.relative_to(ROOT)}; run `jupytext --sync {path.relative_to(ROOT)}`"
    nb_cells = _cells_for_comparison(jupytext.read(path))
    py_cells = _cells_for_comparison(jupytext.read(twin))
    for i, (a, b) in enumerate(zip(nb_cells, py_cells)):
        assert a == b, (
            f"{path.name} and {twin.name} differ at cell {i}:\n  ipynb: {a!r:.300}\n  py:    {b!r:.300}\n"
            "edit the .py, run `jupytext --sync`, re-execute the notebook"
        )
    assert len(nb_cells) == len(py_cells), f"{path.name}: {len(nb_cells)} cells, {twin.name}: {len(py_cells)} cells"


def test_every_twin_has_a_notebook():
    orphans = sorted(
        p.relative_to(ROOT).as_posix()
        for p in TWINS.rglob("*.py")
        if "__pycache__" not in p.parts and not (BOOK / p.relative_to(TWINS)).with_suffix(".ipynb").exists()
    )
    assert not orphans, f"jupytext twins without a notebook: {orphans}"


# ---------------------------------------------------------------------------- citations

_CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
_BIB_ENTRY = re.compile(r"^@(\w+)\s*\{\s*([^,\s]+)\s*,", re.MULTILINE)


def _strip_code(text: str) -> str:
    """Remove literal code blocks and ``double-backtick`` spans (examples of citation syntax).

    Fences whose info string starts with ``{`` are directives (notes, figures), whose content
    is parsed by MyST, so they are kept.
    """
    text = re.sub(r"^(`{3,}|~{3,})(?!\s*\{)[^\n]*\n.*?^\1\s*$", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"``.+?``", "", text)


def _bib_keys() -> list[str]:
    text = (BOOK / "references.bib").read_text(encoding="utf-8")
    return [key for kind, key in _BIB_ENTRY.findall(text) if kind.lower() not in ("comment", "string", "preamble")]


def _cited_keys() -> dict[str, set[str]]:
    """Map each cited key to the book files citing it (Markdown pages and notebook markdown cells)."""
    texts: list[tuple[str, str]] = [(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")) for p in MARKDOWN]
    for path in NOTEBOOKS:
        nb = _read(path)
        texts.append((path.relative_to(ROOT).as_posix(), "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")))
    cited: dict[str, set[str]] = {}
    for name, text in texts:
        for group in _CITE.findall(_strip_code(text)):
            for key in group.split(","):
                if key.strip():
                    cited.setdefault(key.strip(), set()).add(name)
    return cited


def test_bibliography_has_unique_and_required_keys():
    keys = _bib_keys()
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    assert not duplicates, f"duplicate keys in references.bib: {duplicates}"
    missing = sorted(REQUIRED_BIB_KEYS - set(keys))
    assert not missing, f"references.bib lacks keys the book relies on: {missing}"


def test_bibliography_parses():
    database = pytest.importorskip("pybtex.database")
    data = database.parse_file(str(BOOK / "references.bib"))
    for key, entry in data.entries.items():
        assert entry.fields.get("title"), f"{key}: no title"
        assert entry.fields.get("year"), f"{key}: no year"
        assert entry.persons.get("author"), f"{key}: no author"


def test_every_cited_key_is_in_the_bibliography():
    known = set(_bib_keys())
    unknown = {key: sorted(files) for key, files in _cited_keys().items() if key not in known}
    assert not unknown, f"cited keys missing from book/references.bib: {unknown}"


# ---------------------------------------------------------------------------- nbval sanitize file


def test_nbval_sanitize_file_covers_known_noise():
    plugin = pytest.importorskip("nbval.plugin")
    patterns = plugin.get_sanitize_patterns(SANITIZE.read_text(encoding="utf-8"))
    assert len(patterns) >= 5

    def clean(text: str) -> str:
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    assert clean("<Model object at 0x7f3a2c1d5e80>") == clean("<Model object at 0x55d1e2f3a4b0>")
    assert clean("step took 0.41 s (812 tok/s)") == clean("step took 0.38 s (845 tok/s)")
    assert clean(" 45%|####5     | 9/20 [00:01<00:01,  8.1it/s]") == clean(" 50%|#####     | 10/20 [00:01<00:02,  7.9it/s]")
    assert clean("/tmp/ipykernel_812/3051.py:4: UserWarning: x") == clean("/tmp/ipykernel_77/12.py:9: UserWarning: x")
    assert clean("iVBORw0KGgoAAAANSUhEUgAAAA\nBBBB") == clean("iVBORw0KGgoCCCC==")
    assert clean("3 seeds, 200 steps") == "3 seeds, 200 steps"


# ---------------------------------------------------------------------------- the build


@pytest.fixture(scope="module")
def built_book(stored_book_build) -> tuple[subprocess.CompletedProcess, Path]:
    """`jupyter-book build book --config _config.yml -W -n --keep-going` (CI's book build), run once per
    session (tests/conftest.py, shared with tests/repo/test_book_render.py).

    Returns the finished process and the HTML directory.
    """
    return stored_book_build


def test_book_builds_with_warnings_as_errors(built_book):
    """The build exits 0 and logs no warning (autodoc's and napoleon's included)."""
    proc, html = built_book
    log = proc.stdout + proc.stderr
    warnings = [line for line in log.splitlines() if "WARNING" in line and "Kernel is running over TCP" not in line]
    assert proc.returncode == 0 and not warnings, "book build failed:\n" + "\n".join(warnings or log.splitlines()[-60:])
    assert (html / "intro.html").exists()


# ---------------------------------------------------------------------------- the API reference

#: What a reader looks up first (issue 15): each must have an entry in the API reference.
API_MUST_DOCUMENT = [
    "grpo_lab.training.trainer.Trainer",
    "grpo_lab.training.trainer.Trainer.train",
    "grpo_lab.training.trainer.Trainer.save",
    "grpo_lab.training.trainer.Trainer.resume",
    "grpo_lab.training.trainer.TrainerConfig",
    "grpo_lab.algo.algorithms.Algorithm",
    "grpo_lab.algo.algorithms.GRPO",
    "grpo_lab.algo.objectives.policy_loss",
    "grpo_lab.algo.objectives.RATIOS",
    "grpo_lab.algo.objectives.SURROGATES",
    "grpo_lab.algo.objectives.AGGREGATIONS",
    "grpo_lab.algo.objectives.KL_ESTIMATORS",
    "grpo_lab.algo.objectives.k3",
    "grpo_lab.algo.advantages.ADVANTAGE_ESTIMATORS",
    "grpo_lab.policy.models.load_policy",
    "grpo_lab.policy.models.TinyConfig",
    "grpo_lab.tasks.Task",
    "grpo_lab.tasks.ArithmeticTask",
    "grpo_lab.tasks.TASKS",
    "grpo_lab.tasks.get_task",
    "grpo_lab.experiments.run",
    "grpo_lab.experiments.run_grid",
    "grpo_lab.experiments.PROFILES",
    "grpo_lab.experiments.plotting.band_plot",
]

_ID = re.compile(r'\bid="([^"]+)"')


def _api_pages(html: Path) -> dict[str, str]:
    """HTML of each API reference page (``book/api*.md``), by file name."""
    pages = {p.name: p.read_text(encoding="utf-8") for p in sorted(html.glob("api*.html"))}
    assert pages, f"no api*.html in {html}: the API reference was not built"
    return pages


def _api_ids(html: Path) -> set[str]:
    return {i for text in _api_pages(html).values() for i in _ID.findall(text)}


def _entry_text(html: Path, name: str) -> str:
    """The plain text of ``name``'s entry (signature and description) in the API reference."""
    for text in _api_pages(html).values():
        start = text.find(f'id="{name}"')
        if start >= 0:
            end = text.find("</dd>", start)
            return " ".join(re.sub(r"<[^>]+>", " ", text[start:end]).split())
    return ""


def _grpo_lab_modules() -> list:
    import importlib
    import pkgutil

    import grpo_lab

    names = [m.name for m in pkgutil.walk_packages(grpo_lab.__path__, "grpo_lab.") if "._" not in m.name]
    return [importlib.import_module(n) for n in sorted(names)]


def test_api_reference_documents_what_readers_look_up(built_book):
    _, html = built_book
    ids = _api_ids(html)
    missing = [name for name in API_MUST_DOCUMENT if name not in ids]
    assert not missing, f"the API reference has no entry for {missing}"
    # The entries carry the docstrings, not just a name: the first words of each summary line.
    import inspect

    from grpo_lab.algo import objectives
    from grpo_lab.training import trainer

    for name, obj in [("grpo_lab.training.trainer.Trainer.resume", trainer.Trainer.resume),
                      ("grpo_lab.algo.objectives.policy_loss", objectives.policy_loss)]:
        summary = " ".join(inspect.getdoc(obj).split("\n")[0].split()[:3])
        summary = re.sub(r":\w+:`~?([^`]+)`", r"\1", summary).replace("``", "")
        entry = _entry_text(html, name)
        assert summary.split("(")[0].strip() in entry, f"{name}: entry {entry[:200]!r} lacks its docstring {summary!r}"


def test_api_reference_covers_every_module_export_and_registry_entry(built_book):
    """Every module of grpo_lab has a section, and every name in a module's ``__all__`` (or, without
    one, every public function and class it defines) and every function of a registry (an
    upper-case dict of functions, e.g. ``KL_ESTIMATORS``) has an entry, under its own module or
    under a module that re-exports it (``grpo_lab.tasks.ArithmeticTask``).

    autodoc skips an object without a docstring, so this also checks that each has one.
    """
    import inspect

    _, html = built_book
    ids = _api_ids(html)
    modules = _grpo_lab_modules()
    no_section = [m.__name__ for m in modules if m.__name__ != "grpo_lab" and f"module-{m.__name__}" not in ids]
    assert not no_section, f"modules without a section in book/api*.md: {no_section}"

    def documented(obj, name: str) -> bool:
        return any(f"{m.__name__}.{name}" in ids for m in modules if getattr(m, name, None) is obj)

    missing = []
    for m in modules:
        if hasattr(m, "__all__"):
            names = list(m.__all__)
        else:
            names = [k for k, v in vars(m).items() if not k.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v))
                     and v.__module__ == m.__name__]
        missing += [f"{m.__name__}.{n}" for n in names if not documented(getattr(m, n), n)]
        for key, value in vars(m).items():
            if key.isupper() and not key.startswith("_") and isinstance(value, dict) and value \
                    and all(inspect.isfunction(f) for f in value.values()):
                missing += [f"{f.__module__}.{f.__name__} ({m.__name__}.{key}[{k!r}])" for k, f in value.items()
                            if f.__module__.startswith("grpo_lab") and not documented(f, f.__name__)]
    assert not missing, f"not in the API reference (add them to book/api*.md, or a docstring): {sorted(set(missing))}"
