"""Small things several test files train with: a one-layer model configuration and a task whose reward a
random policy earns about half the time (so groups are mixed, advantages are not zero, and training moves)."""

import dataclasses

from grpo_lab.experiments import Profile
from grpo_lab.policy.models import TinyConfig, build_char_tokenizer, tiny_policy
from grpo_lab.tasks import ArithmeticTask
from grpo_lab.training.trainer import TrainerConfig

#: a one-layer Qwen2-style policy, small enough for a CPU unit test
TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)


@dataclasses.dataclass
class HalfTask(ArithmeticTask):
    """Arithmetic prompts, rewarded 1 when the first character is one of 25 of the alphabet's characters (a
    random policy earns it about half the time). The one half-reward toy task of the tests: register it
    as ``"half"`` where a test resumes from the registry."""

    name: str = "half"

    def is_correct(self, completion, problem):
        return len(completion) > 0 and completion[0] in "0123456789+-*=#;.,:? abcd"

    def reward(self, completion, problem):
        return 1.0 if self.is_correct(completion, problem) else 0.0


def tiny_profile(directory, *, steps: int, eval_every: int) -> Profile:
    """A profile training the arithmetic task (5 test problems, 2 prompts x 4 responses, 8 tokens) from a
    :data:`TINY` policy (seed 0) and the character tokenizer, saved as a base checkpoint in ``directory``."""
    tok = build_char_tokenizer()
    tiny_policy(tok, TINY, seed=0).save_pretrained(directory, safe_serialization=True)
    tok.save_pretrained(directory)
    return Profile(name="t", base=str(directory), task="arithmetic", steps=steps,
                   config=TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=eval_every),
                   task_kwargs=(("test_size", 5),))
