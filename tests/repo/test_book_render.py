"""The built book reads offline: every page opened in headless Chromium with the network cut off.

The book is built from the outputs stored in the notebooks (as ``make book-stored`` does), then
each page of ``book/_toc.yml`` is opened from disk (``file://``, as a reader opens
``_build/html/index.html``) in headless Chromium whose host resolver answers NOTFOUND for every
name and whose proxy is a closed local port, so nothing can come from the network. After
``MathJax.startup.promise`` (MathJax has typeset the page) and ``document.fonts.ready``, a page
fails when

* raw ``\\(``, ``\\[`` or ``$$`` is left in its text outside code blocks (math not typeset: with
  MathJax from a CDN every equation showed as LaTeX source offline),
* a ``.math`` element holds no MathJax output, or MathJax shows an error or an undefined macro
  (red ``\\name``, i.e. the ``mathjax3_config`` macros of ``_config.yml`` did not apply),
* MathJax or one of its fonts was loaded from anywhere but the build, or a font failed to load,
* an image did not load (``naturalWidth == 0``),
* the browser console logged an error (failed loads included), except the one upstream message
  in ``KNOWN_CONSOLE_ERRORS``,
* a visible line of text looks like a raw Markdown pipe table (``| a | b |`` or ``|---|``): a
  table printed as text instead of rendered (the scale-out page's tables, while myst-nb rendered
  ``text/markdown`` outputs as CommonMark, which has no tables),
* a display equation is wider than its column (at the 1280 px desktop width): its box extends past
  the MathJax container or the column, or under its equation number, or it needs scrolling to be
  read (wide equations were cut at the column's edge, beside their number, in chapters 1-6).
  ``book/_static/math_fit.js`` fits them; at 800 px (``test_wide_equations_at_a_narrow_width``) an
  equation may instead scroll inside its own box, but never overlap its number or leave the column.
* a table is wider than the column without a box between them that scrolls sideways and stays inside the column
  (a cell's pandas table, a Markdown table: chapter 8's and the scale-out page's wide tables;
  ``book/_static/wide_tables.css`` gives their boxes a permanent scrollbar).

Chromium is driven by Selenium through Debian's ``chromedriver`` (packages ``chromium`` and
``chromium-driver``; ``.ci/run`` installs them). Without them the tests skip, except under CI
(``CI`` set), where they fail. ``BOOK_RENDER_HTML=_build/html pytest tests/repo/test_book_render.py``
checks an existing build instead (e.g. the executed book of ``make book``).

The same build also checks the numbering: chapter k's figures, tables and equations are k.1, k.2,
... (numbered parts of ``book/_toc.yml``), and the front and back matter shift no number.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
CONFIG = ROOT / "_config.yml"

#: Console errors that are not the book's doing. Sphinx 7.4 (the newest that jupyter-book 1.x
#: allows) writes an inline script registered after builder start twice (once with filename None,
#: once with ''), so sphinx-thebe's ``const THEBE_JS_URL = ...`` config line is declared twice on
#: every page; the second copy throws. Thebe is off in this book, so nothing depends on it.
KNOWN_CONSOLE_ERRORS = (re.compile(r"Uncaught SyntaxError: Identifier 'THEBE_JS_URL' has already been declared"),)

#: Seconds for a page to load and for MathJax to typeset it (each takes ~1 s on 2 cores).
PAGE_TIMEOUT_S = 60

#: Page functions shared by the checks below (defined in the page before the checks run).
_PAGE_FUNCTIONS_JS = r"""
// Visible lines of text that look like a raw Markdown pipe table: a row `| a | b |` (two cells or
// more) or a delimiter row `|---|` / `|:--|`. innerText is what a reader sees (hidden and
// collapsed elements excluded); a rendered table's cells come out tab-separated, without pipes.
function pipeTableLines() {
  const root = document.querySelector("main") || document.body;
  const row = /^\s*\|[^|\n]*[^|\s\\][^|\n]*\|[^|\n]*\|/, rule = /^\s*\|?\s*:?-{3,}:?\s*\|/;
  return root.innerText.split("\n").filter((l) => row.test(l) || rule.test(l)).map((l) => l.trim().slice(0, 100));
}
// Each display equation's geometry: its rendered math (mjx-math) against its MathJax container,
// its div.math (the column's width) and its number (span.eqno).
function displayMathBoxes() {
  const out = [];
  for (const div of document.querySelectorAll("div.math")) {
    const box = div.querySelector('mjx-container[display="true"]');
    const math = box && box.querySelector("mjx-math");
    if (!math) continue;
    const R = (el) => el.getBoundingClientRect();
    const d = R(div), b = R(box), m = R(math), number = div.querySelector(".eqno");
    const column = div.parentElement ? R(div.parentElement) : d;
    const style = getComputedStyle(box);
    const scrolls = ["auto", "scroll"].includes(style.overflowX) && box.scrollWidth > box.clientWidth + 1;
    // the part of the math a reader sees: clipped by a scrolling container
    const left = scrolls ? Math.max(m.left, b.left) : m.left, right = scrolls ? Math.min(m.right, b.right) : m.right;
    let overlap = 0;
    if (number) {
      const n = R(number);
      const dx = Math.min(right, n.right) - Math.max(left, n.left), dy = Math.min(m.bottom, n.bottom) - Math.max(m.top, n.top);
      overlap = dx > 1 && dy > 1 ? Math.round(dx) : 0;
    }
    out.push({
      id: div.id || box.textContent.slice(0, 40),
      math_width: Math.round(m.width), box_width: box.clientWidth,
      fits: m.left >= b.left - 1 && m.right <= b.right + 1 && box.scrollWidth <= box.clientWidth + 1,
      in_column: b.left >= column.left - 1 && b.right <= column.right + 1 && d.right <= column.right + 1,
      scrolls, overlap,
    });
  }
  return out;
}
// Tables a reader cannot read whole: wider than the page's column (article.bd-article) without a box between
// them that scrolls sideways (overflow-x auto / scroll) and itself stays inside the column. MathJax's own
// tables are left out (display equations are displayMathBoxes' business).
function wideTables() {
  const column = document.querySelector("article.bd-article") || document.body;
  const c = column.getBoundingClientRect(), out = [];
  const inside = (r) => r.left >= c.left - 2 && r.right <= c.right + 2;  // a border's sub-pixel overhang is no overflow
  for (const table of document.querySelectorAll("table")) {
    const t = table.getBoundingClientRect();
    if (table.closest("mjx-container") || t.width === 0 || inside(t)) continue;
    let scroller = null;
    for (let e = table.parentElement; e && e !== column && !scroller; e = e.parentElement) {
      if (["auto", "scroll"].includes(getComputedStyle(e).overflowX)) scroller = e;
    }
    if (scroller && inside(scroller.getBoundingClientRect())) continue;
    out.push(`${(table.querySelector("th, td") || table).textContent.trim().slice(0, 30) || "(table)"}: `
             + `${Math.round(t.width)} px in a ${Math.round(c.width)} px column, ${scroller ? "its scrolling box past the column" : "no scrolling box"}`);
  }
  return out;
}
"""

#: Run in the page after load: waits for MathJax and fonts, then reports what the test checks.
_INSPECT_JS = _PAGE_FUNCTIONS_JS + r"""
const done = arguments[arguments.length - 1];
(async () => {
  const out = {};
  try {
    if (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
      out.mathjax_error = "MathJax did not start (window.MathJax.startup is missing)";
    } else {
      await MathJax.startup.promise;
      out.macros = Object.keys(((MathJax.config || {}).tex || {}).macros || {});
    }
  } catch (e) {
    out.mathjax_error = "MathJax.startup.promise rejected: " + e;
  }
  if (window.bookMathFit) await window.bookMathFit;  // book/_static/math_fit.js
  for (const img of document.images) img.loading = "eager";
  await Promise.all([...document.images].map((img) => img.decode().catch(() => null)));
  await document.fonts.ready;

  const skip = "pre, code, script, style, textarea, mjx-container";
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  out.raw_math = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement && n.parentElement.closest(skip)) continue;
    const s = n.nodeValue;
    if (s.includes("\\(") || s.includes("\\[") || s.includes("$$")) out.raw_math.push(s.trim().slice(0, 100));
  }
  const math = [...document.querySelectorAll(".math")];
  out.math_elements = math.length;
  out.untypeset = math.filter((e) => !e.querySelector("mjx-container")).map((e) => e.textContent.trim().slice(0, 100));
  // A TeX error shows as mjx-merror; an undefined macro (noundefined) as red mtext.
  const bad = 'mjx-merror, mjx-mtext[style*="color: red"]';
  out.math_errors = [];
  if (window.MathJax && MathJax.startup && MathJax.startup.document) {
    for (const item of MathJax.startup.document.math) {
      if (item.typesetRoot && item.typesetRoot.querySelector(bad)) out.math_errors.push(item.math.trim().slice(0, 100));
    }
  }
  if (!out.math_errors.length && document.querySelector(bad)) out.math_errors.push("(MathJax error in the page)");
  out.broken_images = [...document.images].filter((i) => !i.complete || i.naturalWidth === 0).map((i) => i.src);
  out.mathjax_scripts = [...document.scripts].map((s) => s.src).filter((s) => /mathjax/i.test(s));
  out.fonts = [...document.fonts].map((f) => [f.family, f.status]);
  out.mathjax_resources = performance.getEntriesByType("resource").map((r) => r.name).filter((u) => /mathjax/i.test(u));
  out.pipe_tables = pipeTableLines();
  out.display_math = displayMathBoxes();
  out.wide_tables = wideTables();
  done(out);
})().catch((e) => done({script_error: String(e && e.stack || e)}));
"""


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str):
    """Skip locally; under CI a missing browser is a broken test environment, so fail."""
    if _in_ci():
        pytest.fail(f"{reason} (CI is set: .ci/run must install it)", pytrace=False)
    pytest.skip(reason)


def _toc_pages() -> list[str]:
    """Document names of book/_toc.yml in order (root first), e.g. ['intro', 'notation', ...]."""
    from test_book_hygiene import _toc_entries  # tests/ is on sys.path (pytest rootdir-relative import)

    return _toc_entries()


PAGES = _toc_pages()


def _config_macros() -> set[str]:
    import yaml

    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    return set(config["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"])


# ---------------------------------------------------------------------------- the configuration


def test_exec_config_keeps_offline_mathjax():
    """`make book` builds from scripts/book_config.py's output: it keeps the local MathJax and its config."""
    import yaml

    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "book_config.py"), "--execute", "cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )
    derived = yaml.safe_load(proc.stdout)
    committed = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert derived["execute"]["execute_notebooks"] == "cache"
    for config in (committed, derived):
        assert "sphinx-mathjax-offline" in config["sphinx"].get("extra_extensions", [])
        assert "mathjax_path" not in config["sphinx"]["config"], "mathjax_path would replace the bundled MathJax"
    assert derived["sphinx"]["config"]["mathjax3_config"] == committed["sphinx"]["config"]["mathjax3_config"]


