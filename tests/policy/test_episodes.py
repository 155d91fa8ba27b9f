"""Multi-turn rollouts (grpo_lab.policy.episodes): masks, exact ids, behaviour log-probs, truncation in any turn, and
no re-tokenisation drift under a BPE tokenizer whose merges cross the turn boundary."""

import numpy as np
import pytest
import torch

from _toys import TINY
from grpo_lab.policy.episodes import generate_episodes, stop_string_end
from grpo_lab.policy.models import CriticModel, tiny_policy
from grpo_lab.policy.rollout import Rollout, policy_logprobs
from grpo_lab.tasks import Problem, StepResult, is_multi_turn
from grpo_lab.training.collection import concat_rollouts


class Adder:
    """A toy tool: a turn that ends at one of the stop strings gets the count of digits it holds, then ';'. The
    episode ends when the action ends with '+' (reward 0.5) or at EOS."""

    stop_strings = ("=", "+", "*", "1", "2")

    def __init__(self, max_turns=3, observation=None):
        self.max_turns, self.observation = max_turns, observation

    def reset(self, problem):
        self.problem, self.actions = problem, []

    def step(self, action):
        self.actions.append(action)
        obs = self.observation if self.observation is not None else f"#{sum(c.isdigit() for c in action)};"
        return StepResult(observation=obs, done=action.endswith("+"), reward=0.5 if action.endswith("+") else 0.0)


class AdderTask:
    def __init__(self, **env):
        self.env, self.made = env, []

    def environment(self):
        self.made.append(Adder(**self.env))
        return self.made[-1]


PROBLEMS = [Problem(prompt="12+3=", answer="15"), Problem(prompt="7*8=", answer="56")]


def _episodes(tok, model=None, task=None, seed=0, **kw):
    model = model or tiny_policy(tok, TINY, seed=0)
    torch.manual_seed(seed)
    kw = dict(group_size=6, max_new_tokens=24, temperature=1.0) | kw
    return model, generate_episodes(model, tok, task or AdderTask(), PROBLEMS, **kw)


