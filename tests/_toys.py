"""Small things several test files train with: a one-layer model configuration and a task whose reward a
random policy earns about half the time (so groups are mixed, advantages are not zero, and training moves)."""

import dataclasses

from grpo_lab.models import TinyConfig
from grpo_lab.tasks import ArithmeticTask

#: a one-layer Qwen2-style policy, small enough for a CPU unit test
TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)


@dataclasses.dataclass
class HalfTask(ArithmeticTask):
    """Arithmetic prompts, rewarded 1 when the first character is one of 25 of the alphabet's characters."""

    name: str = "half"

    def is_correct(self, completion, problem):
        return len(completion) > 0 and completion[0] in "0123456789+-*=#;.,:? abcd"

    def reward(self, completion, problem):
        return 1.0 if self.is_correct(completion, problem) else 0.0
