"""grpo_lab: the GRPO family of RL algorithms for LLMs as pure, tested tensor functions.

Submodules are imported explicitly (``from grpo_lab import advantages``); importing the
package itself is cheap and pulls in no model code.
"""

__version__ = "0.2.0"
