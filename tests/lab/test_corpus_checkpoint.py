"""The committed corpus checkpoints of chapter 7 (RPT, arXiv 2506.08007) and the next-token task's data
files: they load, match their recorded recipe, reproduce from the code, and score what they claim.

``data/checkpoints/corpus-proxy-base`` (``python -m grpo_lab.lab.pretrain corpus-proxy``, which also writes
``data/tasks/next_token_train.safetensors`` and ``next_token_test.jsonl``) and
``data/checkpoints/corpus-base`` (``python -m grpo_lab.lab.pretrain corpus``). Also the pieces of code
that only these checkpoints exercise: ``continue_ntp`` / ``continued_ntp_run`` (chapter 7's
continued-NTP baseline), ``NextTokenTask.test_metrics`` and the trainer's ``test_<name>`` columns,
and ``experiments.map_workers``.

The corpus is CPython's ``pydoc_data.topics``: another CPython release ships another text, and then
the tests that rebuild something from the corpus skip (:func:`_same_corpus_or_skip`). Goldens: the
recorded values come from ``recipe.json`` and the committed files; the ``test_metrics`` values were
worked out by hand next to the frames.
"""

from grpo_lab.experiments import workers as workers_mod
import copy
import json
import math
import operator
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from grpo_lab.policy.models import count_parameters, load_policy
from grpo_lab.paths import checkpoint_dir, data_dir
from grpo_lab.lab.pretrain import RECIPES, _Corpus, continue_ntp, continued_ntp_run, sha256_file
from grpo_lab.policy.rollout import evaluate
from grpo_lab.tasks import next_token as nt
from grpo_lab.tasks.base import load_problems
from grpo_lab.tasks.next_token import NextTokenTask, corpus_sha256, load_corpus

NAMES = ("corpus", "corpus-proxy")
TASKS_DIR = data_dir() / "tasks"


def _dir(name):
    return checkpoint_dir(f"{name}-base")


def _record(name):
    return json.loads((_dir(name) / "recipe.json").read_text())


def _same_corpus_or_skip(name="corpus"):
    """Skip a test that rebuilds something from the corpus when this CPython's ``pydoc_data.topics``
    is not the text the checkpoint was built from (another CPython release): the rebuilt tokenizer,
    split, losses and data files would differ for that reason alone."""
    rec = _record(name)["corpus"]
    here = corpus_sha256(load_corpus())
    if here != rec["sha256"]:
        pytest.skip(f"this CPython's pydoc_data.topics (sha256 {here[:12]}…) is not the corpus {name}-base was "
                    f"built from ({rec['sha256'][:12]}…, Python {_record(name)['versions']['python']}): "
                    "another CPython release; the corpus-dependent checks do not apply")


@pytest.fixture(scope="module")
def base():
    return load_policy(_dir("corpus"))


@pytest.fixture(scope="module")
def proxy():
    return load_policy(_dir("corpus-proxy"))


@pytest.fixture
def keep_threads():
    # pretrain / continued_ntp_run set torch's thread count; give the next tests the one they had
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


# ---- 1. the records ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_recipe_matches_code(name):
    # the checkpoint was produced by the recipe that `python -m grpo_lab.lab.pretrain NAME` runs today
    assert _record(name)["recipe"] == RECIPES[name].to_dict()


@pytest.mark.parametrize("name", NAMES)
def test_files_are_the_recorded_ones(name):
    rec, d = _record(name), _dir(name)
    assert sha256_file(d / "model.safetensors") == rec["model_sha256"]
    assert sha256_file(d / "tokenizer.json") == rec["tokenizer_sha256"]