def _toc_parts() -> list[dict]:
    import yaml

    return yaml.safe_load((BOOK / "_toc.yml").read_text(encoding="utf-8"))["parts"]


#: Pages that are not chapters: they must sit in unnumbered parts so that no chapter's number
#: (and so no figure or equation number) shifts because of them.
UNNUMBERED_PAGES = ("notation", "api", "api_algorithms", "api_experiments", "api_training", "references",
                    "guide/install", "guide/usage", "guide/own_data", "guide/cli", "guide/gpu", "guide/performance",
                    "guide/reproducibility")


def _numbered_chapters() -> list[str]:
    """The chapters of the numbered parts of book/_toc.yml in order: chapter k is the k-th."""
    return [c["file"] for part in _toc_parts() if part.get("numbered") for c in part["chapters"]]


def test_toc_numbers_the_chapters_and_only_them():
    """Numbering per chapter (Fig. 3.2, (1.4)) needs numbered toc parts of depth 1, and numfig depth 1.

    The hand-written number left in a chapter title would print twice ("1. 1. GRPO"), since Sphinx
    now prints the number; the front and back matter must be in unnumbered parts.
    """
    import yaml

    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["sphinx"]["config"]
    assert config.get("numfig") and config.get("math_numfig") and config.get("numfig_secnum_depth") == 1
    for part in _toc_parts():
        if part.get("numbered"):
            assert part["numbered"] == 1, f"part {part.get('caption')!r}: number the chapter titles only (depth 1)"
    chapters = _numbered_chapters()
    assert chapters[:1] == ["01_grpo"], f"chapter 1 must be 01_grpo, the numbered parts start with {chapters[:3]}"
    slugs = [c for c in chapters if re.match(r"\d\d_", c)]
    assert [int(c[:2]) for c in slugs] == list(range(1, len(slugs) + 1)), f"NN_slug out of order: {slugs}"
    assert not set(UNNUMBERED_PAGES) & set(chapters) and set(UNNUMBERED_PAGES) <= set(PAGES)
    for name in slugs:
        twin = (BOOK / "_py" / f"{name}.py").read_text(encoding="utf-8")
        title = re.search(r"^# # (.*)$", twin, re.M).group(1)
        assert not re.match(r"\d+\.\s", title), f"{name}: title {title!r} repeats the number Sphinx prints"


