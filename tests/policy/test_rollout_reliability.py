"""Reliability of the rollout and of loading (issue 8).

* The behaviour log-probs describe the distribution actually sampled from, whatever logits
  processors the checkpoint's ``generation_config`` carries (they are neutralised, with a note).
* Every stop id the checkpoint declares ends a completion, not only the tokenizer's EOS.
* ``load_policy`` shows transformers' ``Loading weights`` bar only when asked or interactive,
  and installing the package raises no setuptools deprecation warning.
"""

import re
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
from transformers.utils import logging as hf_logging

import grpo_lab.policy.models as models_mod
from grpo_lab.policy.models import TinyConfig, load_policy, tiny_policy
from grpo_lab.paths import REPO_ROOT, checkpoint_dir
from grpo_lab.policy.rollout import generate, position_ids_from_mask, stop_token_ids
from grpo_lab.tasks import Problem

TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)
EOS = 2
PROMPT = "1+2=3+4="  # repeated characters: repetition and n-gram processors act on the first token


def _policy(tok, *, sharpen: float = 1.0, boost: dict[str, float] | None = None):
    """A tiny policy in eval mode. Its logits are multiplied by ``sharpen`` (a random tiny model is
    nearly uniform), and the tied embedding of each character in ``boost`` is scaled (its logit
    then dominates for part of the hidden states)."""
    m = tiny_policy(tok, TINY, seed=0)
    with torch.no_grad():
        m.model.norm.weight *= sharpen
        for ch, s in (boost or {}).items():
            m.model.embed_tokens.weight[tok.convert_tokens_to_ids(ch)] *= s
    return m.eval()


def _first_token_logp(model, tok, prompt):
    """float32 ``[V]``: log π(· | prompt) of the raw policy at temperature 1."""
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), -1)


# --------------------------------------------------------------- 1. sampled == described distribution
def test_behaviour_logp_is_the_sampled_distribution_despite_checkpoint_processors(tok):
    model = _policy(tok, sharpen=3.0)  # p("=") = 0.12, repetition_penalty=2 alone makes it 0.05
    gc = model.generation_config
    gc.repetition_penalty, gc.no_repeat_ngram_size, gc.min_new_tokens = 2.0, 1, 2
    gc.suppress_tokens = [tok.convert_tokens_to_ids("7")]
    n = 4000
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ro = generate(model, tok, [Problem(PROMPT, "")], group_size=n, max_new_tokens=1)
    first = ro.completion_ids[:, 0]
    # all rows share the prompt, so exp(behaviour_logp) of a row is p(its token); it must equal
    # the raw policy's probability and the sampled frequency, within 4 binomial standard errors
    p_raw = _first_token_logp(model, tok, PROMPT).exp()
    torch.testing.assert_close(ro.behaviour_logp[:, 0].exp(), p_raw[first], atol=1e-5, rtol=0)
    freq = torch.bincount(first, minlength=len(p_raw)).double() / n
    se = (p_raw.double() * (1 - p_raw.double()) / n).sqrt()
    z = ((freq - p_raw) / (se + 1e-12)).abs()
    v = int(z.argmax())
    assert z[v] < 4, (f"sampled frequencies off by {z[v]:.1f} standard errors; token {tok.decode([v])!r}: "
                      f"frequency {freq[v]:.3f}, exp(behaviour_logp) {p_raw[v]:.3f}")
    # exactly one warning: the note naming what was neutralised
    assert len(caught) == 1 and "neutralised" in str(caught[0].message), [str(w.message) for w in caught]
    for name in ("min_new_tokens", "no_repeat_ngram_size", "repetition_penalty", "suppress_tokens"):
        assert name in str(caught[0].message)


def test_no_note_when_the_checkpoint_carries_no_processors(tok):
    model = _policy(tok)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate(model, tok, [Problem(PROMPT, "")], group_size=2, max_new_tokens=2)


def test_greedy_is_argmax_of_the_raw_policy_despite_checkpoint_processors(tok):
    model = _policy(tok, sharpen=3.0)
    top = int(_first_token_logp(model, tok, PROMPT).argmax())
    model.generation_config.bad_words_ids = [[top]]  # would forbid the argmax of the first step
    model.generation_config.repetition_penalty = 2.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ro = generate(model, tok, [Problem(PROMPT, "")], max_new_tokens=5, greedy=True)
    assert ro.completion_ids[0, 0].item() == top
    ids = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    attn = torch.cat([ro.prompt_mask, ro.completion_mask.long()], 1)
    T = ro.completion_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits
    real = ro.completion_mask.bool()
    assert torch.equal(logits[:, -T - 1:-1].argmax(-1)[real], ro.completion_ids[real])
    assert any("bad_words_ids" in str(w.message) and "repetition_penalty" in str(w.message) for w in caught)