@pytest.mark.parametrize("name", NAMES)
def test_size_and_format(name):
    rec, d = _record(name), _dir(name)
    model, tok = load_policy(d)
    assert count_parameters(model) == rec["parameters"]
    assert (d / "model.safetensors").is_file()
    assert not [p.name for p in d.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl")]
    assert all(p.stat().st_size < 4 * 2**20 for p in d.iterdir())  # small, fit for git
    assert len(tok) == RECIPES[name].vocab_size and model.config.vocab_size >= len(tok)
    assert tok.padding_side == "left" and tok.eos_token_id is not None


def test_data_files_are_small():
    for f in (nt.TRAIN_FILE, nt.TEST_FILE):
        assert (TASKS_DIR / f).is_file() and (TASKS_DIR / f).stat().st_size < 4 * 2**20


def test_the_recorded_corpus_is_this_pythons():
    a, b = _record("corpus")["corpus"], _record("corpus-proxy")["corpus"]
    assert a["sha256"] == b["sha256"] and a["source"] == b["source"] == "pydoc_data.topics"
    _same_corpus_or_skip()
    assert corpus_sha256(load_corpus()) == a["sha256"]
    from safetensors import safe_open

    with safe_open(str(TASKS_DIR / nt.TRAIN_FILE), "pt") as f:  # the data files come from the same text
        assert f.metadata()["corpus_sha256"] == a["sha256"]


# ---- 2. the tokenizer ----------------------------------------------------------------------------------
def test_tokenizer_retrains_to_the_committed_one(base):
    _same_corpus_or_skip()
    fresh = _Corpus(RECIPES["corpus"]).tokenizer  # BPE trained from scratch on the pretrain part
    _, tok = base
    assert fresh.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert fresh.get_vocab() == tok.get_vocab()
    # both checkpoints ship this one tokenizer (the proxy's entropies index the same token stream)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (_dir("corpus") / f).read_bytes() == (_dir("corpus-proxy") / f).read_bytes()
    assert RECIPES["corpus"].vocab_size == RECIPES["corpus-proxy"].vocab_size


# ---- 3. the recorded metrics reproduce ------------------------------------------------------------------
def test_greedy_accuracy_reproduces(base):
    model, tok = base
    m = _record("corpus")["metrics"]
    summary, frame = evaluate(model, tok, NextTokenTask(), greedy=True)
    assert len(frame) == len(NextTokenTask().test_set()) == 600
    # greedy decoding is deterministic; allow a couple of argmax ties to flip on another CPU
    assert abs(summary["accuracy"] - m["greedy_accuracy"]) <= 0.015
    assert abs(summary["mean_length"] - m["greedy_mean_length"]) <= 0.05
    splits = nt.entropy_split(frame["entropy"].to_numpy())
    assert set(m["greedy_accuracy_by_split"]) == {k for k, s in splits.items() if s.any()}
    for k, acc in m["greedy_accuracy_by_split"].items():
        n = int(splits[k].sum())
        assert abs(float(frame["correct"][splits[k]].mean()) - acc) <= max(0.015, 2 / n), k


@pytest.mark.parametrize("name", NAMES)
def test_held_out_loss_reproduces(name, base, proxy):
    _same_corpus_or_skip(name)
    model, tok = base if name == "corpus" else proxy
    corpus = _Corpus(RECIPES[name], tokenizer=tok)  # the committed tokenizer: no retraining
    rec = _record(name)
    assert len(corpus.train) == rec["corpus"]["pretrain_tokens"] and len(corpus.held) == rec["corpus"]["test_tokens"]
    loss = corpus.held_out_loss(model)
    assert abs(loss - rec["metrics"]["held_out_loss"]) <= 0.01
    assert loss < math.log(len(tok)) - 2  # far below a uniform guess: it learned the language


# ---- 4. pretraining is deterministic -------------------------------------------------------------------
def test_corpus_pretraining_is_deterministic(tmp_path, monkeypatch, keep_threads):
    # Two short pretraining runs of the corpus recipe give bit-identical weights (the committed
    # checkpoint is this recipe at full length); a different seed gives different weights.
    from grpo_lab.lab.pretrain import pretrain

    recorded = _record("corpus")["corpus"]  # read before the data directory moves
    monkeypatch.setenv("GRPO_LAB_DATA", str(tmp_path / "data"))
    small = replace(RECIPES["corpus"], steps=3, batch_size=4, warmup=2)
    a = pretrain(small, tmp_path / "a", progress=False, evaluate=False, name="corpus")
    b = pretrain(small, tmp_path / "b", progress=False, evaluate=False, name="corpus")
    c = pretrain(replace(small, seed=1), tmp_path / "c", progress=False, evaluate=False, name="corpus")
    assert a["model_sha256"] == b["model_sha256"] != c["model_sha256"]
    assert a["model_sha256"] == sha256_file(tmp_path / "a" / "model.safetensors")
    assert a["metrics"] is None and a["recipe"] == small.to_dict()
    # the tokenizer does not depend on the seed; it is the committed one when the corpus is
    assert a["tokenizer_sha256"] == c["tokenizer_sha256"] == sha256_file(tmp_path / "a" / "tokenizer.json")
    assert a["corpus"]["split"] == recorded["split"] or corpus_sha256(load_corpus()) != recorded["sha256"]
    assert not (tmp_path / "data").exists()  # a custom out never writes into the data directory


# ---- 5. the task's data files reproduce ----------------------------------------------------------------
def test_task_data_reproduce(proxy, tmp_path):
    _same_corpus_or_skip("corpus-proxy")
    from safetensors.numpy import load_file

    model, tok = proxy
    summary = nt.build_task_data(model, tok, tmp_path)
    new, old = load_file(str(tmp_path / nt.TRAIN_FILE)), load_file(str(TASKS_DIR / nt.TRAIN_FILE))
    assert np.array_equal(new["ids"], old["ids"]) and new["ids"].dtype == old["ids"].dtype
    nan = np.isnan(old["entropy"])
    assert np.array_equal(np.isnan(new["entropy"]), nan) and 0 < nan.sum() < len(nan) // 2
    np.testing.assert_allclose(new["entropy"][~nan], old["entropy"][~nan], rtol=0, atol=1e-4)
    a, b = load_problems(tmp_path / nt.TEST_FILE), load_problems(TASKS_DIR / nt.TEST_FILE)
    assert len(a) == len(b) == 600
    for p, q in zip(a, b):
        assert (p.prompt, p.answer, p.meta["reference_tokens"], p.meta["position"]) == \
            (q.prompt, q.answer, q.meta["reference_tokens"], q.meta["position"])
        assert abs(p.meta["entropy"] - q.meta["entropy"]) <= 1e-3
    m = _record("corpus-proxy")["metrics"]
    assert (summary["train_tokens"], summary["train_positions"], summary["test_positions"]) == \
        (m["train_tokens"], m["train_positions"], m["test_positions"])
    np.testing.assert_allclose(summary["train_entropy_quantiles"], m["train_entropy_quantiles"], atol=2e-4)
    assert summary["split"] == _record("corpus-proxy")["corpus"]["split"]


# ---- 6. continued next-token prediction ----------------------------------------------------------------
def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_continue_ntp_is_seeded_and_in_place():
    torch.manual_seed(123)  # continue_ntp must not depend on torch's global RNG (dropout is 0)
    runs = {}
    for key, seed in (("a", 0), ("b", 0), ("c", 1)):
        model, tok = load_policy(_dir("corpus"))
        start = _params(model)
        log = continue_ntp(model, tok, steps=2, batch_size=4, seed=seed)
        assert set(log) == {"loss", "tokens"} and len(log["loss"]) == len(log["tokens"]) == 2
        assert all(math.isfinite(x) and x > 0 for x in log["loss"])
        # 4 windows of at least 32 context + <think></think> + 1 token + EOS, at most 64 tokens each
        assert all(isinstance(t, int) and 4 * 36 <= t <= 4 * 64 for t in log["tokens"])
        assert not model.training
        assert any(not torch.equal(x, y) for x, y in zip(start, model.parameters()))  # trained in place
        runs[key] = (_params(model), log)
    pa, pb, pc = (runs[k][0] for k in "abc")
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert runs["a"][1] == runs["b"][1]
    assert any(not torch.equal(x, y) for x, y in zip(pa, pc))


def test_continue_ntp_zero_steps_changes_nothing():
    model, tok = load_policy(_dir("corpus"))
    start = _params(model)
    model.train()
    assert continue_ntp(model, tok, steps=0) == {"loss": [], "tokens": []}
    assert not model.training and all(torch.equal(x, y) for x, y in zip(start, model.parameters()))


@pytest.mark.parametrize("kw, match", [({"steps": -1}, "steps must be an int >= 0"),
                                       ({"steps": 1.0}, "steps must be an int >= 0"),
                                       ({"steps": 1, "part": "train"}, "unknown part 'train'"),
                                       ({"steps": 1, "recipe": "arithmetic"}, "must name a corpus recipe"),
                                       ({"steps": 1, "recipe": "nope"}, "must name a corpus recipe")])
def test_continue_ntp_errors(base, kw, match):
    model, tok = base
    start = _params(model)
    with pytest.raises(ValueError, match=match):
        continue_ntp(model, tok, **kw)
    assert all(torch.equal(x, y) for x, y in zip(start, model.parameters()))  # refused before training


def test_continued_ntp_run(keep_threads):
    out = continued_ntp_run(0, steps=1, batch_size=4)
    n = len(NextTokenTask().test_set())
    assert (out["seed"], out["steps"]) == (0, 1) and out["tokens"] > 0 and math.isfinite(out["loss_last"])
    # the trained model's held-out loss: one NTP step from the base moves it off the recipe's value
    model, tok = load_policy(_dir("corpus"), dtype=torch.float32)
    continue_ntp(model, tok, steps=1, seed=0, batch_size=4)
    assert out["held_out_loss"] == pytest.approx(nt.held_out_loss(model, nt.held_out_ids(tok)), abs=1e-6)
    assert out["held_out_loss"] != pytest.approx(_record("corpus")["metrics"]["held_out_loss"], abs=1e-4)
    for key in ("frame", "sampled_frame"):
        f = out[key]
        assert len(f) == n and {"correct", "entropy", "completion"} <= set(f.columns)
        assert f["correct"].dtype == bool and np.isfinite(f["entropy"].to_numpy(dtype=float)).all()


# ---- 7. test_metrics and the trainer's columns ---------------------------------------------------------
def test_test_metrics_by_hand(base):
    _, tok = base
    for word in ("Ġthe", "Ġvalue", ","):  # the predictions below are these single tokens
        assert tok.convert_tokens_to_ids(word) != tok.unk_token_id, word
    # entropies (unsorted) 0.2 0.7 1.2 1.7 0.4 2.0; sorted 0.2 0.4 0.7 1.2 1.7 2.0, so by linear
    # interpolation q(1/3) = 0.4 + (2/3)(0.7 - 0.4) = 0.6 and q(2/3) = 1.2 + (1/3)(1.7 - 1.2) = 1.3667:
    #   low {0.2, 0.4}: correct 1, 1 -> 1.0;  mid {0.7, 1.2}: 0, 1 -> 0.5;  high {1.7, 2.0}: 0, 0 -> 0.0
    # nested splits: easy (>= 0.5) {0.7, 1.2, 1.7, 2.0}: 0 1 0 0 -> 0.25; medium (>= 1.0) {1.2, 1.7, 2.0}
    #   -> 1/3; hard (>= 1.5) {1.7, 2.0} -> 0.0
    # predictions " the", " the", ",", None, " the value", "": tokens 1 1 1 0 2 0 -> 5/6; " the" is the
    #   most common (2 of 6) -> 1/3
    frame = pd.DataFrame({"entropy": [0.2, 0.7, 1.2, 1.7, 0.4, 2.0],
                          "correct": [True, False, True, False, True, False],
                          "completion": ["</think> the", "</think> the", "</think>,", "no delimiter",
                                         "x</think> the value", "</think>"]})
    got = NextTokenTask().test_metrics(frame)
    want = {"accuracy_easy": 0.25, "accuracy_medium": 1 / 3, "accuracy_hard": 0.0, "accuracy_low": 1.0,
            "accuracy_mid": 0.5, "accuracy_high": 0.0, "prediction_tokens_mean": 5 / 6,
                "top_prediction_frac": 2 / 5}  # " the" twice among the 5 responses that made a prediction
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-12), k
    # no position reaches a split: NaN there. Entropies 0.1 0.2 0.3 0.4: q(1/3) = 0.2, q(2/3) = 0.3, so
    # low {0.1}: 1 -> 1.0, mid {0.2}: 0 -> 0.0, high {0.3, 0.4}: 1, 0 -> 0.5; predictions " the" twice,
    # "," and None (no prediction, not counted): top 2 of 3 -> 2/3, tokens 1 1 1 0 -> 0.75
    frame = pd.DataFrame({"entropy": [0.1, 0.2, 0.3, 0.4], "correct": [True, False, True, False],
                          "completion": ["</think> the", "</think> the", "</think>,", "no delimiter"]})
    got = NextTokenTask().test_metrics(frame)
    assert all(math.isnan(got[f"accuracy_{k}"]) for k in ("easy", "medium", "hard"))
    assert (got["accuracy_low"], got["accuracy_mid"], got["accuracy_high"]) == (1.0, 0.0, 0.5)
    assert got["top_prediction_frac"] == pytest.approx(2 / 3) and got["prediction_tokens_mean"] == 0.75


