"""What a fresh user ran into in the trainer, the models and the checkpoints (issue 15 follow-up).

Each test names the failure it replaces: before the fix these raised a raw error from deep inside
pandas, transformers or torch, trained silently, or printed noise; now each fails early with a
message that says what is wrong and how to fix it.
"""

import dataclasses
import warnings

import pytest
import torch
from transformers.utils import logging as hf_logging

from grpo_lab.algo.advantages import ADVANTAGE_ESTIMATORS, GROUP_BASELINE_ESTIMATORS, AdvantageBatch
from grpo_lab.algo.algorithms import DAPO, GRPO
from grpo_lab.policy.models import TinyConfig, load_policy, tiny_policy
from grpo_lab.policy.rollout import evaluate, generate, policy_logprobs, position_limit
from grpo_lab.algo.selection import overlong_cache_tokens
from grpo_lab.tasks import ArithmeticTask, Problem
from grpo_lab.training.trainer import Trainer, TrainerConfig

TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)


def make_trainer(tok, task=None, algo=GRPO, **kw):
    cfg = dict(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False, lr=1e-2, seed=0)
    cfg.update(kw)
    return Trainer(tiny_policy(tok, TINY, seed=0), tok, task or ArithmeticTask(test_size=3), algo, TrainerConfig(**cfg))


# ------------------------------------------------------------------ 1. the L_cache message
def test_a_fixed_l_cache_over_half_the_budget_states_the_rule_and_both_fixes():
    # Before: "L_cache=5 tokens does not fit the generation budget L_max=8", which reads as false (5 <= 8).
    with pytest.raises(ValueError) as info:
        overlong_cache_tokens(GRPO.replace(overlong_cache_len=5), 8)
    msg = str(info.value)
    assert "does not fit" not in msg
    assert "at most L_max / 2 (= 4 here)" in msg  # 8 / 2, by hand
    assert "L_max - L_cache = 3 tokens" in msg  # 8 - 5: answers longer than 3 tokens would be penalised
    assert "algo.replace(overlong_cache_len=None, overlong_cache_frac=0.2)" in msg
    assert "--set overlong_cache_len=none --set overlong_cache_frac=0.2" in msg
    assert "L_cache = 2 tokens here" in msg  # round(0.2 * 8) = round(1.6) = 2, by hand
    # an odd budget: L_max / 2 = 3.5, so a fixed count of at most 3 tokens
    with pytest.raises(ValueError, match=r"\(= 3\.5 here\).*at most 3$"):
        overlong_cache_tokens(GRPO.replace(overlong_cache_len=4), 7)
    assert overlong_cache_tokens(GRPO.replace(overlong_cache_len=4), 8) == 4  # L_cache = L_max / 2 is allowed


def test_both_overlong_fields_set_names_the_command_line_fix():
    with pytest.raises(ValueError, match=r"not both.*DAPO\.replace\(overlong_cache_frac=None, overlong_cache_len=6\)"
                                         r".*--set overlong_cache_frac=none --set overlong_cache_len=6"):
        DAPO.replace(overlong_cache_len=6)


def test_the_command_line_fixes_in_the_messages_parse_and_work():
    # The --set forms the two messages print are accepted by the CLI and give a valid algorithm.
    from grpo_lab.cli.main import parse_set

    _, algo_over = parse_set(["overlong_cache_len=none", "overlong_cache_frac=0.2"])
    fixed = GRPO.replace(overlong_cache_len=5).replace(**algo_over)
    assert fixed.overlong_cache_len is None and overlong_cache_tokens(fixed, 8) == 2
    _, algo_over = parse_set(["overlong_cache_frac=none", "overlong_cache_len=3"])
    assert overlong_cache_tokens(DAPO.replace(**algo_over), 8) == 3


# ------------------------------------------------------------------ 2. an empty test set
@dataclasses.dataclass
class EmptyTestSet(ArithmeticTask):
    name: str = "empty-test"

    def test_set(self):
        return []


def test_an_empty_test_set_is_named_when_evaluating(tok):
    # Before: KeyError: 'correct' from pandas, inside rollout.evaluate.
    model = tiny_policy(tok, TINY, seed=0)
    with pytest.raises(ValueError, match=r"'empty-test' \(EmptyTestSet\): test_set\(\) returned no problems"):
        evaluate(model, tok, EmptyTestSet())
    with pytest.raises(ValueError, match="no problems given"):
        evaluate(model, tok, ArithmeticTask(test_size=3), problems=[])
    tr = make_trainer(tok, EmptyTestSet(), eval_every=1)
    with pytest.raises(ValueError, match=r"'empty-test'.*test_set\(\).*eval_every=0"):
        tr.train(1)
    assert make_trainer(tok, EmptyTestSet(), eval_every=0).train(1)["step"].tolist() == [1]  # no evaluation: trains