# --------------------------------------------------------------- 2. every declared stop id stops
@pytest.mark.parametrize("declared", ["list", "int"])
def test_every_declared_stop_id_ends_a_completion(tok, declared):
    Q = tok.convert_tokens_to_ids("?")
    model = _policy(tok, boost={"?": 8.0})
    model.generation_config.eos_token_id = [EOS, Q] if declared == "list" else Q
    assert stop_token_ids(model, tok) == [EOS, Q]
    torch.manual_seed(0)
    ro = generate(model, tok, [Problem("1+2=", "3"), Problem("9+9+9=", "27")], group_size=16, max_new_tokens=8)
    T = ro.completion_ids.shape[1]
    stops = {EOS, Q}
    n_q = 0
    for k in range(len(ro)):
        ids = ro.completion_ids[k].tolist()
        ends = [i for i, t in enumerate(ids) if t in stops]
        if ends:
            e = ends[0]
            n_q += ids[e] == Q
            assert ro.completion_mask[k].tolist() == [1.0] * (e + 1) + [0.0] * (T - e - 1)
            assert ids[e + 1:] == [tok.pad_token_id] * (T - e - 1)
            assert (ro.behaviour_logp[k, e + 1:] == 0).all()
            assert not ro.truncated[k]
            assert ro.texts[k] == tok.decode(ids[:e])  # the stop token is removed, like EOS
        else:
            assert ro.truncated[k] and T == 8 and ro.completion_mask[k].sum() == 8
        assert ro.lengths[k].item() == ro.completion_mask[k].sum().item()
    assert n_q > 0  # some completions ended on the second stop id
    if declared == "int":
        return
    # model.generate with the same declaration stops at the same place
    ref = generate(model, tok, [Problem("1+2=", "3")], group_size=1, max_new_tokens=8, greedy=True)
    enc = tok(["1+2="], return_tensors="pt", add_special_tokens=False)
    out = model.generate(**enc, do_sample=False, max_new_tokens=8, pad_token_id=0)[0, enc["input_ids"].shape[1]:]
    n = int(ref.lengths[0])
    assert ref.completion_ids[0, :n].tolist() == out[:n].tolist()
    assert len(out) == n or out[n:].eq(0).all()


# --------------------------------------------------------------- 3. clean output
@pytest.fixture
def restore_hf_progress():
    was = hf_logging.is_progress_bar_enabled()
    yield
    (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


@pytest.mark.parametrize("progress, interactive, enabled, shown", [
    (None, False, True, False),  # a script, CI, pytest: no bar
    (None, True, True, True),  # a terminal or notebook: transformers' default
    (None, True, False, False),  # ... unless bars were switched off globally (the book does)
    (True, False, False, True),  # asked for
    (False, True, True, False),  # refused
])
def test_load_policy_progress_bar(capfd, monkeypatch, restore_hf_progress, progress, interactive, enabled, shown):
    monkeypatch.setattr(models_mod, "_interactive", lambda: interactive, raising=False)
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    capfd.readouterr()
    load_policy(checkpoint_dir("arithmetic-base"), progress=progress)
    out = capfd.readouterr()
    assert ("Loading weights" in out.err + out.out) == shown
    assert hf_logging.is_progress_bar_enabled() == enabled  # the global setting is restored


def test_package_metadata_builds_without_deprecation_warning(tmp_path):
    # setuptools must support what pyproject.toml uses (SPDX ``license``): the lower bound of
    # [build-system] requires must hold for the setuptools that builds without isolation.
    import setuptools
    from packaging.version import Version

    toml = (REPO_ROOT / "pyproject.toml").read_text()
    bound = re.search(r'requires\s*=\s*\["setuptools>=([\d.]+)"', toml).group(1)
    assert Version(setuptools.__version__) >= Version(bound), (
        f"setuptools {setuptools.__version__} < {bound} required by pyproject.toml: pin it in requirements/ci.txt")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    (tmp_path / "grpo_lab").mkdir()
    (tmp_path / "grpo_lab" / "__init__.py").touch()
    # [tool.setuptools] packages' directories, read from pyproject.toml (grpo_lab._data is data/)
    packages = re.findall(r'"([\w.]+)"', re.search(r"^packages\s*=\s*\[(.*?)\]", toml, re.M | re.S).group(1))
    assert {"grpo_lab.experiments", "grpo_lab.training", "grpo_lab.tasks"} <= set(packages)
    for pkg in packages:
        (tmp_path / pkg.replace("grpo_lab._data", "data").replace(".", "/")).mkdir(parents=True, exist_ok=True)
    (tmp_path / "md").mkdir()
    code = "from setuptools.build_meta import prepare_metadata_for_build_wheel as p; print(p('md'))"
    res = subprocess.run([sys.executable, "-W", "default", "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "deprecat" not in out.lower(), out
    meta = next((tmp_path / "md").glob("*.dist-info")) / "METADATA"
    assert "License-Expression: MIT" in meta.read_text()