class _Recording(NextTokenTask):
    """NextTokenTask that keeps the frames ``test_metrics`` was given."""

    def test_metrics(self, frame):
        self.frames = getattr(self, "frames", []) + [frame]
        return super().test_metrics(frame)


def test_trainer_adds_the_test_metrics_columns(base, keep_threads):
    from grpo_lab.algo.algorithms import GRPO
    from grpo_lab.training.trainer import Trainer, TrainerConfig

    model, tok = load_policy(_dir("corpus"))  # a copy: the trainer updates it
    task = _Recording()
    cfg = TrainerConfig(prompts_per_step=2, group_size=2, eval_every=1, eval_sampled=True, threads=1, seed=0,
                        progress=False, lr=1e-2)
    tr = Trainer(model, tok, task, GRPO, cfg)
    hist = tr.train(1)
    names = NextTokenTask().test_metrics(pd.DataFrame({"entropy": [0.0, 1.0, 2.0], "correct": [True] * 3,
                                                       "completion": ["</think> a"] * 3}))
    for k in names:
        assert f"test_{k}" in hist and f"test_sampled_{k}" in hist, k
    evals = hist.dropna(subset=["test_accuracy"]).set_index("step")
    assert list(evals.index) == [0, 1]
    # step 0 is the base policy: a fresh greedy evaluation of it gives the same columns
    s0, f0 = evaluate(base[0], base[1], NextTokenTask(), greedy=True)
    assert evals.loc[0, "test_accuracy"] == s0["accuracy"]
    for k, v in NextTokenTask().test_metrics(f0).items():
        assert evals.loc[0, f"test_{k}"] == pytest.approx(v, abs=1e-12, nan_ok=True), k
    # step 1 holds the evaluation after the update: the trainer's policy, evaluated afresh
    s1, f1 = evaluate(tr.policy, tok, NextTokenTask(), greedy=True)
    assert evals.loc[1, "test_accuracy"] == s1["accuracy"]
    for k, v in NextTokenTask().test_metrics(f1).items():
        assert evals.loc[1, f"test_{k}"] == pytest.approx(v, abs=1e-12, nan_ok=True), k
    # the sampled columns come from the sampled frames (greedy, sampled at each evaluation)
    assert len(task.frames) == 4
    for step, (greedy, sampled) in zip((0, 1), (task.frames[0:2], task.frames[2:4])):
        assert greedy["completion"].tolist() != sampled["completion"].tolist()
        assert evals.loc[step, "test_accuracy_sampled"] == sampled["correct"].mean()
        for k, v in NextTokenTask().test_metrics(sampled).items():
            assert evals.loc[step, f"test_sampled_{k}"] == pytest.approx(v, abs=1e-12, nan_ok=True), k
    assert evals.loc[0, "test_accuracy_hard"] == pytest.approx(
        f0["correct"][nt.entropy_split(f0["entropy"].to_numpy())["hard"]].mean())


