"""LoRA policies (grpo_lab.policy.lora, issue 31 item 5): the KL reference is the base with the adapters
disabled (no second set of weights), checkpoints hold the adapters and name the base and resume
exactly, and the places that copy the policy (low-precision sampler, critic) cope with a PeftModel."""

import json
import shutil

import pandas as pd
import pytest
import torch

pytest.importorskip("peft")

from grpo_lab.algo.algorithms import GRPO  # noqa: E402
from grpo_lab.policy.lora import AdapterDisabled, BaseModelNotFound, LoraSpec  # noqa: E402
from grpo_lab.policy.models import CriticModel, inference_copy, is_peft_model, load_policy, tiny_policy  # noqa: E402
from grpo_lab.policy.rollout import policy_logprobs  # noqa: E402
from grpo_lab.tasks import ArithmeticTask  # noqa: E402
from grpo_lab.training.trainer import MEASURED_COLUMNS, Trainer, TrainerConfig  # noqa: E402

SPEC = LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj"))


def lora_policy(seed=0):
    policy, tok = load_policy("arithmetic-base", progress=False)
    return SPEC.apply(policy, seed=seed), tok


def make(algo=GRPO, **kw):
    policy, tok = lora_policy()
    cfg = dict(prompts_per_step=4, group_size=4, max_new_tokens=12, eval_every=0, progress=False, lr=3e-2,
               minibatches=2, seed=0)
    cfg.update(kw)
    return Trainer(policy, tok, ArithmeticTask(test_size=5), algo, TrainerConfig(**cfg))


def storages(*modules):
    """The distinct parameter/buffer storages of ``modules`` and their total size in bytes."""
    seen = {}
    for m in modules:
        for t in [*m.parameters(), *m.buffers()]:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return seen


def test_reference_is_the_base_with_adapters_disabled_and_no_copy():
    tr = make()
    assert isinstance(tr.ref_policy, AdapterDisabled) and tr.ref_policy.policy is tr.policy
    assert list(tr.ref_policy.parameters()) == []  # holds no weights of its own
    modules = [v for v in vars(tr).values() if isinstance(v, torch.nn.Module)]
    assert storages(*modules) == storages(tr.policy)  # no module of the trainer holds a second set of weights
    base, _ = load_policy("arithmetic-base", progress=False)
    trainable = sum(p.numel() for p in tr.policy.parameters() if p.requires_grad)
    assert 0 < trainable < 0.05 * sum(p.numel() for p in base.parameters())

    h = tr.train(2)
    assert h["kl"].iloc[-1] > 0  # the adapters moved the policy away from the reference
    ro = tr.rollout()
    with torch.no_grad():
        ref = policy_logprobs(tr.ref_policy, ro)
        want = policy_logprobs(base, ro)  # the base model loaded on its own
        now = policy_logprobs(tr.policy, ro)
    assert torch.equal(ref, want)
    assert not torch.equal(now, want)
    assert all(p.requires_grad for n, p in tr.policy.named_parameters() if "lora_" in n)  # the context restored them


def test_exact_resume_of_a_lora_policy(tmp_path):
    straight = make()
    straight.train(4)
    first = make()
    first.train(2)
    first.save(tmp_path / "ck")
    files = {p.name for p in (tmp_path / "ck" / "policy").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "grpo_lab_base.json"} <= files
    assert "model.safetensors" not in files and not (tmp_path / "ck" / "ref").exists()
    base = json.loads((tmp_path / "ck" / "policy" / "grpo_lab_base.json").read_text())
    assert base["checkpoint"] == "arithmetic-base" and base["dtype"] == "float32"
    torch.manual_seed(999)  # whatever happens in between must not matter
    resumed = Trainer.resume(tmp_path / "ck")
    assert is_peft_model(resumed.policy) and isinstance(resumed.ref_policy, AdapterDisabled)
    resumed.train(2)
    for a, b in zip(straight.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)
    ha = straight.history.drop(columns=list(MEASURED_COLUMNS), errors="ignore")
    hb = resumed.history.drop(columns=list(MEASURED_COLUMNS), errors="ignore")
    assert list(hb["step"]) == [1, 2, 3, 4] and hb["kl"].iloc[-1] > 0
    pd.testing.assert_frame_equal(ha, hb, check_exact=True, check_dtype=False)


