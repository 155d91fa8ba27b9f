"""A script that starts worker processes outside its ``if __name__ == "__main__":`` guard gets one line that names
the guard, before any worker starts (issue 58: the README's n_jobs=2 example saved as a script ended in a 164-line
traceback whose last line was BrokenProcessPool)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from grpo_lab.experiments.workers import _is_main_guard

ROOT = Path(__file__).resolve().parents[2]


def _script(tmp_path: Path, name: str, code: str) -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT), GRPO_LAB_RUN_CACHE="off", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def test_unguarded_script_names_the_guard(tmp_path):
    p = _script(tmp_path, "headline.py", "from grpo_lab import experiments\n\n"
                "result = experiments.run('GRPO', profile='cpu', seeds=(0, 1), steps=1, n_jobs=2)\n")
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: headline.py, line 3 (outside the __main__ guard): "), last
    assert 'if __name__ == "__main__":' in last and "n_jobs=1" in last
    assert "BrokenProcessPool" not in p.stderr and len(p.stderr.splitlines()) < 30


def test_a_guarded_script_is_not_refused(tmp_path):
    # the check itself, from inside the guard and from a function the guard calls (no workers started here)
    p = _script(tmp_path, "guarded.py", "from grpo_lab.experiments.workers import _unguarded_main_statement\n\n"
                "def main():\n    print(_unguarded_main_statement())\n\n"
                "if __name__ == '__main__':\n    main()\n    print(_unguarded_main_statement())\n"
                "print(_unguarded_main_statement())\n")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[:2] == ["None", "None"]
    assert lines[2].endswith("guarded.py', 9)")  # the unguarded last line is found, with its line number


def test_is_main_guard():
    def first(code):
        return ast.parse(code).body[0]

    assert _is_main_guard(first("if __name__ == '__main__':\n    pass\n"))
    assert _is_main_guard(first("if '__main__' == __name__:\n    pass\n"))
    assert not _is_main_guard(first("if __name__ != '__main__':\n    pass\n"))
    assert not _is_main_guard(first("if True:\n    pass\n"))
    assert not _is_main_guard(first("x = 1\n"))