def _float64_held_out_loss(model, ids, width=64):
    """The reference: the same windows through a float64 copy of ``model``, log-softmax and the mean of
    the targets' negative log-probs written out (no cross_entropy)."""
    m = copy.deepcopy(model).double().eval()
    x = torch.as_tensor(ids)
    n = (len(x) - 1) // width
    inp, tgt = x[: n * width].view(n, width), x[1: n * width + 1].view(n, width)
    with torch.no_grad():
        logp = torch.log_softmax(m(input_ids=inp, use_cache=False).logits, dim=-1)
    return float(-logp.gather(-1, tgt.unsqueeze(-1)).mean())


def test_held_out_loss_against_a_float64_reference(base):
    model, tok = base
    ids = nt.held_out_ids(tok)
    corpus = _Corpus(RECIPES["corpus"], tokenizer=tok)
    assert np.array_equal(ids, corpus.held)  # the recipe's held-out text
    want = _float64_held_out_loss(model, ids)
    assert nt.held_out_loss(model, ids) == pytest.approx(want, abs=1e-5)
    # one window per forward (a vocabulary too large for more): the same mean
    assert nt.held_out_loss(model, ids, max_logits=1) == pytest.approx(want, abs=1e-5)
    # 16-token windows score other tokens: another value, also equal to its reference
    assert nt.held_out_loss(model, ids[:1000], width=16) == pytest.approx(
        _float64_held_out_loss(model, ids[:1000], width=16), abs=1e-5)
    was = model.training
    for mode in (True, False):  # the model's mode is left as it was
        model.train(mode)
        nt.held_out_loss(model, ids[:200])
        assert model.training is mode
    model.train(was)
    with pytest.raises(ValueError, match="no window"):
        nt.held_out_loss(model, ids[:64])
    assert nt.held_out_loss(model, ids[:200], width=np.int64(64)) == nt.held_out_loss(model, ids[:200])
    for bad in (dict(width=0), dict(width=64.0), dict(width=True), dict(max_logits=0), dict(max_logits=1.5)):
        with pytest.raises(ValueError, match="must be an int >= 1"):
            nt.held_out_loss(model, ids, **bad)
    with pytest.raises(ValueError, match="1-D sequence of integer token ids, got float"):
        nt.held_out_loss(model, ids[:200].astype(np.float32))
    with pytest.raises(ValueError, match=r"shape \(10, 65\)"):
        nt.held_out_loss(model, ids[:650].reshape(10, 65))
    vocab = model.get_output_embeddings().weight.shape[0]
    for stray in (vocab, -100):
        with pytest.raises(ValueError, match="outside the model's vocabulary.*another tokenizer"):
            nt.held_out_loss(model, np.append(ids[:200], stray))
    with pytest.raises(TypeError, match="must be a transformers tokenizer"):
        nt.held_out_ids("corpus-base")


