"""Install grpo_lab into a Colab kernel: the package, editable, with the extras the chapters need, pinned as CI
pins them, without replacing what Colab ships compiled.

Run by every chapter's first (Colab) cell after it clones the repository; stdlib only (it runs before the
package is installed). ``python scripts/colab_setup.py [ROOT]`` runs ``pip install -e ROOT[gsm8k,lora]`` with
the constraints of ``requirements/ci.txt`` minus :data:`COLAB_KEEPS`: the compiled packages Colab preinstalls
and has imported, or may import, in the running kernel (replacing numpy or torch under a live kernel needs a
restart, and a CUDA torch must never be swapped for another build). Those keep Colab's versions, checked only
against ``pyproject.toml``'s floors (``torch>=2.4``, ``numpy>=1.24.1``, ...). Everything else the extras pull
in (math-verify, datasets, peft, transformers, ...) gets CI's exact version.

Assumed Colab image (not measured here; checked only by the floors): Python 3.12, torch 2.x+cu12x, numpy 2.x.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

__all__ = ["COLAB_EXTRAS", "COLAB_KEEPS", "colab_constraints", "main"]

#: The extras a chapter needs on Colab: GSM8K's scorer and data (math-verify, datasets) and LoRA (peft).
COLAB_EXTRAS = ("gsm8k", "lora")

#: Packages whose Colab version is kept (left out of the constraints): compiled, preinstalled, imported early.
COLAB_KEEPS = frozenset({"torch", "torchvision", "torchaudio", "triton", "numpy", "pandas", "scipy", "matplotlib",
                         "pillow", "pyarrow", "ipykernel", "ipython", "jupyter-client", "tornado", "pyzmq",
                         "traitlets", "jupyter-core", "protobuf", "grpcio"})


def _name(line: str) -> str | None:
    """The normalised project name a requirements line pins (PEP 503), ``None`` for a comment or blank."""
    line = line.split("#", 1)[0].strip()
    if not line:
        return None
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~;\[ @]", line, 1)[0]).lower()


def colab_constraints(ci_text: str) -> str:
    """``ci_text`` (``requirements/ci.txt``'s text) without the lines of :data:`COLAB_KEEPS` and comments."""
    lines = (ln.split("#", 1)[0].strip() for ln in ci_text.splitlines())
    return "".join(f"{ln}\n" for ln in lines if _name(ln) and _name(ln) not in COLAB_KEEPS)


def main(argv: list[str] | None = None) -> int:
    """Install ``ROOT`` (first argument, default ``/content/grpo_lab``) as described in the module docstring.

    Returns pip's exit status (non-zero: its output says why)."""
    argv = sys.argv[1:] if argv is None else argv
    root = os.path.abspath(argv[0] if argv else "/content/grpo_lab")
    with open(os.path.join(root, "requirements", "ci.txt"), encoding="utf-8") as f:
        constraints = colab_constraints(f.read())
    with tempfile.NamedTemporaryFile("w", suffix="-colab-constraints.txt", delete=False) as f:
        f.write(constraints)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "-e", f"{root}[{','.join(COLAB_EXTRAS)}]", "-c", f.name]
    print("grpo_lab set-up:", " ".join(cmd), flush=True)
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