def test_resume_names_a_base_that_cannot_be_found_and_missing_adapter_files(tmp_path):
    tr = make()
    tr.save(tmp_path / "ck")
    record = tmp_path / "ck" / "policy" / "grpo_lab_base.json"
    data = json.loads(record.read_text())
    record.write_text(json.dumps(dict(data, checkpoint="no-such-base", path_or_hub_id=str(tmp_path / "gone"))))
    with pytest.raises(BaseModelNotFound, match="no-such-base"):
        Trainer.resume(tmp_path / "ck")
    record.write_text(json.dumps(dict(data, parameters=data["parameters"] + 1)))
    with pytest.raises(ValueError, match="parameters"):
        Trainer.resume(tmp_path / "ck")
    (tmp_path / "ck" / "policy" / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError, match="policy/adapter_model.safetensors"):
        Trainer.resume(tmp_path / "ck")


def test_save_refuses_a_base_built_in_memory(tmp_path):
    _, tok = load_policy("arithmetic-base", progress=False)
    policy = SPEC.apply(tiny_policy(tok, seed=0))
    tr = Trainer(policy, tok, ArithmeticTask(test_size=5), GRPO,
                 TrainerConfig(prompts_per_step=2, group_size=2, max_new_tokens=4, eval_every=0, progress=False))
    with pytest.raises(ValueError, match="not loaded from a checkpoint"):
        tr.save(tmp_path / "ck")
    assert not (tmp_path / "ck").exists()