# ------------------------------------------------------------------ 3. what task.sample returns
@dataclasses.dataclass
class BadSample(ArithmeticTask):
    name: str = "bad-sample"
    kind: str = "strings"

    def sample(self, n, rng):
        good = super().sample(n, rng)
        if self.kind == "strings":
            return [p.prompt for p in good]
        if self.kind == "one more":
            return good + good[:1]
        if self.kind == "empty prompt":
            return [Problem("", "0")] + good[1:]
        return (p for p in good)  # a generator


@pytest.mark.parametrize("kind, what", [
    ("strings", r"a list whose item 0 is str '"),  # before: AttributeError: 'str' object has no attribute 'prompt'
    ("one more", r"3 problems"),  # before: trained silently on 3 questions
    ("empty prompt", r"a list whose item 0 has the prompt ''"),  # before: ValueError: generate: empty prompt
    ("generator", r"a generator"),  # before: TypeError: object of type 'generator' has no len()
])
def test_what_sample_returns_is_checked(tok, kind, what):
    tr = make_trainer(tok, BadSample(test_size=3, kind=kind))
    with pytest.raises(TypeError, match=r"task 'bad-sample' \(BadSample\): sample\(2, rng\) returned " + what
                       + r".*task protocol \(grpo_lab\.tasks\.Task\) needs a list of exactly 2 "
                         r"grpo_lab\.tasks\.Problem"):
        tr.train(1)


# ------------------------------------------------------------------ 4. a model's position limit
def gpt2(tok, n_positions):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_positions=n_positions, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return GPT2LMHeadModel(config).eval()


def test_generation_past_an_absolute_position_limit_fails_clearly(tok):
    # Before: IndexError: index out of range in self, from torch.embedding inside generate.
    model = gpt2(tok, n_positions=8)
    assert position_limit(model) == 8
    problems = [Problem("12+34=", "46"), Problem("1+2=", "3")]  # the longest prompt has 6 characters = tokens
    with pytest.raises(ValueError, match=r"longest prompt \(6 tokens\) plus max_new_tokens=8 is 14 positions, more "
                                         r"than the model's limit of 8 \(GPT2LMHeadModel: config\.n_positions=8"):
        generate(model, tok, problems, group_size=2, max_new_tokens=8)
    # 6 + 2 = 8 positions fit exactly: generation and the training forward both run
    ro = generate(model, tok, problems, group_size=2, max_new_tokens=2)
    assert ro.prompt_ids.shape[1] + ro.completion_ids.shape[1] <= 8
    assert torch.isfinite(policy_logprobs(model, ro)).all()


def test_rotary_models_have_no_hard_position_limit_but_are_held_to_their_trained_length(tok):
    # RoPE computes the rotation for any position: max_position_embeddings is the trained length only, and past
    # it the outputs degrade silently (M10: prompts of 200 tokens trained on a 128-position model): refused,
    # unless the config declares a context extension (rope_type yarn, linear, ...).
    model = tiny_policy(tok, dataclasses.replace(TINY, max_position_embeddings=8), seed=0).eval()
    assert position_limit(model) is None
    with pytest.raises(ValueError, match=r"longest prompt \(6 tokens\) plus max_new_tokens=8 is 14 positions, more "
                                         r"than the model's limit of 8 \(Qwen2ForCausalLM: "
                                         r"config\.max_position_embeddings=8, the length its rotary"):
        generate(model, tok, [Problem("12+34=", "46")], max_new_tokens=8, greedy=True)
    ro = generate(model, tok, [Problem("12+34=", "46")], max_new_tokens=2, greedy=True)  # 6 + 2 = 8 fits
    assert ro.completion_ids.shape[1] >= 1
    model.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert generate(model, tok, [Problem("12+34=", "46")], max_new_tokens=8, greedy=True).completion_ids.shape[1] >= 1


def test_a_trainer_on_a_short_rotary_model_stops_before_its_first_update(tok):
    tr = Trainer(tiny_policy(tok, dataclasses.replace(TINY, max_position_embeddings=12), seed=0), tok,
                 ArithmeticTask(test_size=3), GRPO, TrainerConfig(prompts_per_step=2, group_size=2, max_new_tokens=12,
                                                                  eval_every=0, progress=False, seed=0))
    with pytest.raises(ValueError, match=r"max_new_tokens=12 is \d+ positions, more than the model's limit of 12"):
        tr.train(1)
    assert tr.step == 0 and not tr.optimizer.state


