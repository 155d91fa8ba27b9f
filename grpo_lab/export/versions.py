"""The TRL and verl releases the export was read from and is tested against, and a warning when another is installed.

:data:`TRL_VERSION` and :data:`VERL_VERSION` are the releases whose code :mod:`grpo_lab.export.translation`
was read from and which ``make xcheck`` installs (``requirements/xcheck.txt``) to check the equivalence.
Libraries change defaults between releases (TRL's main branch already changed ``use_bias_correction_kl``'s),
so an export for another installed release may train another objective: :func:`check_installed` warns once
(:class:`LibraryVersionWarning`) naming both releases. It reads the installed version from the package
metadata (``importlib.metadata.version``), never imports the library, and is silent when it is not
installed (the export is usually written on one machine and run on another).
"""

from __future__ import annotations

import warnings
from importlib import metadata
from typing import Optional

__all__ = ["TRL_VERSION", "VERL_VERSION", "VERIFIED_VERSIONS", "LibraryVersionWarning", "installed_version",
           "check_installed"]

#: the TRL release the mapping was read from and is tested against (``trl.GRPOConfig`` fields)
TRL_VERSION = "1.16.0"
#: the verl release the mapping was read from and is tested against (``ppo_trainer.yaml`` keys)
VERL_VERSION = "0.9.1"
#: export target -> (distribution name, the verified release)
VERIFIED_VERSIONS = {"trl": ("trl", TRL_VERSION), "verl": ("verl", VERL_VERSION)}

_warned: set = set()  # (target, installed version) pairs already warned about in this process


class LibraryVersionWarning(UserWarning):
    """The installed TRL / verl is not the release the export was verified against."""


def installed_version(distribution: str) -> Optional[str]:
    """The installed version of ``distribution`` from its package metadata, or None when it is not installed.

    Args:
        distribution: a distribution name (``"trl"``, ``"verl"``).
    """
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_installed(target: str) -> Optional[str]:
    """Warn once per process and version when ``target``'s installed release is not the verified one.

    Args:
        target: ``"trl"`` or ``"verl"`` (a key of :data:`VERIFIED_VERSIONS`).

    Returns:
        the installed version, or None when the library is not installed (then nothing is said).

    Raises:
        ValueError: an unknown ``target``.
    """
    if target not in VERIFIED_VERSIONS:
        raise ValueError(f"unknown export target {target!r}; expected one of {tuple(VERIFIED_VERSIONS)}")
    distribution, verified = VERIFIED_VERSIONS[target]
    installed = installed_version(distribution)
    if installed is not None and installed != verified and (target, installed) not in _warned:
        _warned.add((target, installed))
        warnings.warn(f"grpo_lab.export's {target} mapping was verified against {distribution} {verified}; "
                      f"{distribution} {installed} is installed: its defaults or settings may differ (read its "
                      "changelog, or run `make xcheck` with it)", LibraryVersionWarning, stacklevel=3)
    return installed
