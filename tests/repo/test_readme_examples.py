"""The README's and the user guide's examples run and do what they say (issue 36).

Documents: README.md and the guide pages ``book/guide/*.md`` (the commands and code are read from them,
never copied here).

* Every command that trains (``python -m grpo_lab ...`` in a ```bash block) runs, shortened by flags
  appended to it (``--steps 2 --seeds 0 --jobs 1 --out TMP``: the command line takes the last value of a
  repeated option), never by editing it. Each runs in-process (:func:`grpo_lab.cli.main.main`) from a scratch
  directory that links the repository's ``book/`` and holds the guide's ``run.yaml``; its outcome is read
  from the results file named by the printed line ``results: PATH``. Skipped, by the rule of
  :func:`_skip_reason`: a command that needs a GPU (``--profile gpu``) or the Hugging Face hub (a ``--model``
  that is a hub id, ``--task gsm8k``). The own-task line is also run with its own step count and checked to
  learn (slow).
* Every ```python block runs as saved: written to a file in a scratch directory and run as a script in its own
  process (README's quickly; the guide's, which train, are slow: about 60 s in all on 2 loaded cores). A block
  that trains must print a line with the untrained base's number beside the trained one (issue 58).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: the user guide's pages, built with the book
GUIDE = sorted((ROOT / "book" / "guide").glob("*.md"))
#: the CLI's first words that do not train
NOT_TRAINING = {"list", "check-config", "export", "--help", "-h"}
SHORT = ["--steps", "2", "--seeds", "0", "--jobs", "1"]


def bash_blocks(text: str) -> list[str]:
    """The bodies of the ```bash blocks of a markdown text."""
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def grpo_lab_commands(text: str) -> list[list[str]]:
    """The arguments after ``python -m grpo_lab`` of every such line of the ```bash blocks, comments dropped."""
    out = []
    for block in bash_blocks(text):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:3] == ["python", "-m", "grpo_lab"]:
                out.append(words[3:])
    return out


def training_commands(text: str) -> list[list[str]]:
    """The commands of :func:`grpo_lab_commands` that train (not ``list``, ``export``, ``--help``, ...)."""
    return [args for args in grpo_lab_commands(text) if args and args[0] not in NOT_TRAINING]


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args[:-1] else None


def _skip_reason(args: list[str]) -> str | None:
    """Why a command cannot run here, or ``None``: a GPU profile, a hub model, the GSM8K task (the hub)."""
    if _option(args, "--profile") == "gpu":
        return "needs a GPU (--profile gpu)"
    model = _option(args, "--model")
    if model is not None and "/" in model and not (ROOT / model).exists():
        return f"needs the Hugging Face hub (--model {model})"
    if _option(args, "--task") == "gsm8k":
        return "needs the Hugging Face hub (--task gsm8k)"
    return None


def python_blocks(text: str) -> list[str]:
    """The bodies of the ```python blocks of a markdown text."""
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _run_yaml(text: str) -> str:
    """The guide's ``run.yaml`` (the ```yaml block that starts with ``# run.yaml``)."""
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if b.startswith("# run.yaml")]
    assert len(blocks) == 1, "README.md and book/guide/*.md: expected one ```yaml block starting with '# run.yaml'"
    return blocks[0]


README_TEXT = README.read_text(encoding="utf-8")
#: README.md and the guide pages, one text
TEXT = "\n".join([README_TEXT] + [p.read_text(encoding="utf-8") for p in GUIDE])
#: each training command once (README's quick start repeats some of the guide's)
TRAINING = list({tuple(a): a for a in training_commands(TEXT)}.values())
#: (page, index, code) of every ```python block of the guide
GUIDE_SNIPPETS = [(p.name, i, code) for p in GUIDE for i, code in enumerate(python_blocks(p.read_text(encoding="utf-8")))]


def _id(args: list[str]) -> str:
    return " ".join(args)[:60]


@pytest.fixture(autouse=True)
def _clean_registries(user_modules):
    """The own-task line imports book/examples/reverse_task.py, which registers the task 'reverse': undone after
    each test (the fresh-clone CI failed when later tests found it registered)."""


def _scratch(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "book").symlink_to(ROOT / "book")
    (tmp_path / "run.yaml").write_text(_run_yaml(TEXT))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(args: list[str], capsys) -> dict:
    """Run ``python -m grpo_lab ARGS`` in-process; its exit status 0, the results file its ``results:`` line names."""
    from grpo_lab.cli.main import main

    rc = main(list(args), prog="python -m grpo_lab")
    out = capsys.readouterr()
    assert rc == 0, f"python -m grpo_lab {shlex.join(args)} exited {rc}:\n{out.err[-3000:]}"
    lines = [line for line in out.out.splitlines() if line.startswith("results: ")]
    assert len(lines) == 1, out.out
    path = Path(lines[0].removeprefix("results: ").strip())
    assert path.is_file(), path
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------------ fast


