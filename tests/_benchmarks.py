"""Import a script of ``benchmarks/`` (not a package) as a module, for the tests of those scripts."""

import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextmanager
def benchmark_module(script: str, name: str):
    """``benchmarks/<script>`` imported as the module ``name``, registered in ``sys.modules`` while in use
    (dataclasses look their module up while a class is created) and removed afterwards."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
