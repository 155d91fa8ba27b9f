"""grpo_lab.training.adamw: weight decay on weight matrices only, the field's rule (transformers' Trainer)."""

import pytest
import torch
from transformers import Trainer

from grpo_lab.policy.models import TinyConfig, build_char_tokenizer, tiny_policy
from grpo_lab.training.adamw import build_adamw, decay_parameter_names

TINY = TinyConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3_moe"])
def test_decayed_set_is_transformers_and_excludes_biases_and_norms(tok, arch):
    model = tiny_policy(tok, TinyConfig(**{**TINY.__dict__, "arch": arch}), seed=0)
    names = decay_parameter_names(model)
    expected = set(Trainer.get_decay_parameter_names(None, model))
    assert set(names) == expected & {n for n, _ in model.named_parameters()}
    assert names and not any(n.endswith("bias") or "norm" in n for n in names)
    left_out = {n for n, _ in model.named_parameters()} - set(names)
    assert any("norm" in n for n in left_out)
    if arch == "qwen2":  # Qwen2 has q/k/v biases
        assert any(n.endswith("bias") for n in left_out)


def test_decayed_set_of_a_lora_policy_excludes_nothing_trainable_but_biases_and_norms(tok):
    pytest.importorskip("peft")
    from grpo_lab.policy.lora import LoraSpec

    model = LoraSpec(r=2).apply(tiny_policy(tok, TINY, seed=0))
    names = set(decay_parameter_names(model))
    assert names == set(Trainer.get_decay_parameter_names(None, model)) & {n for n, _ in model.named_parameters()}
    lora = [n for n, p in model.named_parameters() if p.requires_grad]
    assert lora and all(n in names for n in lora)


def test_zero_gradient_a_bias_and_a_norm_weight_stay_a_linear_weight_decays():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(3, 3)
            self.post_attention_layernorm = torch.nn.LayerNorm(3)

    torch.manual_seed(0)
    block = Block()
    before = {n: p.detach().clone() for n, p in block.named_parameters()}
    opt = build_adamw(block, lr=0.1, weight_decay=0.5, betas=(0.9, 0.99))
    for p in block.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(block.named_parameters())
    for name in ("proj.bias", "post_attention_layernorm.weight", "post_attention_layernorm.bias"):
        assert torch.equal(after[name], before[name]), name
    torch.testing.assert_close(after["proj.weight"], before["proj.weight"] * (1 - 0.1 * 0.5))


def test_no_weight_decay_keeps_one_group_in_parameter_order(tok):
    model = tiny_policy(tok, TINY, seed=0)
    opt = build_adamw(model, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.99))
    assert len(opt.param_groups) == 1
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for p in model.parameters()]
    two = build_adamw(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
    assert [g["weight_decay"] for g in two.param_groups] == [0.1, 0.0]
    assert sum(len(g["params"]) for g in two.param_groups) == len(list(model.parameters()))


def test_not_a_module_is_one_clear_error():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        decay_parameter_names([torch.zeros(2)])
    with pytest.raises(TypeError, match="torch.nn.Module"):
        build_adamw([torch.zeros(2)], lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
