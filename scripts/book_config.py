"""Print _config.yml with another notebook-execution mode (used by `make book`).

    python scripts/book_config.py --execute cache > _build/_config_exec.yml

The committed _config.yml renders stored outputs ("off"); `make book` executes the chapters
through jupyter-cache instead, without touching the committed notebooks.
"""

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--execute", choices=["off", "cache", "force", "auto"], required=True)
a = ap.parse_args()
config = yaml.safe_load((ROOT / "_config.yml").read_text())
config.setdefault("execute", {})["execute_notebooks"] = a.execute
yaml.safe_dump(config, sys.stdout, sort_keys=False)
