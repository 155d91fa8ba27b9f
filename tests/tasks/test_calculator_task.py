"""The calculator tool task (issue 56, item 3): the environment's call parsing, the episode reward on hand-written
episodes, registration, the ``calculator`` pretraining recipe's data, and the shipped checkpoint's card.

Goldens are hand work: 317*45 = 14265, 14265 + 28 = 14293.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from grpo_lab.lab.pretrain import RECIPES, make_task
from grpo_lab.paths import checkpoint_dir
from grpo_lab.tasks import CalculatorTask, get_task, task_from_spec, task_spec, validate_task
from grpo_lab.tasks.calculator import (CALC_ALPHABET, ERROR_OBSERVATION, CalculatorEnvironment, calc_observation,
                                       calc_result, parse_episode, tool_response)
from grpo_lab.tasks.environment import StepResult

PROBLEM = CalculatorTask().make_problem(317, 45, 28)
BASE = checkpoint_dir("calculator-base")


def _env(max_turns=3):
    env = CalculatorEnvironment(max_turns)
    env.reset(PROBLEM)
    return env


# ------------------------------------------------------------------ the environment's parsing
def test_well_formed_call_returns_its_result():
    assert _env().step("calc(317*45)") == StepResult("=14265\n", done=False, reward=0.0)
    assert _env().step("calc(14265+28)").observation == "=14293\n"
    assert _env().step("calc(3-5)").observation == "=-2\n"
    assert _env().step("let me see calc(0*7)").observation == "=0\n"  # text before the call is allowed


@pytest.mark.parametrize("action", ["calc(3**4)", "calc(3*)", "calc(*4)", "calc()", "calc(3/4)", "calc(3 * 4)",
                                    "calc(2+3+4)", "calc(x*y)", "calc(__import__('os'))", "calc(3*4"])
def test_malformed_call_is_an_error_observation(action):
    result = _env().step(action)
    assert result == StepResult(ERROR_OBSERVATION, done=False)
    assert "#" not in result.observation and result.observation.endswith("\n")


def test_the_last_of_several_calls_is_answered():
    assert _env().step("calc(2*3)calc(4*5)").observation == "=20\n"
    assert _env().step("calc(2*3)calc(4**5)").observation == ERROR_OBSERVATION


def test_huge_numbers_are_refused_not_computed():
    assert _env().step("calc(999999*999999)").observation == "=999998000001\n"  # six digits: allowed
    assert _env().step("calc(1234567*2)").observation == ERROR_OBSERVATION
    assert _env().step("calc(" + "9" * 5000 + "*" + "9" * 5000 + ")").observation == ERROR_OBSERVATION
    assert calc_result("9" * 7 + "+1") is None


@pytest.mark.parametrize("action", ["#14293", "14265)", "", "cal(3*4)", "CALC(3*4)"])
def test_no_call_ends_the_episode(action):
    assert _env().step(action) == StepResult("", done=True)


def test_environment_contract_and_bad_input():
    env = CalculatorTask(max_turns=2).environment()
    assert env.stop_strings == (")",) and env.max_turns == 2
    assert CalculatorTask().environment() is not CalculatorTask().environment()
    with pytest.raises(TypeError, match="action must be a str"):
        _env().step(None)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_turns"):
            CalculatorEnvironment(bad)


# ------------------------------------------------------------------ rewards on hand-written episodes
def test_correct_answer_after_a_call_is_rewarded():
    task = CalculatorTask()
    for text in ("calc(317*45)=14265\n#14293", "calc(317*45)=14265\ncalc(14265+28)=14293\n#14293", "#14293"):
        assert task.reward(text, PROBLEM) == 1.0 and task.is_correct(text, PROBLEM), text
    assert task.extract_answer("calc(317*45)=14265\n#14293") == "14293"


def test_an_observations_number_is_never_the_answer():
    task = CalculatorTask()
    p = task.make_problem(317, 45, 0)  # answer 14265: the product's observation holds exactly the answer
    assert p.answer == "14265"
    for text in ("calc(317*45)=14265\n",           # the episode ended on the observation (turn limit)
                 "calc(317*45)=14265",             # cut inside it
                 "calc(317*45)=14265\n#",          # an answer begun and not written
                 "calc(317*45)=14265\n14265",      # digits without '#'
                 "calc(317*45)=14265\n#14265\n",   # something after the answer
                 "#calc(317*45)=14265\n",          # '#' right before a call: the digits after it are the tool's
                 "calc(317*4)=14265\n#14265"):     # an "observation" the environment would not have written
        assert parse_episode(text) is None and task.reward(text, p) == 0.0, text
    assert task.reward("calc(317*45)=14265\n#14265", p) == 1.0  # the model's own copy is its answer


def test_wrong_or_malformed_answers_score_zero():
    task = CalculatorTask()
    for text in ("#14294", "calc(317*45)=14265\n#14265", "#014293", "# 14293", "#14293#14293", "14293", "",
                 "calc(317**45)=error\n#14293x", "calc(317*45)=14265\nhmm#14293"):
        assert task.reward(text, PROBLEM) == 0.0, text
    assert task.reward("calc(317**45)=error\n#14293", PROBLEM) == 1.0  # an error observation, then the answer


# ------------------------------------------------------------------ registration
def test_calculator_is_registered_and_a_valid_task():
    task = get_task("calculator")
    assert isinstance(task, CalculatorTask) and task.name == "calculator"
    validate_task(task, call=True)
    assert task_from_spec(task_spec(CalculatorTask(c_max=99))) == CalculatorTask(c_max=99)
    with pytest.raises(ValueError, match="p_tool"):
        CalculatorTask(p_tool=1.5)
    assert len({p.prompt for p in task.test_set()}) == task.test_size


def test_command_line_resolves_task_calculator():
    from grpo_lab.cli.main import build_parser

    args = build_parser().parse_args(["GRPO", "--task", "calculator"])
    assert get_task(args.task).name == "calculator"


# ------------------------------------------------------------------ the recipe's data
def test_recipe_data_calls_the_tool_in_its_share_with_true_observations():
    recipe = RECIPES["calculator"]
    task = make_task(recipe)
    assert (task.p_tool, task.p_second) == (recipe.p_tool, recipe.p_second) == (0.4, 0.5)
    rng = np.random.default_rng(0)
    problems = task.sample(2000, rng)
    texts = [task.demonstration(p, rng) for p in problems]
    calls = np.array([t.count("calc(") for t in texts])
    assert abs((calls > 0).mean() - 0.4) < 0.035 and abs((calls == 2).mean() - 0.2) < 0.03  # ~4 sd of a binomial
    for text, p, n in zip(texts, problems, calls):
        a, b, c = (p.meta[k] for k in "abc")
        assert task.is_correct(text, p), text
        assert set(text) <= set(CALC_ALPHABET)
        for expression, obs in re.findall(r"calc\(([^()]*)\)(=[^\n]*\n)", text):
            assert re.fullmatch(r"\d+[*+]\d+", expression)  # the call's syntax
            assert obs == calc_observation(expression) == f"={calc_result(expression)}\n"
        if n >= 1:
            assert text.startswith(f"calc({a}*{b})={a * b}\n")  # the observation is the true product


def test_tool_response_goldens_and_recipe_record():
    assert tool_response(317, 45, 28, 0) == "#14293"
    assert tool_response(317, 45, 28, 2) == "calc(317*45)=14265\ncalc(14265+28)=14293\n#14293"
    with pytest.raises(ValueError, match="n_calls"):
        tool_response(1, 2, 3, 3)
    d = RECIPES["calculator"].to_dict()
    assert d["task"] == "calculator" and (d["p_tool"], d["p_second"]) == (0.4, 0.5) and "p_reason" not in d
    assert "p_tool" not in RECIPES["arithmetic"].to_dict()  # the other recipes' records are unchanged


# ------------------------------------------------------------------ the stand-in episode loop and the card
def test_card_statistics_on_a_hand_made_rollout():
    from grpo_lab.lab.tool_card import episode_stats

    class R:  # two episodes: a call then the answer (5 model, 2 obs, 2 model tokens), and a direct wrong answer
        texts = ["calc(317*45)=14265\n#14293", "#1"]
        completion_mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0, 0, 0, 0]]).float()
        observation_mask = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 0, 0], [0] * 9]).bool()
        truncated = torch.tensor([False, False])
        problems = [PROBLEM, PROBLEM]

    s = episode_stats(R, CalculatorTask())
    assert (s["accuracy"], s["accuracy_with_call"], s["accuracy_without_call"]) == (0.5, 1.0, 0.0)
    assert (s["calls_per_episode"], s["turns_per_episode"], s["tool_use_frac"]) == (0.5, 1.5, 0.5)
    assert s["observation_token_share"] == round(2 / 12, 4) and s["mean_model_tokens"] == 5.0


@pytest.mark.skipif(not (BASE / "recipe.json").is_file(), reason="calculator-base not built")
def test_episodes_of_the_shipped_checkpoint_hold_the_environments_observations():
    from grpo_lab.policy.episodes import generate_episodes
    from grpo_lab.policy.models import load_policy

    model, tok = load_policy(BASE)
    task = CalculatorTask()
    torch.manual_seed(0)
    ep = generate_episodes(model, tok, task, task.test_set()[:16], group_size=2, max_new_tokens=64, temperature=1.0,
                           with_logprobs=False)
    assert not (ep.completion_mask.bool() & ep.observation_mask).any()
    for r, text in enumerate(ep.texts):
        for expression, obs in re.findall(r"calc\(([^()]*)\)(=[^\n]*\n)", text):
            assert obs == calc_observation(expression)  # every observation is the environment's
    assert any("calc(" in t for t in ep.texts)


@pytest.mark.skipif(not (BASE / "recipe.json").is_file(), reason="calculator-base not built")
def test_shipped_card_records_the_tool_use():
    from grpo_lab.lab.pretrain import sha256_file

    record = json.loads((BASE / "recipe.json").read_text())
    assert record["recipe"] == RECIPES["calculator"].to_dict()
    assert record["model_sha256"] == sha256_file(BASE / "model.safetensors")
    m = record["metrics"]
    assert 0.1 < m["sampled_tool_use_frac"] < 0.9  # calls the tool sometimes
    assert m["sampled_accuracy_with_call"] > m["sampled_accuracy_without_call"]  # and calling helps
    assert 0 < m["sampled_observation_token_share"] < 0.5
