#!/usr/bin/env bash
# Builds the environment `make xcheck` runs in: XVENV (default .venv-xcheck), a virtual environment of the same
# interpreter that sees BASE's packages (default .venv: requirements/ci.txt and the editable grpo_lab) behind its own,
# and holds requirements/xcheck.txt (TRL, verl and what they import, installed without dependencies) in its own
# site-packages. Its antlr4-python3-runtime 4.9.3 (omegaconf's) shadows BASE's 4.13.2 there and only there: BASE is
# never written to, so the GSM8K scorer in BASE keeps the ANTLR runtime its tables were checked with
# (grpo_lab.tasks.gsm8k.SCORER_ANTLR_VERSION; 4.9.3 changes some of math-verify's verdicts).
# Usage: scripts/xcheck_env.sh [BASE [XVENV]]
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:-.venv}
XVENV=${2:-.venv-xcheck}
[[ -x "$BASE/bin/python" ]] || { echo "xcheck_env: no environment at $BASE (run make install first)" >&2; exit 1; }
base_site=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$XVENV"
"$BASE/bin/python" -m venv "$XVENV"  # a venv made from a venv uses the same base interpreter
x_site=$("$XVENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# BASE's site-packages after this one's (site.addsitedir appends, and runs BASE's .pth files: the editable install)
echo "import site; site.addsitedir('$(cd "$base_site" && pwd)')" > "$x_site/zz_grpo_lab_base.pth"
"$XVENV/bin/python" -m pip install -q --upgrade pip
# --ignore-installed: every pin lands here, none is uninstalled from BASE (pip sees BASE's packages on sys.path)
"$XVENV/bin/python" -m pip install -q --no-deps --ignore-installed -r requirements/xcheck.txt
"$XVENV/bin/python" - <<'PYEOF'
from importlib import metadata
import grpo_lab, trl, verl  # noqa: F401  (verl imports omegaconf, which needs antlr 4.9)
print(f"xcheck environment: antlr4-python3-runtime {metadata.version('antlr4-python3-runtime')}, trl {trl.__version__}, "
      f"verl {metadata.version('verl')}, grpo_lab from {grpo_lab.__file__}")
PYEOF
touch "$XVENV/.installed"