# ------------------------------------------------------------------ 5. group_size=1
@pytest.mark.parametrize("estimator", ["group", "group_mean", "batch", "rloo"])
def test_group_size_one_with_a_group_baseline_warns(tok, estimator):
    # Before: it trained silently, every advantage exactly 0 (rloo raised at the first step).
    algo = GRPO.replace(name="g1", advantage=estimator)
    with pytest.warns(RuntimeWarning, match=rf"group_size=1 with the advantage estimator '{estimator}'.*G >= 2"):
        make_trainer(tok, algo=algo, group_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_trainer(tok, algo=algo, group_size=2)  # a group of two: no warning


def test_group_size_one_with_an_estimator_outside_the_list_does_not_warn(tok, monkeypatch):
    # an estimator that needs no group (a value baseline, as GAE would be) registered by a user
    def value_baseline(batch):
        return batch.rewards.float() - 0.5

    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "value_baseline", value_baseline)
    algo = GRPO.replace(name="vb", advantage="value_baseline")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_trainer(tok, algo=algo, group_size=1)
    GROUP_BASELINE_ESTIMATORS.add("value_baseline")  # as the author of a group-baseline estimator would
    try:
        with pytest.warns(RuntimeWarning, match="'value_baseline'"):  # the list decides, not the name
            make_trainer(tok, algo=algo, group_size=1)
    finally:
        GROUP_BASELINE_ESTIMATORS.discard("value_baseline")


def test_the_group_baseline_list_holds_the_estimators_that_vanish_at_g_1():
    # With G = 1, each listed estimator gives all-zero advantages or refuses; the list is what the
    # trainer's warning reads, so it must hold every such built-in.
    # value-based estimators get per-token values (a critic's), which is all they need
    batch = AdvantageBatch.from_groups(torch.tensor([1.0, 0.0, 2.0]), 1, mask=torch.ones(3, 2),
                                       values=torch.full((3, 2), 0.5))
    for name, fn in ADVANTAGE_ESTIMATORS.items():
        try:
            vanishes = bool((fn(batch, **GRPO.values_for(fn)) == 0).all())
        except ValueError:
            vanishes = True
        assert vanishes == (name in GROUP_BASELINE_ESTIMATORS), name


# ------------------------------------------------------------------ 6. damaged checkpoints, missing tokenizers
@pytest.fixture
def checkpoint(tok, tmp_path):
    tr = make_trainer(tok)
    return tr.save(tmp_path / "ck"), tr.task


@pytest.mark.parametrize("damage, name", [
    ("policy/model.safetensors", r"policy/model\.safetensors"),  # before: transformers' OSError
    ("policy/tokenizer.json", r"policy/tokenizer\.json"),  # before: a sentencepiece / tiktoken message
    ("policy/config.json", r"policy/config\.json"),  # before: load_policy's FileNotFoundError
    ("ref/model.safetensors", r"ref/model\.safetensors"),  # before: transformers' OSError
])
def test_resume_names_a_missing_checkpoint_file(checkpoint, damage, name):
    ck, task = checkpoint
    (ck / damage).unlink()
    with pytest.raises(ValueError, match=rf"corrupt checkpoint, .* lacks {name}"):
        Trainer.resume(ck, task=task)


def test_resume_names_a_damaged_weights_file(checkpoint):
    ck, task = checkpoint
    (ck / "policy" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match=r"policy cannot be loaded .*the checkpoint is corrupt"):
        Trainer.resume(ck, task=task)


def test_load_policy_names_missing_tokenizer_files(tok, tmp_path):
    model = tiny_policy(tok, TINY, seed=0)
    model.save_pretrained(tmp_path / "weights-only")
    # before: no error at all: a Qwen2 config gave an empty Qwen2Tokenizer (1 token, "1+2=" encoded as [])
    with pytest.raises(FileNotFoundError, match=r"weights-only has a model but no complete tokenizer: it lacks "
                                                r"tokenizer\.json and tokenizer_config\.json"
                                                r".*tokenizer\.save_pretrained"):
        load_policy(tmp_path / "weights-only")
    model.save_pretrained(tmp_path / "no-vocab")
    tok.save_pretrained(tmp_path / "no-vocab")
    (tmp_path / "no-vocab" / "tokenizer.json").unlink()  # the character tokenizer's whole vocabulary
    # before: ValueError "Couldn't instantiate the backend tokenizer ... You need to have sentencepiece or tiktoken"
    with pytest.raises(FileNotFoundError,
                       match=r"no-vocab has a model but no complete tokenizer: it lacks tokenizer\.json\."):
        load_policy(tmp_path / "no-vocab")
    tok.save_pretrained(tmp_path / "no-vocab")
    loaded, loaded_tok = load_policy(tmp_path / "no-vocab")  # complete again: loads
    assert loaded_tok("1+2=")["input_ids"] == tok("1+2=")["input_ids"]


# ------------------------------------------------------------------ 7. the save progress bar
@pytest.fixture
def hf_bars_on():
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    yield
    (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


@pytest.mark.parametrize("progress", [False, True])
def test_save_shows_the_writing_bar_only_with_progress(tok, tmp_path, capfd, hf_bars_on, progress):
    # Before: "Writing model shards: 100%|..." on stderr at every save, even with progress=False.
    tr = make_trainer(tok, progress=progress)
    capfd.readouterr()
    tr.save(tmp_path / "ck")
    out = capfd.readouterr()
    assert ("Writing model shards" in out.err + out.out) == progress
    assert hf_logging.is_progress_bar_enabled()  # transformers' global setting is restored