def test_hand_built_episode_masks():
    # prompt [a b], completion: model 2 tokens, observation 2, model 1 (EOS), padding 1; row 2: model 1, padding
    ro = Rollout(prompt_ids=torch.tensor([[5, 6], [0, 7]]), prompt_mask=torch.tensor([[1, 1], [0, 1]]),
                 completion_ids=torch.tensor([[8, 9, 10, 11, 2, 0], [2, 0, 0, 0, 0, 0]]),
                 completion_mask=torch.tensor([[1., 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]]),
                 behaviour_logp=torch.zeros(2, 6), truncated=torch.tensor([False, False]), texts=["", ""],
                 problems=PROBLEMS, group_size=1,
                 observation_mask=torch.tensor([[0, 0, 1, 1, 0, 0], [0] * 6]).bool())
    assert ro.attention_mask().tolist() == [[1, 1, 1, 1, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0, 0, 0]]
    assert ro.lengths.tolist() == [3, 1]  # the model's tokens only (the normalisers' counts)
    assert ro.token_counts().tolist() == [7, 2]  # the forward's work: prompt + model + observation tokens
    one = ro.select([0])
    assert one.completion_ids.shape[1] == 5  # trimmed to the last attended column, not to the model-token count
    assert one.observation_mask.tolist() == [[False, False, True, True, False]]
    obs_only_tail = Rollout(**{**ro.__dict__, "completion_mask": torch.tensor([[1., 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]),
                               "observation_mask": torch.tensor([[0, 1, 1, 0, 0, 0], [0] * 6]).bool()})
    assert obs_only_tail.select([0]).completion_ids.shape[1] == 3  # an episode ending in an observation
    both = concat_rollouts([ro.select([0]), ro.select([1])], pad_id=0)
    assert both.observation_mask.tolist() == ro.observation_mask[:, :5].tolist()
    single = Rollout(**{**ro.__dict__, "observation_mask": None})
    with pytest.raises(ValueError, match="multi-turn"):
        concat_rollouts([ro, single], pad_id=0)


def test_episode_ids_masks_and_statistics(tok):
    task = AdderTask()
    model, ro = _episodes(tok, task=task)
    assert is_multi_turn(task) and not is_multi_turn(object())
    cm, om = ro.completion_mask.bool(), ro.observation_mask
    assert not (cm & om).any() and om.any() and (ro.extras["turns"] > 1).any()
    assert (ro.behaviour_logp[om] == 0).all() and (ro.behaviour_logp[cm] < 0).all()
    for i, env in enumerate(task.made):
        n = int((cm[i] | om[i]).sum())
        ids = ro.completion_ids[i, :n].tolist()
        assert (cm[i] | om[i])[:n].all() and n <= 24  # contiguous, within the budget
        # every observation's ids are the tokenizer's ids of the text step returned, at the observation positions
        obs_ids = [t for t, o in zip(ids, om[i, :n].tolist()) if o]
        want = sum((tok(f"#{sum(c.isdigit() for c in a)};", add_special_tokens=False)["input_ids"]
                    for a in env.actions), [])
        assert obs_ids == want[:len(obs_ids)]
        assert ro.extras["tool_calls"][i] == len(env.actions)
        assert ro.extras["observation_tokens"][i] == len(obs_ids)
        assert ro.texts[i] == tok.decode(ids[:-1] if ids[-1] == tok.eos_token_id else ids)
        # each action is the text of a model turn and ends at its first stop string
        for a in env.actions:
            a_ids = tok(a, add_special_tokens=False)["input_ids"]
            assert stop_string_end(tok, a_ids, Adder.stop_strings) == len(a_ids)
        assert ro.extras["turn_rewards"][i] == 0.5 * sum(a.endswith("+") for a in env.actions)


def test_behaviour_logprobs_are_pi_theta_at_model_tokens(tok):
    for kw in ({}, {"top_k": 5}):
        model, ro = _episodes(tok, seed=1, **kw)
        lp = policy_logprobs(model, ro, keep_mask="top_k" in kw)
        cm = ro.completion_mask.bool()
        torch.testing.assert_close(lp[cm], ro.behaviour_logp[cm], atol=1e-5, rtol=0)
        assert (lp[ro.observation_mask] == 0).all()
        if kw:  # kept sets at model tokens, none at observations
            assert (ro.kept_ids[ro.observation_mask] == -1).all() and (ro.kept_ids[cm][:, 0] >= 0).all()


def test_forwards_attend_over_observations(tok):
    # an observation id changed: log-probs and critic values at the later model tokens change; at earlier ones not
    model, ro = _episodes(tok, seed=2)
    i = int(ro.extras["turns"].argmax())
    first_obs = int(ro.observation_mask[i].nonzero()[0])
    later = ro.completion_mask[i].bool() & (torch.arange(ro.completion_mask.shape[1]) > first_obs)
    assert later.any()
    other = Rollout(**ro.__dict__)
    other.completion_ids = ro.completion_ids.clone()
    other.completion_ids[i, first_obs] = tok.convert_tokens_to_ids("x")
    critic = CriticModel.scratch(tok, seed=0)
    torch.nn.init.normal_(critic.head.weight)  # the head starts at zero
    for f in (lambda r: policy_logprobs(model, r), critic.values):
        a, b = f(ro)[i].detach(), f(other)[i].detach()
        assert torch.equal(a[:first_obs], b[:first_obs]) and not torch.allclose(a[later], b[later])
        assert (a[ro.observation_mask[i]] == 0).all()  # values and log-probs only at the model's tokens


def test_truncation_in_an_observation_and_the_turn_limit(tok):
    _, ro = _episodes(tok, task=AdderTask(observation="abcdefghijklmnopqrstuvwxyz"), max_new_tokens=12)
    called = ro.extras["tool_calls"] > 0
    assert called.any()
    assert ro.truncated[called].all()  # the 26-character observation cannot fit: cut at the budget
    assert ((ro.completion_mask + ro.observation_mask.float()).sum(-1)[called] == 12).all()
    _, ro = _episodes(tok, task=AdderTask(max_turns=1), group_size=12)
    assert (ro.extras["turns"] == 1).all()
    limited = ro.extras["turn_limit"]
    assert limited.any() and (ro.observation_mask[limited].sum() == 0)  # no observation after the last turn
    assert not ro.truncated[limited].any()


def test_bad_environments_are_named(tok):
    class NoStops(Adder):
        stop_strings = "="

    class BadStep(Adder):
        def step(self, action):
            return ("obs", False)

    class T:
        def __init__(self, cls):
            self.cls = cls

        def environment(self):
            return self.cls()

    model = tiny_policy(tok, TINY, seed=0)
    with pytest.raises(TypeError, match="NoStops.stop_strings"):
        generate_episodes(model, tok, T(NoStops), PROBLEMS, max_new_tokens=8)
    with pytest.raises(ValueError, match="max_turns"):
        generate_episodes(model, tok, AdderTask(max_turns=0), PROBLEMS, max_new_tokens=8)
    with pytest.raises(TypeError, match="has no environment"):
        generate_episodes(model, tok, object(), PROBLEMS, max_new_tokens=8)
    with pytest.raises(TypeError, match="BadStep.step must return a StepResult"):
        torch.manual_seed(0)
        generate_episodes(model, tok, T(BadStep), PROBLEMS, group_size=8, max_new_tokens=24)