# ---------------------------------------------------------------------------- build and browser


@pytest.fixture(scope="module")
def html_dir(request) -> Path:
    """The HTML book built from the stored outputs (or the build named by BOOK_RENDER_HTML)."""
    given = os.environ.get("BOOK_RENDER_HTML")
    if given:
        path = Path(given).resolve()
        assert (path / f"{PAGES[0]}.html").exists(), f"BOOK_RENDER_HTML={given}: no {PAGES[0]}.html there"
        return path
    # the session's one build of the stored book (tests/conftest.py); its warnings are test_book_hygiene's
    # business (-W makes them a non-zero exit with --keep-going), here only the rendered pages matter
    proc, html = request.getfixturevalue("stored_book_build")
    assert (html / f"{PAGES[0]}.html").exists(), (
        "book build failed:\n" + "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    )
    return html


def _find(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium (Debian's, via its chromedriver) that cannot reach any network."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("selenium is not installed (pip install -r requirements/ci.txt)")
    chromium = _find("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    driver_exe = _find("chromedriver")
    if chromium is None or driver_exe is None:
        _unavailable("Chromium and chromedriver not found (Debian: apt-get install chromium chromium-driver)")

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1600",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",  # fresh profile, no cache
        # Offline: every host name resolves to nothing, and anything else goes to a closed port.
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--proxy-server=http://127.0.0.1:9",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path keeps Selenium Manager (which would download a driver) out of it.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_exe))
    driver.set_page_load_timeout(PAGE_TIMEOUT_S)
    driver.set_script_timeout(PAGE_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()


def _console_errors(driver) -> list[str]:
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry.get("level") == "SEVERE" and not any(p.search(entry["message"]) for p in KNOWN_CONSOLE_ERRORS)
    ]


def test_browser_is_offline(browser):
    """The network really is cut off, so the page checks below prove the book reads offline."""
    browser.get("about:blank")
    result = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        fetch("https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js", {mode: "no-cors", cache: "no-store"})
          .then(() => done("reached the network"), (e) => done("blocked: " + e));
        """
    )
    browser.get_log("browser")  # drop the failed-load error
    assert result.startswith("blocked"), result


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_offline(browser, html_dir: Path, page: str):
    path = html_dir / f"{page}.html"
    assert path.exists(), f"{page}.html was not built"
    browser.get_log("browser")  # start from an empty console
    start = time.monotonic()
    browser.get(path.as_uri())
    report = browser.execute_async_script(_INSPECT_JS)
    elapsed = time.monotonic() - start
    errors = _console_errors(browser)

    assert "script_error" not in report, report.get("script_error")
    problems = []
    if not report["mathjax_scripts"] and not report["math_elements"]:
        pass  # Sphinx loads MathJax only on pages with math (references.html has none)
    elif report.get("mathjax_error"):
        problems.append(report["mathjax_error"])
    else:
        missing = sorted(_config_macros() - set(report.get("macros", [])))
        if missing:
            problems.append(f"MathJax lacks the macros of _config.yml's mathjax3_config: {missing}")
    mathjax_urls = report["mathjax_scripts"] + report["mathjax_resources"]
    not_local = sorted({url for url in mathjax_urls if not url.startswith("file:")})
    if not_local:
        problems.append(f"MathJax loaded from outside the build: {not_local[:5]}")
    if report["raw_math"]:
        raw = report["raw_math"]
        problems.append(f"{len(raw)} text nodes still hold raw LaTeX delimiters, e.g. {raw[:3]}")
    if report["untypeset"]:
        untypeset = report["untypeset"]
        problems.append(
            f"{len(untypeset)} of {report['math_elements']} math elements not typeset, e.g. {untypeset[:3]}"
        )
    if report["math_errors"]:
        problems.append(f"MathJax errors / undefined macros: {report['math_errors'][:5]}")
    failed_fonts = [family for family, status in report["fonts"] if status == "error"]
    if failed_fonts:
        problems.append(f"fonts failed to load: {failed_fonts}")
    if report["broken_images"]:
        problems.append(f"images that did not load: {report['broken_images']}")
    if errors:
        problems.append("console errors:\n    " + "\n    ".join(errors))
    if report["pipe_tables"]:
        lines = report["pipe_tables"]
        problems.append(f"{len(lines)} lines of raw Markdown pipe table (not rendered as a table), e.g. {lines[:3]}")
    if report["wide_tables"]:
        problems.append(f"{len(report['wide_tables'])} tables past the column at 1280 px: {report['wide_tables'][:4]}")
    wide = [_describe(eq) for eq in report["display_math"] if not (eq["fits"] and eq["in_column"]) or eq["overlap"]]
    if wide:
        problems.append(f"{len(wide)} display equations wider than their column at 1280 px: {wide[:6]}")
    assert not problems, f"{page}.html (opened offline, {elapsed:.1f} s):\n  " + "\n  ".join(problems)


def _describe(eq: dict) -> str:
    what = "fits" if eq["fits"] else ("cut, scrolls" if eq["scrolls"] else "cut")
    extra = "" if eq["in_column"] else ", past the column"
    extra += f", {eq['overlap']} px under its number" if eq["overlap"] else ""
    return f"{eq['id']} ({eq['math_width']} px in {eq['box_width']} px: {what}{extra})"


def test_wide_table_check_fails_a_table_past_the_column(browser, tmp_path):
    """The check of test_page_renders_offline can fail: a 1500 px table in a 600 px column is flagged, the same
    table in a box that scrolls sideways is not; and the book's stylesheet gives such boxes their scrolling."""
    table = "<table><tr>" + "".join(f"<td>column {k} of a wide table</td>" for k in range(12)) + "</tr></table>"
    page = tmp_path / "wide.html"
    page.write_text(f"<html><body style='width: 600px; margin: 0'>"
                    f"<div id='bare'>{table}</div><div style='overflow-x: auto'>{table}</div></body></html>")
    browser.get(page.as_uri())
    wide = browser.execute_script(_PAGE_FUNCTIONS_JS + "return wideTables();")
    assert len(wide) == 1 and wide[0].startswith("column 0 of a wide table: ") and "no scrolling box" in wide[0], wide
    css = (BOOK / "_static" / "wide_tables.css").read_text(encoding="utf-8")
    assert re.search(r"div\.output\.text_html,\s*\.bd-content \.pst-scrollable-table-container \{[^}]*overflow-x: auto", css)


#: A narrow window (a small laptop or a tablet): the chapters' wide equations may scroll there.
NARROW_WIDTH = 800


def test_wide_equations_at_a_narrow_width(browser, html_dir: Path):
    """At 800 px every display equation of the chapters fits or scrolls inside its own box: none is cut
    without a way to read it, extends past the column, or runs under its number."""
    size = browser.get_window_size()
    browser.set_window_size(NARROW_WIDTH, size["height"])
    problems, checked = [], 0
    try:
        for page in _numbered_chapters():
            browser.get((html_dir / f"{page}.html").as_uri())
            boxes = browser.execute_async_script(
                _PAGE_FUNCTIONS_JS
                + """
                const done = arguments[arguments.length - 1];
                (async () => {
                  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
                  await document.fonts.ready;
                  if (window.bookMathFit) await window.bookMathFit;
                  done(displayMathBoxes());
                })().catch((e) => done({script_error: String(e)}));
                """
            )
            assert isinstance(boxes, list), boxes
            checked += len(boxes)
            bad = [_describe(eq) for eq in boxes if not eq["in_column"] or eq["overlap"] or not (eq["fits"] or eq["scrolls"])]
            if bad:
                problems.append(f"{page}.html: {bad[:6]}")
    finally:
        browser.set_window_size(size["width"], size["height"])
    assert checked > 10, f"only {checked} display equations found in the chapters"
    assert not problems, f"display equations at {NARROW_WIDTH} px:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------------------- numbering


def _numbers(html: str, pattern: str) -> list[str]:
    return [m.strip() for m in re.findall(pattern, html)]


_H1_NUMBER = r'<h1><span class="section-number">([^<]*)</span>'
_EQNO = r'<span class="eqno">\(([^)]*)\)'
_CAPTION_NUMBER = r'<span class="caption-number">(?:Fig\.|Table|Listing)\s*([^<]*?)\s*</span>'


def test_figures_and_equations_are_numbered_per_chapter(html_dir: Path):
    """Chapter k's figures, tables and equations are k.1, k.2, ... and other pages shift no number.

    (Before, numbers ran on across the book: chapter 1 began at Eq. 11, after the notation page's
    ten; the own-task page showed Fig. 29.)
    """
    chapters = _numbered_chapters()
    seen_figures = 0
    for k, name in enumerate(chapters, start=1):
        html = (html_dir / f"{name}.html").read_text(encoding="utf-8")
        assert _numbers(html, _H1_NUMBER) == [f"{k}."], f"{name}.html: title not numbered {k}."
        for what, pattern in (("equation", _EQNO), ("figure/table", _CAPTION_NUMBER)):
            found = _numbers(html, pattern)
            expected = [f"{k}.{i}" for i in range(1, len(found) + 1)]
            assert found == expected, f"{name}.html: {what} numbers {found}, expected {expected}"
            seen_figures += len(found) if what != "equation" else 0
    assert seen_figures > 0, "no numbered figure in any chapter: the check above checked nothing"
    first = _numbers((html_dir / "01_grpo.html").read_text(encoding="utf-8"), _EQNO)
    assert first[:1] == ["1.1"], f"chapter 1's first equation is {first[:1]}, expected (1.1)"
    for name in ("own_task",):
        figures = _numbers((html_dir / f"{name}.html").read_text(encoding="utf-8"), _CAPTION_NUMBER)
        k = chapters.index(name) + 1
        assert figures and all(f.startswith(f"{k}.") for f in figures), f"{name}.html figures: {figures}"
    for name in UNNUMBERED_PAGES:
        html = (html_dir / f"{name}.html").read_text(encoding="utf-8")
        assert not _numbers(html, _H1_NUMBER), f"{name}.html got a chapter number"
        assert all("." not in n for n in _numbers(html, _EQNO)), f"{name}.html has chapter-style equation numbers"


def test_equation_references_show_the_chapter_number(html_dir: Path):
    """{eq} references resolve, and show the per-chapter number of the equation they link to."""
    chapters = _numbered_chapters()
    checked = 0
    for page in chapters:
        html = (html_dir / f"{page}.html").read_text(encoding="utf-8")
        refs = re.findall(r'<a class="reference internal" href="([^"#]*)#equation-[^"]*">\(([^)]*)\)</a>', html)
        for target, number in refs:
            target = target.removesuffix(".html") or page
            if target in chapters:
                assert number.startswith(f"{chapters.index(target) + 1}."), f"{page}: {target} equation ({number})"
            else:
                assert "." not in number, f"{page}: equation of the unnumbered page {target} shows ({number})"
            checked += 1
    assert checked > 10, f"only {checked} equation references found in the chapters"
