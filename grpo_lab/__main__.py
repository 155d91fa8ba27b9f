"""``python -m grpo_lab``: the command line of :mod:`grpo_lab.cli.main` (``python -m grpo_lab --help``)."""

import sys

from .cli.main import main

if __name__ == "__main__":  # spawned worker processes import this module without running it
    sys.exit(main())
