"""The dialogue toy (issue 55): the gold reward by hand, the task's two rewards (proxy to train on, gold to test on),
and the proxy reward model's deterministic rebuild."""

import hashlib
import json

import numpy as np
import pandas as pd
import pytest

from grpo_lab.lab import proxy_reward_model
from grpo_lab.paths import checkpoint_dir
from grpo_lab.tasks import DialogueTask, get_task, validate_task
from grpo_lab.tasks.dialogue import GOLD_WEIGHTS, gold_parts, gold_reward


def test_gold_reward_by_hand():
    # by hand: 9 words, 3 target words (object, class, value) -> target 1; 9 distinct of 9 -> 1; "value." ends a
    # sentence -> 1; 5 <= 9 <= 40 -> 1; gold = 0.4 + 0.3 + 0.15 + 0.15 = 1
    text = " an object of the class has a value. "
    assert gold_parts(text) == {"target": 1.0, "distinct": 1.0, "sentence": 1.0, "length": 1.0}
    assert gold_reward(text) == pytest.approx(1.0)
    # by hand: "object" x 6 -> target min(1, 6/3) = 1, distinct 1/6, no sentence end, 6 words -> length 1
    rep = "object object object object object object"
    assert gold_parts(rep) == pytest.approx({"target": 1.0, "distinct": 1 / 6, "sentence": 0.0, "length": 1.0})
    assert gold_reward(rep) == pytest.approx(0.4 + 0.3 / 6 + 0.15)
    # by hand: 1 target word of 4 -> 1/3; 4 distinct; no sentence; 4 words < 5 -> length 0
    assert gold_reward("the name is x") == pytest.approx(0.4 / 3 + 0.3)
    assert gold_reward("") == 0.0 and gold_reward("...") == 0.0
    assert sum(GOLD_WEIGHTS.values()) == pytest.approx(1.0)
    with pytest.raises(TypeError, match="must be a str"):
        gold_reward(None)


def test_task_trains_on_the_proxy_and_tests_on_gold():
    task = get_task("dialogue")
    validate_task(task, call=True)
    problems = task.sample(4, np.random.default_rng(0))
    assert len(problems) == 4 and all(p.prompt and p.answer == "" for p in problems)
    assert len(task.test_set()) == task.test_size == 64
    texts = [" an object of the class has a value. ", "object " * 16, " x"]
    proxy = task.rewards(texts, problems[:3])
    assert len(proxy) == 3 and all(np.isfinite(proxy))
    assert task.reward(texts[0], problems[0]) == pytest.approx(proxy[0], abs=1e-5)
    assert [task.is_correct(t, problems[0]) for t in texts] == [gold_reward(t) >= 0.75 for t in texts]
    m = task.test_metrics(pd.DataFrame({"completion": texts}))
    gold = np.mean([gold_reward(t) for t in texts])
    assert m["gold_mean"] == pytest.approx(gold) and m["proxy_mean"] == pytest.approx(np.mean(proxy), abs=1e-5)
    assert m["proxy_gold_gap"] == pytest.approx(m["proxy_mean"] - m["gold_mean"])
    assert m["gold_distinct"] == pytest.approx(np.mean([gold_parts(t)["distinct"] for t in texts]))
    # by hand: with 3 responses, Spearman is 1 - 6 * sum(d^2) / (3 * 8) over the rank differences d
    rp, rg = np.argsort(np.argsort(proxy)), np.argsort(np.argsort([gold_reward(t) for t in texts]))
    assert m["proxy_gold_spearman"] == pytest.approx(1 - 6 * float(((rp - rg) ** 2).sum()) / 24)
    assert task.test_metrics(pd.DataFrame({"completion": ["x", "x"]}))["proxy_gold_spearman"] == 0.0
    with pytest.raises(ValueError, match="gold_threshold"):
        DialogueTask(gold_threshold=2.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        DialogueTask(max_new_tokens=0)


def test_the_shipped_proxy_tracks_gold_on_base_samples_and_its_hash_is_recorded():
    rec = json.loads((checkpoint_dir("dialogue-rm") / "recipe.json").read_text())
    weights = (checkpoint_dir("dialogue-rm") / "model.safetensors").read_bytes()
    assert hashlib.sha256(weights).hexdigest() == rec["sha256"]
    assert rec["held_out"]["spearman"] > 0.3  # it tracks gold where it was fitted (the base's distribution)


def test_the_reward_model_rebuilds_deterministically(tmp_path):
    small = proxy_reward_model.RewardModelRecipe(n_train=16, n_held_out=8, max_new_tokens=8, epochs=2, batch=8)
    a = proxy_reward_model.build_reward_model(tmp_path / "a", small)
    b = proxy_reward_model.build_reward_model(tmp_path / "b", small)
    assert a["sha256"] == b["sha256"] and a == b
    other = proxy_reward_model.build_reward_model(tmp_path / "c", small.__class__(**{**small.__dict__, "seed": 1}))
    assert other["sha256"] != a["sha256"]  # the test can fail: another seed gives other weights


def test_the_run_cache_fingerprint_covers_the_reward_model(tmp_path):
    import shutil

    from grpo_lab.experiments.profiles import PROFILES, Profile
    from grpo_lab.experiments.run_cache import run_fingerprint

    rm = tmp_path / "rm"
    shutil.copytree(checkpoint_dir("dialogue-rm"), rm)
    prof = Profile(name="d", base="corpus-base", task="dialogue", steps=1, config=PROFILES["cpu"].config,
                   task_kwargs={"reward_model": str(rm)})
    before = run_fingerprint(prof)
    with open(rm / "config.json", "a") as f:
        f.write("\n")  # another reward model: cached runs must not be reused
    assert run_fingerprint(prof) != before