def test_trainer_reports_the_held_out_loss_and_trains_the_same(base, keep_threads):
    from grpo_lab.algo.algorithms import GRPO
    from grpo_lab.training.trainer import Trainer, TrainerConfig

    cfg = TrainerConfig(prompts_per_step=2, group_size=2, eval_every=1, threads=1, seed=0, progress=False, lr=1e-2)
    hists, policies = {}, {}
    for flag in (False, True):
        model, tok = load_policy(_dir("corpus"))
        tr = Trainer(model, tok, NextTokenTask(eval_held_out_loss=flag), GRPO, cfg)
        hists[flag], policies[flag] = tr.train(2), tr.policy
    on, off = hists[True], hists[False]
    assert "test_held_out_loss" in on and "test_held_out_loss" not in off
    # the metric changes nothing else: every other column of every step is the same (timings aside)
    timing = {"tokens_per_s", "gen_seconds", "step_seconds", "eval_seconds", "peak_mem_mb"}
    cols = [c for c in off.columns if c not in timing]
    pd.testing.assert_frame_equal(on[cols], off[cols])
    assert all(torch.equal(a, b) for a, b in zip(policies[True].parameters(), policies[False].parameters()))
    evals = on.dropna(subset=["test_held_out_loss"]).set_index("step")["test_held_out_loss"]
    assert list(evals.index) == [0, 1, 2]
    ids = nt.held_out_ids(base[1])
    assert evals.loc[0] == pytest.approx(nt.held_out_loss(base[0], ids), abs=1e-6)  # the base policy
    assert evals.loc[2] == pytest.approx(nt.held_out_loss(policies[True], ids), abs=1e-6)  # the trained one
    assert evals.loc[2] != evals.loc[0]
    with pytest.raises(ValueError, match="eval_held_out_loss must be a bool"):
        NextTokenTask(eval_held_out_loss="yes")


