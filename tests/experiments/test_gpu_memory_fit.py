"""The GPU profile's batch sizes fitted to a (fake) card by the memory model, from config.json alone,
before any weight is loaded; explicit choices kept, or refused with the phase and the fix named."""

import json
from dataclasses import replace

import pytest

from grpo_lab import experiments
from grpo_lab.experiments import memory_model as mm
from grpo_lab.algo.algorithms import DAPO, VAPO
from grpo_lab.experiments import memory_fit

QWEN05 = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
          "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True}
GIB = 2**30


@pytest.fixture
def qwen_dir(tmp_path):
    """A directory with Qwen2.5-0.5B's config.json and no weights: a fit that loaded weights would fail."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN05))
    return tmp_path


def _shape(micro):
    return mm.RunShape(rows=128, prompt_len=memory_fit.ASSUMED_PROMPT_TOKENS, max_new_tokens=512, micro_batch_size=micro,
                       eval_batch_size=256, autocast="bfloat16", kl_reference=True)


@pytest.mark.parametrize("card_gib", [24, 80])
def test_the_profile_takes_the_largest_micro_batch_that_fits(qwen_dir, card_gib):
    prof = experiments.gpu_profile(qwen_dir, environ={}, gpu_memory=card_gib * GIB)
    micro = prof.config.micro_batch_size
    usable = mm.usable_memory(card_gib * GIB)
    assert mm.predict_memory(QWEN05, _shape(micro)).peak <= usable
    assert micro == 64 or mm.predict_memory(QWEN05, _shape(2 * micro)).peak > usable


def test_no_card_leaves_the_defaults_and_the_stand_in_fits(tmp_path):
    import _hub_fixture as H

    assert experiments.gpu_profile(environ={}, device="cpu").config.micro_batch_size == 4  # no CUDA, no card
    H.write_tiny_instruct_model(tmp_path / "m")
    prof = experiments.gpu_profile(tmp_path / "m", environ={}, gpu_memory=16 * GIB)
    assert prof.config.micro_batch_size == 64  # a tiny model: the whole minibatch


def test_explicit_sizes_are_kept_or_refused_with_the_fix(qwen_dir):
    kept = experiments.gpu_profile(qwen_dir, environ={"GRPO_LAB_GPU_CONFIG": '{"micro_batch_size": 1}'},
                                   gpu_memory=80 * GIB)
    assert kept.config.micro_batch_size == 1
    with pytest.raises(ValueError, match=r"train_micro with micro_batch_size=64 .*fits with .*micro_batch_size="):
        experiments.gpu_profile(qwen_dir, environ={}, gpu_memory=16 * GIB, micro_batch_size=64)
    with pytest.raises(ValueError, match="train_micro with micro_batch_size=64"):
        experiments.gpu_profile(qwen_dir, environ={"GRPO_LAB_GPU_CONFIG": '{"micro_batch_size": 64}'},
                                gpu_memory=16 * GIB)
    with pytest.raises(ValueError, match="optimiser state alone .*LoRA"):
        experiments.gpu_profile(qwen_dir, environ={}, gpu_memory=6 * GIB)


def test_a_chapter_run_refuses_an_algorithm_that_does_not_fit_before_loading(qwen_dir):
    prof = experiments.gpu_profile(qwen_dir, environ={}, gpu_memory=16 * GIB)
    prof = replace(prof, config=replace(prof.config, micro_batch_size=1))
    memory_fit.check_algorithms_fit(prof, [DAPO], total_memory=80 * GIB)
    with pytest.raises(ValueError, match="VAPO on the gpu profile"):
        memory_fit.check_algorithms_fit(prof, [VAPO], total_memory=16 * GIB)


def test_gradient_checkpointing_is_switched_on_when_only_that_fits(qwen_dir):
    # 16 GB, full fine-tuning with a reference copy, 2 questions x 8 with a 2,048-token budget: no
    # micro-batch fits without checkpointing (memory model), so the profile switches it on, unless the
    # user said otherwise
    long = dict(prompts_per_step=2, max_new_tokens=2048)
    prof = experiments.gpu_profile(qwen_dir, environ={}, gpu_memory=16 * GIB, **long)
    assert prof.config.gradient_checkpointing and prof.config.micro_batch_size == 1
    shape = mm.RunShape(rows=16, prompt_len=memory_fit.ASSUMED_PROMPT_TOKENS, max_new_tokens=2048, micro_batch_size=1,
                        eval_batch_size=prof.config.eval_batch_size, kl_reference=True, gradient_checkpointing=True)
    assert mm.predict_memory(QWEN05, shape).peak <= mm.usable_memory(16 * GIB)
    assert mm.predict_memory(QWEN05, replace(shape, gradient_checkpointing=False)).peak > mm.usable_memory(16 * GIB)
    assert not experiments.gpu_profile(qwen_dir, environ={}, gpu_memory=80 * GIB, **long).config.gradient_checkpointing
    with pytest.raises(ValueError, match="train_micro"):
        experiments.gpu_profile(qwen_dir, environ={}, gpu_memory=16 * GIB, gradient_checkpointing=False, **long)


def test_lora_needs_no_reference_copy_nor_optimiser_state_for_the_base(qwen_dir):
    with pytest.raises(ValueError, match="LoRA"):
        experiments.gpu_profile(qwen_dir, environ={}, gpu_memory=6 * GIB)
    lora = dict(r=8, alpha=16, target_modules=("q_proj", "v_proj"))
    prof = experiments.gpu_profile(qwen_dir, environ={}, gpu_memory=6 * GIB, lora=lora)
    shape = replace(_shape(prof.config.micro_batch_size), eval_batch_size=prof.config.eval_batch_size,
                    gradient_checkpointing=prof.config.gradient_checkpointing, lora_rank=8,
                    lora_targets=("q_proj", "v_proj"))
    assert mm.predict_memory(QWEN05, shape).peak <= mm.usable_memory(6 * GIB)


def test_a_fit_that_cannot_be_made_warns_and_keeps_the_defaults(tmp_path):
    with pytest.warns(RuntimeWarning, match="config.json could not be read"):
        prof = experiments.gpu_profile(tmp_path / "no_such_model", environ={}, gpu_memory=4 * GIB)
    assert prof.config.micro_batch_size == 4
    (tmp_path / "moe").mkdir()
    (tmp_path / "moe" / "config.json").write_text(json.dumps({**QWEN05, "model_type": "qwen2_moe", "num_experts": 8}))
    with pytest.warns(RuntimeWarning, match="Mixture-of-Experts"):
        experiments.gpu_profile(tmp_path / "moe", environ={}, gpu_memory=4 * GIB)


def test_with_lora_the_state_error_names_the_float32_base_not_lora(qwen_dir):
    lora = dict(r=8, alpha=16, target_modules=("q_proj", "v_proj"))
    with pytest.raises(ValueError, match="float32 weights of the frozen base") as err:
        experiments.gpu_profile(qwen_dir, environ={}, gpu_memory=2 * GIB, lora=lora)
    assert "use LoRA" not in str(err.value)


def test_key_value_heads_must_divide_the_heads():
    with pytest.raises(ValueError, match="num_key_value_heads"):
        mm.ModelDims.from_config({**QWEN05, "num_key_value_heads": 28})
