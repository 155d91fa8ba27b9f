"""TRL's and verl's option names in ``--set`` and config files: the error names the grpo_lab field and value
(:mod:`grpo_lab.export.vocabulary`), derived from the export's tables, and the fix it gives is accepted."""

import re

import pytest

from grpo_lab.cli import main as cli
from grpo_lab import experiments
from grpo_lab.export import translation as _tr
from grpo_lab.export import vocabulary as voc

# (key as typed, value, pieces the message must hold): every foreign key the vocabulary is promised to know
TABLE = [
    # TRL GRPOConfig
    ("num_generations", "8", ["TRL's GRPOConfig", "--set group_size=8"]),
    ("beta", "0.04", ["TRL's GRPOConfig", "--set beta=0.04"]),
    ("epsilon", "0.2", ["--set eps_low=0.2"]),
    ("epsilon_high", "0.28", ["--set eps_high=0.28"]),
    ("delta", "2", ["surrogate='ppo'", "two-sided clip", "no grpo_lab surrogate"]),
    ("loss_type", "grpo", ["--set aggregation=seq_mean_token_mean", "exactly", "GRPO preset"]),
    # DAPO's preset aggregates per group (its Eq. 12); TRL's loss_type=dapo takes a token mean over the batch
    ("loss_type", "dapo", ["--set aggregation=token_mean", "exactly",
                           "the DAPO preset differs here: it has aggregation='group_token_mean'"]),
    ("loss_type", "dr_grpo", ["--set aggregation=seq_mean_token_sum_norm", "exactly", "DR_GRPO preset"]),
    ("loss_type", "bnpo", ["--set aggregation=token_mean", "nearest reading", "micro-batch"]),
    ("loss_type", "cispo", ["--set surrogate=cispo", "CISPO preset"]),
    ("loss_type", "sapo", ["--set surrogate=sapo"]),
    ("loss_type", "luspo", ["no grpo_lab counterpart"]),
    ("loss_type", "vespo", ["no grpo_lab counterpart"]),
    ("importance_sampling_level", "sequence", ["--set ratio_level=sequence", "GSPO preset"]),
    ("importance_sampling_level", "token", ["--set ratio_level=token"]),
    ("scale_rewards", "none", ["--set advantage=group_mean", "exactly"]),
    ("scale_rewards", "batch", ["--set advantage=batch"]),
    ("scale_rewards", "group", ["--set advantage=group"]),
    ("max_completion_length", "512", ["--set max_new_tokens=512"]),
    ("learning_rate", "1e-6", ["--set lr=1e-6"]),
    ("num_iterations", "2", ["--set epochs=2"]),
    ("top_entropy_quantile", "0.2", ["no such setting", "top_entropy_quantile=1.0"]),
    ("top_entropy_quantile", "1.0", ["no such setting", "drop the key"]),
    ("vllm_importance_sampling_correction", "true", ["--set mismatch=token_truncate", "exactly"]),
    ("mask_truncated_completions", "true", ["--set overlong_filter=true"]),
    ("use_bias_correction_kl", "true", ["--set kl_importance_correction=true"]),
    ("off_policy_mask_threshold", "0.5", ["--set offpolicy_mask_delta=0.5"]),
    ("lr_scheduler_type", "cosine", ["--set lr_schedule=cosine"]),
    ("bf16", "true", ["--set precision=bfloat16"]),
    ("max_grad_norm", "1.0", ["--set grad_clip=1.0"]),
    # verl, full dotted names and last components
    ("actor_rollout_ref.actor.clip_ratio_low", "0.2", ["verl's", "--set eps_low=0.2"]),
    ("clip_ratio_low", "0.2", ["actor_rollout_ref.actor.clip_ratio_low", "--set eps_low=0.2"]),
    ("clip_ratio_high", "0.28", ["--set eps_high=0.28"]),
    ("clip_ratio_c", "3", ["--set surrogate=ppo", "dual clip", "no grpo_lab surrogate"]),
    ("clip_ratio_c", "1e10", ["--set surrogate=ppo"]),
    ("loss_agg_mode", "token-mean", ["--set aggregation=token_mean", "exactly"]),
    ("actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-sum-norm", ["--set aggregation=seq_mean_token_sum_norm"]),
    ("loss_agg_mode", "seq-mean-token-mean", ["--set aggregation=seq_mean_token_mean"]),
    ("kl_loss_coef", "0.001", ["--set beta=0.001"]),
    ("use_kl_loss", "false", ["--set kl=none"]),
    ("kl_loss_type", "low_var_kl", ["--set kl=k3"]),
    ("kl_coef", "0.001", ["algorithm.kl_ctrl.kl_coef", "in the reward", "--set beta=0.001"]),
    ("algorithm.kl_ctrl.kl_coef", "0.01", ["--set beta=0.01"]),
    ("adv_estimator", "grpo", ["--set advantage=group", "exactly"]),
    ("adv_estimator", "rloo", ["--set advantage=rloo"]),
    ("norm_adv_by_std_in_grpo", "false", ["--set advantage=group_mean"]),
    ("actor_rollout_ref.rollout.n", "8", ["--set group_size=8"]),
    ("rollout.n", "8", ["--set group_size=8"]),
    ("policy_loss.loss_mode", "gspo", ["--set ratio_level=sequence", "GSPO preset"]),
    ("loss_mode", "cispo", ["--set surrogate=cispo"]),
    ("loss_mode", "vanilla", ["--set ratio_level=token", "--set surrogate=ppo"]),
    ("data.max_response_length", "1024", ["--set max_new_tokens=1024"]),
    ("max_response_length", "1024", ["--set max_new_tokens=1024"]),
    ("ppo_epochs", "2", ["--set epochs=2"]),
    ("ppo_mini_batch_size", "8", ["prompts_per_step", "minibatches"]),
    ("filter_groups.enable", "true", ["--set dynamic_sampling=true"]),
]


