"""A task of the user's for tests/extension: arithmetic prompts rewarded 1 when the first character is one of 25
of the tiny policy's characters, so a random policy earns it about half the time (mixed groups, non-zero
advantages). Registered as ``"coin"``; ``--import`` it beside the variants."""

import dataclasses

from grpo_lab.tasks import ArithmeticTask, register_task


@register_task("coin")
@dataclasses.dataclass
class CoinTask(ArithmeticTask):
    """Rewarded 1 when the completion starts with one of 25 characters (as tests/_toys.py's HalfTask)."""

    name: str = "coin"

    def is_correct(self, completion, problem):
        return len(completion) > 0 and completion[0] in "0123456789+-*=#;.,:? abcd"

    def reward(self, completion, problem):
        return 1.0 if self.is_correct(completion, problem) else 0.0
