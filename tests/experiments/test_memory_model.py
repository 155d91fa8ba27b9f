"""grpo_lab.experiments.memory_model: formulas on hand-computed cases, the fit of batch sizes to a card, and
the predictions against CPU measurements at scaled-down shapes (benchmarks/memory_model.py, one
subprocess per phase)."""

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from grpo_lab.experiments import memory_model as mm

# Qwen2.5-0.5B-Instruct's config.json, the fields written by hand
QWEN05 = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
          "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True}
SHAPE = mm.RunShape(rows=128, prompt_len=256, max_new_tokens=512, micro_batch_size=4, eval_batch_size=256)


def test_qwen25_05b_parameter_count_and_float32_weights():
    est = mm.predict_memory(QWEN05, SHAPE)
    assert est.params == 494_032_768
    assert est.phases["weights"] == 1_976_131_072  # 4 bytes each
    assert est.phases["gradients"] == 4 * 494_032_768 and est.phases["adam"] == 8 * 494_032_768
    assert est.phases["reference"] == 0 and est.phases["critic"] == 0


def test_untied_lm_head_adds_v_times_h_and_a_transformers_config_reads_the_same():
    from transformers import Qwen2Config

    untied = {**QWEN05, "tie_word_embeddings": False}
    assert mm.ModelDims.from_config(untied).params() == 494_032_768 + 151936 * 896
    cfg = Qwen2Config(**{k: v for k, v in QWEN05.items() if k != "model_type"})
    assert mm.ModelDims.from_config(cfg) == mm.ModelDims.from_config(QWEN05)


def test_reference_critic_and_lora_state():
    d = mm.ModelDims.from_config(QWEN05)
    est = mm.predict_memory(QWEN05, replace(SHAPE, kl_reference=True, critic=True))
    assert est.phases["reference"] == 4 * 494_032_768
    assert est.phases["critic"] == 16 * (494_032_768 + 896 + 1)  # tied: the backbone is every parameter
    # LoRA r=8 on q and v: per layer 8*(896+896) + 8*(896+128) = 22,528; 24 layers
    lora = mm.predict_memory(QWEN05, replace(SHAPE, kl_reference=True, lora_rank=8, lora_targets=("q_proj", "v_proj")))
    assert lora.trainable == 24 * 22_528 == d.lora_params(8, ("q_proj", "v_proj"))
    assert lora.phases["gradients"] == 4 * lora.trainable and lora.phases["adam"] == 8 * lora.trainable
    assert lora.phases["reference"] == 0  # the adapters off: no copy
    assert lora.phases["weights"] == 4 * (494_032_768 + lora.trainable)


def test_kv_cache_activations_and_logits_by_hand():
    est = mm.predict_memory(QWEN05, SHAPE)
    gen = est.notes["rollout"]
    # layers, rows, positions, kv dims, float32 keys + bf16 values (test_the_kv_cache_dtypes_the_model_assumes)
    assert gen["kv_cache"] == 24 * 128 * 768 * 2 * 64 * (4 + 2)
    assert gen["step_buffers"] == 5 * 128 * 151936 * 4
    # float32: 2 norms x 3H + 5 attention tensors of H + 4 of I, 4 bytes each
    small = mm.ModelDims.from_config({**QWEN05, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024})
    assert mm.layer_activation_bytes(small, "float32") == (11 * 256 + 4 * 1024) * 4
    assert mm.layer_activation_bytes(small, "bfloat16") == 2 * (8 * 256 + 2 * 256) + 10 * 256 + 8 * 1024
    lp = mm.logprob_bytes(2, 10, 100, "float32", chunk=None, entropy=True, backward=False)
    assert lp == {"logits": 2 * 11 * 100 * 4, "forward": 2 * 10 * 100 * 17, "backward": 0}
    ckpt = mm.predict_memory(QWEN05, replace(SHAPE, gradient_checkpointing=True))
    assert ckpt.phases["train_micro"] < est.phases["train_micro"]
    assert est.peak == est.persistent + max(est.phases[k] for k in mm.TRANSIENT)