def _fixes(message: str) -> list:
    """The ``--set KEY=VALUE`` fixes a message gives."""
    return re.findall(r"--set (\S+=[^\s,;|()]+)", message.split(": ", 1)[1])


@pytest.mark.parametrize("key,value,pieces", TABLE, ids=[f"{k}={v}" for k, v, _ in TABLE])
def test_every_foreign_key_names_the_grpo_lab_field_and_value(key, value, pieces):
    if key in cli.settable_fields():  # also a grpo_lab name (TRL's beta): --set takes it as grpo_lab's
        message = f"--set {key}={value}: " + voc.explain(key, value)
    else:
        with pytest.raises(cli.UsageError) as err:
            cli.parse_set([f"{key}={value}"])
        message = str(err.value)
    assert message.startswith(f"--set {key}={value}: "), message
    for piece in pieces:
        assert piece in message, (piece, message)
    assert "did you mean" not in message and "check-config" not in message, message
    cli.parse_set(_fixes(message))  # the fix the message gives is a valid --set


def test_the_message_reads_as_the_issue_asks():
    with pytest.raises(cli.UsageError) as err:
        cli.parse_set(["num_generations=8"])
    assert str(err.value) == ("--set num_generations=8: num_generations is TRL's GRPOConfig name; grpo_lab calls it "
                              "group_size: --set group_size=8")


def test_plain_typos_keep_the_did_you_mean():
    for typo, close in (("eps_hihg=0.3", "eps_high"), ("group_sise=4", "group_size"), ("lrr=1e-4", "lr")):
        with pytest.raises(cli.UsageError) as err:
            cli.parse_set([typo])
        assert f"did you mean {close!r}" in str(err.value) and "TRL" not in str(err.value), str(err.value)
    assert voc.explain("eps_hihg") is None and voc.lookup("group_sise") == []


def test_several_foreign_keys_are_one_error_naming_the_linter():
    with pytest.raises(cli.UsageError) as err:
        cli.parse_set(["num_generations=8", "lr=1e-4", "clip_ratio_high=0.28"])
    message = str(err.value)
    assert "(1) --set num_generations=8" in message and "(2) --set clip_ratio_high=0.28" in message
    assert "--set group_size=8" in message and "--set eps_high=0.28" in message
    assert "python -m grpo_lab check-config FILE" in message


def test_an_unknown_value_is_said_with_the_librarys_choices():
    message = voc.explain("loss_type", "dr_grpoo")
    assert "no grpo_lab equivalent" in message and "'dr_grpo'" in message and "bnpo" in message, message


def test_without_a_value_the_names_only_and_file_style():
    assert voc.explain("num_iterations") == "num_iterations is TRL's GRPOConfig name; grpo_lab calls it epochs"
    assert "group_size: 8 under trainer:" in voc.explain("num_generations", 8, style="file")
    assert "aggregation: seq_mean_token_sum_norm under algorithm:" in voc.explain("loss_type", "dr_grpo", style="file")
    with pytest.raises(ValueError, match="style must be"):
        voc.explain("beta", 1, style="yaml")


@pytest.fixture
def fresh_vocabulary():
    """The vocabulary rebuilt from the (patched) tables, and rebuilt again afterwards."""
    voc.vocabulary.cache_clear()
    voc._base_config.cache_clear()
    yield
    voc.vocabulary.cache_clear()
    voc._base_config.cache_clear()