def test_readme_has_training_commands():
    assert GUIDE and "make test" in README_TEXT, "README.md must name the test command CI runs (.ci/run)"
    assert training_commands(README_TEXT), "README.md: the quick start's training command is gone"
    assert len(TRAINING) >= 8, TRAINING
    own = [a for a in TRAINING if "--import" in a and _option(a, "--task") == "reverse"]
    assert own, "README.md / book/guide: the own-task line (--task reverse) is gone"
    assert _option(own[0], "--model") == "reverse-base", "the own-task line must start from reverse-base"
    assert any(_skip_reason(a) for a in TRAINING), "the GPU line is not recognised"


def test_skip_rule():
    assert _skip_reason(["GRPO", "--profile", "gpu"]) == "needs a GPU (--profile gpu)"
    assert "hub" in _skip_reason(["GRPO", "--model", "Qwen/Qwen2.5-0.5B-Instruct"])
    assert _skip_reason(["GRPO", "--import", "book/examples/reverse_task.py", "--task", "reverse"]) is None
    assert _skip_reason(["RPT", "--model", "corpus-base"]) is None


def _recipe(text: str) -> list[str]:
    """The first four commands of a text's install block (the ```bash block with ``make install``)."""
    block = next(b for b in bash_blocks(text) if "make install" in b)
    return [line.split("#")[0].strip() for line in block.splitlines()][:4]


def test_readme_states_the_environment():
    # one install story: the README, the intro page and the install guide give the same recipe, and say to
    # activate .venv
    pages = {"README.md": README_TEXT, "book/intro.md": (ROOT / "book" / "intro.md").read_text(encoding="utf-8"),
             "book/guide/install.md": (ROOT / "book" / "guide" / "install.md").read_text(encoding="utf-8")}
    for name, text in pages.items():
        block = next(b for b in bash_blocks(text) if "make install" in b)
        lines = [shlex.split(line, comments=True) for line in block.splitlines()]
        assert ["source", ".venv/bin/activate"] in lines, name
        assert ["make", "install"] in lines, name
        assert _recipe(text) == _recipe(README_TEXT), name
    assert ".venv/bin/python -m grpo_lab" not in TEXT  # one way of writing it: the activated python


def _run_snippet(code: str, where: str, tmp_path: Path, env: dict | None = None) -> str:
    """Run one ```python block as saved: written to ``snippet.py`` in ``tmp_path`` and run there as a script
    (``python snippet.py``, its own process: ``__name__ == "__main__"``, spawned workers re-import it). Returns
    its stdout; a failure raises ``AssertionError`` naming the document and block, then the script's last
    stderr line."""
    import os
    import subprocess
    import sys

    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRPO_LAB_RUN_CACHE": "off", **(env or {})}
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise AssertionError(f"{where} fails (exit {p.returncode}): {last}")
    return p.stdout


def _trains(code: str) -> bool:
    """Whether a snippet trains (``.train(`` or ``experiments.run(``): it must then print base against trained."""
    return ".train(" in code or "experiments.run(" in code


def _check_snippet(code: str, where: str, tmp_path: Path) -> None:
    out = _run_snippet(code, where, tmp_path)
    if _trains(code):  # issue 58: a training example shows the untrained base beside the trained policy
        assert any("base" in line and "after" in line for line in out.splitlines()), \
            f"{where} trains but prints no line with the base's number beside the trained one:\n{out[-2000:]}"


def test_readme_snippet_runs(tmp_path):
    blocks = python_blocks(README_TEXT)
    assert blocks, "README.md: the policy_loss snippet is gone"
    for i, code in enumerate(blocks):
        _check_snippet(code, f"README.md python block {i}", tmp_path)