class _Metrics(NextTokenTask):
    """NextTokenTask whose model_metrics returns ``self.out``."""

    out: object = None

    def model_metrics(self, model):
        return self.out


@pytest.mark.parametrize("out, error, match", [
    ({"accuracy": 0.9}, ValueError, "'accuracy' would replace the evaluation's column test_accuracy"),
    ({"length": 1.0}, ValueError, "would replace the evaluation's column test_length"),
    ({"accuracy_sampled": 0.5}, ValueError, "would replace"),
    ({"sampled_loss": 0.5}, ValueError, "would replace"),
    ({"loss": "good"}, TypeError, "a str name and a real number, got 'loss': 'good'"),
    ({"loss": torch.ones(3)}, TypeError, "a real number"),
    ({"loss": None}, TypeError, "a real number"),
    ({"loss": True}, TypeError, "a real number"),
    ({3: 1.0}, TypeError, "got 3: 1.0"),
    ([1.0], TypeError, "must return a dict of names to numbers, got list"),
    (None, TypeError, "got NoneType"),
])
def test_model_metrics_that_would_corrupt_the_history_are_refused(base, keep_threads, out, error, match):
    from grpo_lab.algo.algorithms import GRPO
    from grpo_lab.training.trainer import Trainer, TrainerConfig

    cfg = TrainerConfig(prompts_per_step=2, group_size=2, eval_every=1, threads=1, seed=0, progress=False,
                        eval_sampled=True)
    task = _Metrics()
    task.out = out
    tr = Trainer(base[0], base[1], task, GRPO, cfg)
    with pytest.raises(error, match="_Metrics.model_metrics.*" + match):
        tr.train(0)