def test_a_key_added_to_the_translation_appears_without_retyping(fresh_vocabulary, monkeypatch):
    """A new TRL budget key, a new verl loss_agg_mode spelling and a new TRL importance_sampling_level, written
    only in the export's tables, are in the vocabulary (with the value carried or translated)."""
    budget = _tr._trl_budget

    def trl_budget(kw, b, notes):
        budget(kw, b, notes)
        kw["completions_per_prompt"] = b["group_size"]  # a key a future TRL might add

    monkeypatch.setattr(_tr, "_trl_budget", trl_budget)
    monkeypatch.setitem(_tr._VERL_AGG_MODES, "token_mean", "token-mean-v2")
    monkeypatch.setitem(_tr._TRL_IS_LEVELS, "sequence_token", "sequence-token")
    term = voc.vocabulary()[("trl", "completions_per_prompt")]
    assert term.same == ("group_size",)
    assert "--set group_size=8" in voc.explain("completions_per_prompt", "8")
    assert voc.vocabulary()[("verl", "actor_rollout_ref.actor.loss_agg_mode")].values["token-mean-v2"] == \
        {"aggregation": "token_mean"}
    said = voc.explain("importance_sampling_level", "sequence-token")
    assert "--set ratio_level=sequence_token" in said and "exactly" in said and "unknown" not in said, said


def test_building_the_vocabulary_warns_nothing(fresh_vocabulary):
    """The probes run the export's mapping without its version check: no warning, and a later export's
    once-per-process LibraryVersionWarning is not spent."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(voc.vocabulary()) > 50


def test_the_vocabulary_is_the_exports_table_read_backwards():
    """Every loss_type / loss_agg_mode / importance_sampling_level the export writes reads back to a grpo_lab
    choice that the export maps to that very value."""
    v = voc.vocabulary()
    for (library, key), table in ((("trl", "loss_type"), _tr._TRL_PPO_LOSS_TYPES),
                                  (("trl", "importance_sampling_level"), _tr._TRL_IS_LEVELS),
                                  (("verl", "actor_rollout_ref.actor.loss_agg_mode"), _tr._VERL_AGG_MODES),
                                  (("verl", "actor_rollout_ref.actor.kl_loss_type"), _tr._VERL_KL_TYPES)):
        values = v[(library, key)].values
        for ours, theirs in table.items():
            assert theirs in values, (key, theirs)
            back = values[theirs]
            field = next(iter(k for k in back if k in ("aggregation", "ratio_level", "kl")))
            assert table[back[field]] == theirs, (key, theirs, back)


def _write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text,pieces", [
    ("preset: GRPO\nalgorithm: {loss_type: dr_grpo}\n",
     ["algorithm: loss_type: loss_type is TRL's GRPOConfig name", "aggregation: seq_mean_token_sum_norm under "
      "algorithm:", "DR_GRPO preset"]),
    ("preset: GRPO\ntrainer: {num_generations: 8}\n", ["trainer: num_generations:", "group_size: 8 under trainer:"]),
    ("preset: GRPO\nnum_generations: 8\n", ["group_size: 8 under trainer:", "check-config"]),
    ("preset: GRPO\nalgorithm: {beta: 0.0, kl_coef: 0.01, clip_ratio_high: 0.28}\n",
     ["(1) --config", "beta: 0.01 under algorithm:", "eps_high: 0.28 under algorithm:", "check-config FILE"]),
])
def test_config_files_name_the_grpo_lab_field(text, pieces, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(experiments, "run", lambda *a, **k: pytest.fail("a bad file must fail before training"))
    conf = _write(tmp_path / "run.yaml", text)
    assert cli.main(["--config", conf, "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert f"--config {conf}" in err, err
    for piece in pieces:
        assert piece in err, (piece, err)


@pytest.mark.parametrize("key, value", [("epsilon", 0.2), ("clip_ratio_high", 0.28), ("loss_type", "dr_grpo")])
def test_a_dependence_on_the_surrogate_says_what_to_do(key, value):
    message = voc.explain(key, value)
    assert "also depends on surrogate" not in message, message
    assert "this holds with the preset's surrogate: keep it (--set surrogate=NAME changes its meaning)" in message, \
        message


def test_a_key_both_libraries_read_alike_is_said_once():
    message = voc.explain("top_p", 0.9)
    # issue 53: the sampler's top_p is TrainerConfig.top_p, written to both libraries under the same name
    assert " | " not in message and message.count("grpo_lab calls it top_p") == 1, message
    assert message.startswith("top_p is TRL's GRPOConfig name and verl's trainer-config name"), message