def test_fit_picks_the_largest_micro_batch_and_names_what_does_not_fit():
    big = mm.fit_batch_sizes(QWEN05, SHAPE, 80 * 2**30, max_micro=64)
    small = mm.fit_batch_sizes(QWEN05, SHAPE, 24 * 2**30, max_micro=64)
    assert big[0] > small[0] >= 1 and big[1] == 256
    usable = mm.usable_memory(24 * 2**30)
    assert mm.predict_memory(QWEN05, replace(SHAPE, micro_batch_size=small[0])).peak <= usable
    assert mm.predict_memory(QWEN05, replace(SHAPE, micro_batch_size=2 * small[0])).peak > usable
    with pytest.raises(ValueError, match=r"train_micro with micro_batch_size=64 .* fits with micro_batch_size="):
        mm.fit_batch_sizes(QWEN05, replace(SHAPE, micro_batch_size=64), 24 * 2**30, fixed_micro=True)
    with pytest.raises(ValueError, match="optimiser state alone .* LoRA"):
        mm.fit_batch_sizes(QWEN05, SHAPE, 6 * 2**30)
    with pytest.raises(ValueError, match=r"evaluation with eval_batch_size=4096 .* fits with eval_batch_size="):
        mm.fit_batch_sizes(QWEN05, replace(SHAPE, eval_batch_size=4096), 24 * 2**30, fixed_eval=True)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="hidden_size"):
        mm.ModelDims.from_config({k: v for k, v in QWEN05.items() if k != "hidden_size"})
    with pytest.raises(ValueError, match="Mixture-of-Experts"):
        mm.ModelDims.from_config({**QWEN05, "num_experts": 8})
    with pytest.raises(ValueError, match="micro_batch_size"):
        replace(SHAPE, micro_batch_size=0)
    with pytest.raises(ValueError, match="autocast"):
        replace(SHAPE, autocast="int8")
    with pytest.raises(ValueError, match="unknown target"):
        mm.ModelDims.from_config(QWEN05).lora_params(8, ("qkv",))
    with pytest.raises(ValueError, match="total"):
        mm.usable_memory(-1)


def _bench():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_model.py"
    spec = importlib.util.spec_from_file_location("bench_memory_model", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS reset needs Linux /proc")
@pytest.mark.parametrize("case", ["state", "train", "rollout"])
def test_prediction_within_25_percent_of_cpu_measurement(case):
    """Each phase measured in a fresh process at the benchmark's ``test`` scale (a random 16M-parameter
    Qwen2, V = 32,000: each phase 100-900 MiB) against the model's prediction."""
    res = _bench().measure(case, "test")
    for phase, measured in res["measured"].items():
        predicted = res["predicted"][phase]
        assert measured > 50 * 2**20, (phase, measured)  # large enough for RSS noise not to matter
        assert abs(predicted - measured) <= 0.25 * measured, (phase, predicted / 2**20, measured / 2**20)


def test_the_gpu_memory_table_is_the_model():
    """benchmarks/README.md's table between the gpu-memory markers is what benchmarks/memory_model.py --fit-table
    prints."""
    tables = (Path(__file__).resolve().parents[2] / "benchmarks" / "README.md").read_text()
    block = tables.split("<!-- gpu-memory:start -->")[1].split("<!-- gpu-memory:end -->")[0]
    assert block.strip() == _bench().fit_table().strip()


def test_the_kv_cache_dtypes_the_model_assumes():
    """Under bfloat16 autocast a float32 Qwen2 caches float32 keys (the rotary embedding multiplies the
    bfloat16 projection by float32 cos / sin) and bfloat16 values: the (4 + e) bytes per position of
    memory_model._generation. A transformers change would show here."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=50)).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        cache = model(input_ids=torch.randint(0, 50, (2, 5)), use_cache=True).past_key_values
    layer = cache.layers[0]
    assert (layer.keys.dtype, layer.values.dtype) == (torch.float32, torch.bfloat16)
    d = mm.ModelDims.from_config({"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                  "num_key_value_heads": 1, "intermediate_size": 64, "vocab_size": 50})
    shape = mm.RunShape(rows=2, prompt_len=5, max_new_tokens=1, micro_batch_size=1, autocast="bfloat16")
    kv = mm._generation(d, shape, 2, 5, 1)["kv_cache"]
    assert kv == 2 * 6 * 16 * (4 + 2)  # rows x positions x kv_heads*head_dim x (float32 key + bf16 value), 1 layer