def test_a_failing_snippet_fails(tmp_path):
    with pytest.raises(AssertionError, match="doc.md python block 0 fails \\(exit 1\\): KeyError: 'no such surrogate'"):
        _run_snippet("from grpo_lab.algo.objectives import SURROGATES\nSURROGATES['no such surrogate']\n",
                     "doc.md python block 0", tmp_path)
    with pytest.raises(AssertionError, match="prints no line with the base's number"):
        _check_snippet("def train(): pass\nx = object()\n# trainer.train(2)\nprint('trained: 0.5')\n",
                       "doc.md python block 1", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("page,index,code", GUIDE_SNIPPETS, ids=[f"{p}-{i}" for p, i, _ in GUIDE_SNIPPETS])
def test_guide_snippet_runs(page, index, code, tmp_path):
    for module in ("peft", "datasets"):  # optional extras ([lora], [gsm8k])
        if re.search(rf"^\s*(from|import) {module}\b", code, flags=re.M) or (module == "peft" and "policy.lora" in code):
            pytest.importorskip(module)
    _check_snippet(code, f"book/guide/{page} python block {index}", tmp_path)


def test_reverse_base_is_shipped_with_its_provenance():
    from grpo_lab.policy.models import load_policy
    from grpo_lab.paths import checkpoint_dir
    from grpo_lab.lab.pretrain import RECIPES, reverse_example, sha256_file
    from grpo_lab.policy.rollout import evaluate

    ckpt = checkpoint_dir("reverse-base")
    record = json.loads((ckpt / "recipe.json").read_text())
    assert record["recipe"] == RECIPES["reverse"].to_dict()
    assert record["model_sha256"] == sha256_file(ckpt / "model.safetensors")
    policy, tokenizer = load_policy("reverse-base")
    summary, _ = evaluate(policy, tokenizer, reverse_example().ReverseTask(), greedy=True)
    assert summary["accuracy"] == pytest.approx(record["metrics"]["greedy_accuracy"], abs=0.03)
    assert 0.1 < summary["accuracy"] < 0.5  # right sometimes: a learning signal, and room to learn


# ------------------------------------------------------------------------------------------------ slow


@pytest.mark.slow
def test_pretrain_reverse_rebuilds_the_checkpoint(tmp_path):
    from grpo_lab.paths import checkpoint_dir
    from grpo_lab.lab.pretrain import RECIPES, pretrain

    record = pretrain(RECIPES["reverse"], tmp_path / "reverse-base", progress=False, name="reverse")
    shipped = json.loads((checkpoint_dir("reverse-base") / "recipe.json").read_text())
    assert record["recipe"] == shipped["recipe"]
    # bit for bit on the processor that made it (the same model_sha256); elsewhere within rounding's reach
    assert record["metrics"]["greedy_accuracy"] == pytest.approx(shipped["metrics"]["greedy_accuracy"], abs=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("args", TRAINING, ids=[_id(a) for a in TRAINING])
def test_readme_command_trains(args, tmp_path, monkeypatch, capsys):
    reason = _skip_reason(args)
    if reason:
        pytest.skip(reason)
    _scratch(tmp_path, monkeypatch)
    out = ["--out", str(tmp_path / "out" / "run.json")]
    if "--resume" in args:  # the guide's resume line repeats the line before it: run that one first
        first = [a for a in args if a != "--resume"]
        _run(first + SHORT + out, capsys)
        result = _run(args + SHORT + out, capsys)
    else:
        result = _run(args + SHORT + out + ["--overwrite"], capsys)
    rows = [r for r in result["history"] if r["seed"] == 0]
    assert max(r["step"] for r in rows) == 2
    assert any(r["step"] == 0 and r.get("test_accuracy") is not None for r in rows)


@pytest.mark.slow
def test_own_task_line_learns(tmp_path, monkeypatch, capsys):
    args = next(a for a in TRAINING if _option(a, "--task") == "reverse")
    _scratch(tmp_path, monkeypatch)
    result = _run(args + ["--seeds", "0", "--jobs", "1", "--out", str(tmp_path / "own.json")], capsys)
    rows = [r for r in result["history"] if r.get("test_accuracy") is not None]
    base, final = rows[0]["test_accuracy"], rows[-1]["test_accuracy"]
    assert rows[0]["step"] == 0 and final >= base + 0.1, (base, final)


@pytest.mark.slow
def test_tool_task_line_reports_the_multi_turn_columns(tmp_path, monkeypatch, capsys):
    # issue 56: the guide's calculator line trains on episodes and prints turns, tool calls and observation share
    args = next(a for a in TRAINING if _option(a, "--task") == "calculator")
    _scratch(tmp_path, monkeypatch)
    from grpo_lab.cli.main import main

    assert main(args + SHORT + ["--out", str(tmp_path / "calc.json")], prog="python -m grpo_lab") == 0
    out = capsys.readouterr().out
    steps = [line for line in out.splitlines() if " step 1/2 " in line or " step 2/2 " in line]
    assert steps and all(c in line for line in steps for c in ("turns_mean", "tool_calls_mean", "observation_token_frac"))
    rows = [r for r in json.loads((tmp_path / "calc.json").read_text())["history"] if r["step"] > 0]
    assert all(r["turns_mean"] >= 1 and 0 < r["observation_token_frac"] < 1 for r in rows)  # the model called the tool