def _moved(policy):
    """``policy`` with random non-zero adapters (B starts at 0, which would hide a merge error)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return policy


def test_inference_copy_merges_the_adapters():
    policy, _ = lora_policy()
    policy = _moved(policy).eval()
    tr = make()
    ro = tr.rollout()
    before = [p.detach().clone() for p in policy.parameters()]
    with torch.no_grad():
        want = policy_logprobs(policy, ro)
        for dtype, head in (("float32", False), ("bfloat16", True)):
            copy = inference_copy(policy, dtype, fp32_lm_head=head)
            assert not is_peft_model(copy) and not any(p.requires_grad for p in copy.parameters())
            got = policy_logprobs(copy, ro)
            tol = 1e-5 if dtype == "float32" else 0.1
            assert (got - want).abs().max() < tol
    assert is_peft_model(policy) and all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))
    tr = make(rollout_dtype="bfloat16", minibatches=1)  # the trainer's low-precision sampler with a LoRA policy
    assert pd.notna(tr.train(1)["loss"].iloc[0])


def test_critic_from_a_lora_policy_is_a_full_merged_backbone():
    policy, tok = lora_policy()
    policy = _moved(policy)
    critic = CriticModel.build("policy", policy, tok)
    base, _ = load_policy("arithmetic-base", progress=False)
    assert not is_peft_model(critic.backbone)
    assert sum(p.numel() for p in critic.backbone.parameters()) == sum(p.numel() for p in base.base_model.parameters())
    assert all(p.requires_grad for p in critic.parameters())
    merged = policy.base_model.model.model.layers[0].self_attn.q_proj
    want = merged.base_layer.weight + merged.scaling["default"] * merged.lora_B["default"].weight @ merged.lora_A["default"].weight
    assert torch.allclose(critic.backbone.layers[0].self_attn.q_proj.weight, want, atol=1e-6)
    assert storages(critic).keys().isdisjoint(storages(policy).keys())  # a copy: training it leaves the policy alone


def test_float32_check_names_lora():
    policy, tok = load_policy("arithmetic-base", dtype=torch.bfloat16, progress=False)
    policy = SPEC.apply(policy)
    with pytest.raises(ValueError, match="LoRA"):
        Trainer(policy, tok, ArithmeticTask(test_size=5), GRPO, TrainerConfig(eval_every=0, progress=False))


@pytest.mark.parametrize("kwargs, match", [
    (dict(r=0, alpha=16, target_modules=("q_proj",)), "r "), (dict(r=8, alpha=0, target_modules=("q_proj",)), "alpha"),
    (dict(r=8, alpha=16, target_modules=()), "target_modules"), (dict(r=8, alpha=16, target_modules="q_proj"), "target_modules"),
    (dict(r=8, alpha=16, target_modules=("q_proj",), dropout=1.0), "dropout"),
    (dict(r=8, alpha=16, target_modules=("q_proj",), dropout=0.1), "dropout must be 0"),
])
def test_lora_spec_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoraSpec(**kwargs)


def test_lora_spec_from_value_and_unknown_targets():
    assert LoraSpec.from_value(None) is None
    spec = LoraSpec.from_value({"r": 4, "alpha": 8, "target_modules": ["q_proj"]})
    assert spec == LoraSpec(4, 8, ("q_proj",)) and spec.to_dict()["target_modules"] == ["q_proj"]
    with pytest.raises(ValueError, match="unknown keys"):
        LoraSpec.from_value({"r": 4, "alpha": 8, "target_modules": ["q_proj"], "rank": 2})
    with pytest.raises(TypeError, match="dict"):
        LoraSpec.from_value(8)
    policy, _ = load_policy("arithmetic-base", progress=False)
    with pytest.raises(ValueError, match="no_such_proj"):
        LoraSpec(4, 8, ("no_such_proj",)).apply(policy)


def test_apply_is_seeded_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, _ = lora_policy(seed=1)
    assert torch.equal(state, torch.random.get_rng_state())
    b, _ = lora_policy(seed=1)
    c, _ = lora_policy(seed=2)
    a_, b_, c_ = ([p for n, p in m.named_parameters() if "lora_A" in n][0] for m in (a, b, c))
    assert torch.equal(a_, b_) and not torch.equal(a_, c_)


def test_a_moved_lora_checkpoint_resumes(tmp_path):
    # the base is named (shipped checkpoint, absolute directory), not found relative to the checkpoint
    tr = make()
    tr.train(1)
    tr.save(tmp_path / "ck")
    shutil.copytree(tmp_path / "ck", tmp_path / "moved")
    shutil.rmtree(tmp_path / "ck")
    assert Trainer.resume(tmp_path / "moved").step == 1


# ------------------------------------------------------------------------------------ profiles, run, CLI
def test_profile_lora_keys_the_config_hash_and_provenance():
    import dataclasses
    import hashlib

    from grpo_lab.experiments import PROFILES, Profile, gpu_profile
    from grpo_lab.experiments.results import config_hash
    from grpo_lab.experiments.run_cache import _run_key

    cpu = PROFILES["cpu"]
    assert cpu.lora is None and gpu_profile(environ={}).lora is None
    with_lora = dataclasses.replace(cpu, lora=dict(r=8, alpha=16, target_modules=["q_proj", "v_proj"]))
    assert with_lora.lora == SPEC
    assert config_hash(GRPO, with_lora, 3) != config_hash(GRPO, cpu, 3)
    assert _run_key("fp", GRPO, with_lora, 3, 0) != _run_key("fp", GRPO, cpu, 3, 0)
    # without LoRA the payload has no lora key: the hash is what it was before the field existed (the trainer
    # configuration counted without its output fields, TrainerConfig.run_identity)
    payload = {"algo": dataclasses.asdict(GRPO), "profile": cpu.name, "base": cpu.base, "task": cpu.task,
               "task_kwargs": dict(cpu.task_kwargs), "config": cpu.config.run_identity(), "steps": 3}
    old = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]
    assert config_hash(GRPO, cpu, 3) == old
    assert gpu_profile(environ={}, lora=SPEC).lora == SPEC
    with pytest.raises(ValueError, match="alpha"):
        Profile(name="x", base="arithmetic-base", task="arithmetic", steps=1, config=cpu.config,
                lora=dict(r=8, alpha=-1, target_modules=["q_proj"]))


def test_run_with_lora_trains_adapters_and_records_them():
    from grpo_lab.experiments import Profile, run

    prof = Profile(name="t", base="arithmetic-base", task="arithmetic", steps=1,
                   config=TrainerConfig(prompts_per_step=2, group_size=2, max_new_tokens=8, eval_every=0, lr=1e-2),
                   task_kwargs={"test_size": 5})
    res = run("GRPO", profile=prof, seeds=[0], cache=False, progress=False, lora=dict(r=4, alpha=8,
                                                                                       target_modules=["q_proj"]))
    assert res.provenance["lora"] == {"r": 4, "alpha": 8, "target_modules": ["q_proj"], "dropout": 0.0}
    assert res.provenance["peft"] and res.history["step"].tolist() == [1]
    assert "lora" not in run("GRPO", profile=prof, seeds=[0], steps=0, cache=False, progress=False).provenance


def test_cli_lora_options_reach_run(monkeypatch, tmp_path, capsys):
    from grpo_lab.cli import main as cli
    from grpo_lab import experiments
    from grpo_lab.experiments import RunResult

    calls = []

    def fake(algo, **kwargs):
        calls.append(kwargs)
        return RunResult(pd.DataFrame([{"algo": algo.name, "seed": 0, "step": 1}]),
                         {"steps": 1, "seeds": [0], "wall_seconds": 0.1, "cached_seeds": []})

    monkeypatch.setattr(experiments, "run", fake)
    out = tmp_path / "r.json"
    assert cli.main(["GRPO", "--lora-r", "8", "--lora-alpha", "16", "--lora-targets", "q_proj", "v_proj",
                     "--out", str(out)]) == 0
    assert calls[-1]["lora"] == SPEC
    assert cli.main(["GRPO", "--lora-r", "4", "--out", str(out), "--overwrite"]) == 0
    assert calls[-1]["lora"] == LoraSpec(4, 8, ("q_proj", "v_proj"))  # alpha 2r, the query and value projections
    assert cli.main(["GRPO", "--out", str(out), "--overwrite"]) == 0 and calls[-1]["lora"] is None
    for args, message in ((["--lora-alpha", "4"], "--lora-alpha without --lora-r"),
                          (["--lora-r", "0"], "r (the rank) must be an int >= 1"),
                          (["--lora-r", "4", "--lora-dropout", "0.1"], "unrecognized arguments")):
        capsys.readouterr()
        assert cli.main(["GRPO", *args, "--out", str(out), "--overwrite"]) == 2
        assert message in capsys.readouterr().err
    assert len(calls) == 3


def test_gradient_checkpointing_with_lora_gives_the_same_training():
    # non-reentrant checkpointing needs no input that requires grad (the frozen embedding's output does
    # not), so adapters behind checkpointed layers still get their gradients; the same two steps result
    runs = {}
    for ckpt in (False, True):
        tr = make(gradient_checkpointing=ckpt)  # built just before training: Trainer() seeds torch's generator
        assert any(getattr(m, "gradient_checkpointing", False) is True for m in tr.policy.modules()) == ckpt
        runs[ckpt] = (tr.train(2).drop(columns=list(MEASURED_COLUMNS), errors="ignore"), tr.policy)
    assert runs[True][0]["grad_norm"].gt(0).all()
    pd.testing.assert_frame_equal(runs[True][0], runs[False][0], rtol=1e-5, atol=1e-7)
    for (n, p), (_, q) in zip(runs[False][1].named_parameters(), runs[True][1].named_parameters()):
        if "lora_" in n:
            torch.testing.assert_close(q, p, atol=1e-7, rtol=1e-5)


def test_lora_spec_defaults_and_a_misspelled_target():
    from grpo_lab.cli.main import LORA_TARGETS
    from grpo_lab.policy.lora import DEFAULT_TARGETS

    assert LoraSpec(r=4) == LoraSpec(4, 8, ("q_proj", "v_proj")) and LORA_TARGETS == DEFAULT_TARGETS
    assert LoraSpec.from_value({"r": 4}) == LoraSpec(r=4)
    base, _ = load_policy("arithmetic-base", progress=False)
    with pytest.raises(ValueError, match=r"\['qproj_typo'\] match no module"):
        LoraSpec(r=4, target_modules=("q_proj", "qproj_typo")).apply(base)


def test_a_peft_lora_dropout_is_zeroed_in_the_saved_adapter_config(tmp_path):
    import peft

    base, tok = load_policy("arithmetic-base", progress=False)
    policy = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], lora_dropout=0.1))
    tr = Trainer(policy, tok, ArithmeticTask(test_size=5), GRPO,
                 TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=8, eval_every=0, progress=False))
    assert tr.policy.peft_config["default"].lora_dropout == 0.0
    assert all(m.p == 0 for m in tr.policy.modules() if isinstance(m, torch.nn.Dropout))