# ---- 8. map_workers ------------------------------------------------------------------------------------
def test_map_workers_in_process():
    from grpo_lab.experiments import map_workers

    assert map_workers(operator.neg, [3, -1, 2]) == [-3, 1, -2]
    assert map_workers(math.sqrt, (x * x for x in range(5))) == [0.0, 1.0, 2.0, 3.0, 4.0]  # any iterable
    assert map_workers(operator.neg, []) == []
    with pytest.raises(ValueError, match="math domain error"):
        map_workers(math.sqrt, [4, -1])


def test_map_workers_refuses_what_a_worker_cannot_receive():
    # a function using an unpicklable global (here a lock in its closure) cannot reach a spawned worker:
    # a TypeError naming the fix, before any pool starts
    import threading

    from grpo_lab import experiments
    from grpo_lab.experiments import map_workers

    lock = threading.Lock()

    def locked_neg(x):
        with lock:
            return -x

    before = workers_mod._POOL["executor"]
    with pytest.raises(TypeError, match="cannot be pickled; pass what it needs as arguments"):
        map_workers(locked_neg, [1, 2], n_jobs=2)
    assert workers_mod._POOL["executor"] is before
    assert map_workers(locked_neg, [1, 2], n_jobs=1) == [-1, -2]  # in this process it is fine


