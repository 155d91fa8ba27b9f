"""``python -m grpo_lab.experiments``: the command line of ``python -m grpo_lab`` under its older name.

It lives here, not in :mod:`grpo_lab.experiments`, because it imports :mod:`grpo_lab.cli`, which
imports :mod:`grpo_lab.experiments`: the package does not import this module, so there is no cycle.
"""

from ..cli import main as cli_main


def main(argv=None) -> None:
    """``python -m grpo_lab.experiments``: the command line of :mod:`grpo_lab.cli` (``python -m grpo_lab``)
    under its older name, kept for existing scripts; it takes every option of
    ``python -m grpo_lab --help`` (``--out`` is now optional).

    Raises:
        SystemExit: with the command's status when it is not 0 (2 for a mistake in the command line,
            after one line on stderr).
    """
    status = cli_main(argv, prog="python -m grpo_lab.experiments")
    if status:
        raise SystemExit(status)


if __name__ == "__main__":  # spawned worker processes import this module without running it
    main()