def test_map_workers_sends_a_notebook_function_by_value():
    # a function that is not importable in a fresh interpreter (defined in __main__, as a notebook cell's
    # is, here with a global and a closure variable) runs in the workers with a copy of what it uses; its
    # globals are copied when the call starts, and the workers' changes to them do not come back
    from grpo_lab.experiments import map_workers, shutdown_workers

    ns = {"__name__": "__main__", "OFFSET": 100, "SEEN": []}
    exec("def make(scale):\n"
         "    def f(x):\n"
         "        SEEN.append(x)\n"
         "        return scale * x + OFFSET\n"
         "    return f\n", ns)
    f = ns["make"](3)
    try:
        assert map_workers(f, [1, 2, 3, 4], n_jobs=2) == [103, 106, 109, 112]
        assert ns["SEEN"] == []  # the workers appended to their copies
        ns["OFFSET"] = 0
        assert map_workers(f, [1, 2], n_jobs=2) == [3, 6]  # the global as it is at this call
        assert map_workers(lambda x: x * x, [5, 6], n_jobs=2) == [25, 36]
    finally:
        shutdown_workers(now=True)


def test_map_workers_sends_items_results_and_errors_of_notebook_classes():
    # a fresh user's trial: results and exceptions of classes defined in __main__ failed on the way back with a
    # bare PicklingError (the exception's message lost); an unpicklable item failed without saying it was an item
    import threading

    from grpo_lab.experiments import map_workers, shutdown_workers

    ns = {"__name__": "__main__"}
    exec("class Point:\n"
         "    def __init__(self, x):\n"
         "        self.x = x\n"
         "class MyErr(Exception):\n"
         "    pass\n"
         "def point(x):\n"
         "    return Point(x)\n"
         "def fail(x):\n"
         "    raise MyErr(f'custom boom {x}')\n"
         "def closure_result(x):\n"
         "    return lambda: x\n", ns)
    try:
        assert [p.x for p in map_workers(ns["point"], [(1, 2), (3, 4)], n_jobs=2)] == [(1, 2), (3, 4)]
        assert [f() for f in map_workers(ns["closure_result"], [7, 8], n_jobs=2)] == [7, 8]
        with pytest.raises(RuntimeError, match=r"fn raised MyErr: custom boom 1 \(its class cannot travel back"):
            map_workers(ns["fail"], [1, 2], n_jobs=2)
        with pytest.raises(ValueError, match="math domain error"):  # a picklable exception keeps its class
            map_workers(math.sqrt, [4, -1], n_jobs=2)
        with pytest.raises(TypeError, match=r"item 1 \(lock\) cannot be sent to a worker process"):
            map_workers(operator.neg, [1, threading.Lock()], n_jobs=2)
    finally:
        shutdown_workers(now=True)


def test_continue_ntp_refuses_an_empty_batch():
    from grpo_lab.lab.pretrain import continue_ntp

    with pytest.raises(ValueError, match="batch_size"):
        continue_ntp(None, None, steps=1, batch_size=0)


@pytest.mark.parametrize("n_jobs", [0, -1, 1.0, "2", None, True])
def test_map_workers_rejects_bad_n_jobs(n_jobs):
    from grpo_lab.experiments import map_workers

    with pytest.raises(ValueError, match="n_jobs must be an int >= 1"):
        map_workers(operator.neg, [1, 2], n_jobs=n_jobs)


def test_map_workers_in_two_processes():
    from grpo_lab import experiments
    from grpo_lab.experiments import map_workers, shutdown_workers

    try:
        items = list(range(-4, 5))
        assert map_workers(operator.neg, items, n_jobs=2) == [-x for x in items]  # in order
        assert workers_mod._POOL["executor"] is not None  # the workers are kept for the next call
        # an exception in fn reaches the caller, and the workers are stopped
        with pytest.raises(ValueError, match="math domain error"):
            map_workers(math.sqrt, [4, -1, 9], n_jobs=2)
        assert workers_mod._POOL["executor"] is None
    finally:
        shutdown_workers(now=True)
