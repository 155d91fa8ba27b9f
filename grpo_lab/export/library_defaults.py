"""The defaults of TRL 1.16.0's ``GRPOConfig`` and verl 0.9.1's ``ppo_trainer.yaml``, recorded as data.

:mod:`grpo_lab.export.lint` reads a TRL or verl configuration *with the library's defaults filled in*
for every field it does not set, without TRL or verl installed. The values below were read from
``trl/trainer/grpo_config.py`` (and the ``transformers.TrainingArguments`` fields it inherits) of TRL
1.16.0 and from ``verl/trainer/config/_generated_ppo_trainer.yaml`` (the flattened ``ppo_trainer.yaml``)
of verl 0.9.1; ``tests/export/xcheck/test_xcheck_lint.py`` checks them against the installed libraries (``make xcheck``).

* :data:`TRL_DEFAULTS` — the fields the linter reads (loss, sampling, optimiser, sizes), with their
  dataclass defaults; :data:`TRL_OTHER_FIELDS` — every other ``GRPOConfig`` field (read, outside the loss);
  :data:`TRL_SCRIPT_FIELDS` — the model and data keys the ``trl grpo`` script reads from the same file.
* :data:`VERL_DEFAULTS` — dotted keys the linter reads, with their defaults; :data:`VERL_STRICT_SECTIONS`
  — the sections holding the loss, whose every key must be known (:data:`VERL_DEFAULTS` or
  :data:`VERL_OTHER_KEYS`); a key elsewhere under :data:`VERL_SECTIONS` is outside the loss.
"""

from __future__ import annotations

__all__ = ["TRL_DEFAULTS_VERSION", "VERL_DEFAULTS_VERSION", "TRL_DEFAULTS", "TRL_OTHER_FIELDS", "TRL_SCRIPT_FIELDS",
           "VERL_DEFAULTS",
           "VERL_OTHER_KEYS", "VERL_OPEN_PREFIXES", "VERL_STRICT_SECTIONS", "VERL_SECTIONS"]

#: the TRL release :data:`TRL_DEFAULTS` was read from
TRL_DEFAULTS_VERSION = "1.16.0"
#: the verl release :data:`VERL_DEFAULTS` was read from
VERL_DEFAULTS_VERSION = "0.9.1"

#: ``GRPOConfig`` field -> its dataclass default (TRL 1.16.0). ``bf16=None`` becomes True in
#: ``GRPOConfig.__post_init__`` unless ``fp16`` is set; ``epsilon_high=None`` means ``epsilon``.
TRL_DEFAULTS: dict = {
    # the loss
    "beta": 0.0, "epsilon": 0.2, "epsilon_high": None, "delta": None, "loss_type": "dapo", "scale_rewards": "group",
    "importance_sampling_level": "token", "use_bias_correction_kl": True, "off_policy_mask_threshold": None,
    "mask_truncated_completions": False, "top_entropy_quantile": 1.0, "entropy_coef": 0.0,
    "use_adaptive_entropy": False, "use_vllm": False, "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_clip_min": None, "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05,
    "multi_objective_aggregation": "sum_then_normalize", "reward_weights": None, "sync_ref_model": False,
    # sizes
    "num_generations": 8, "max_completion_length": 512, "num_iterations": 1, "steps_per_generation": None,
    "generation_batch_size": None, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
    # optimiser, schedule, precision
    "learning_rate": 1e-06, "adam_beta1": 0.9, "adam_beta2": 0.999, "weight_decay": 0.0, "max_grad_norm": 1.0,
    "lr_scheduler_type": "linear", "warmup_steps": 0, "bf16": None, "fp16": False, "cast_lm_head_to_fp32": False,
    # sampling
    "temperature": 1.0, "top_p": 1.0, "top_k": 0,
}

#: the other ``GRPOConfig`` fields of TRL 1.16.0 (logging, saving, hub, vLLM server, ...): known, outside the loss
TRL_OTHER_FIELDS = frozenset((
    'output_dir', 'num_train_epochs', 'max_steps', 'lr_scheduler_kwargs', 'optim', 'optim_args', 'adam_epsilon',
    'optim_target_modules', 'average_tokens_across_devices', 'label_smoothing_factor', 'bf16_full_eval',
    'fp16_full_eval', 'tf32', 'activation_checkpointing', 'activation_checkpointing_kwargs',
    'gradient_checkpointing', 'gradient_checkpointing_kwargs', 'torch_compile', 'torch_compile_backend',
    'torch_compile_mode', 'use_liger_kernel', 'liger_kernel_config', 'use_cache', 'neftune_noise_alpha',
    'torch_empty_cache_steps', 'auto_find_batch_size', 'logging_strategy', 'logging_steps', 'logging_first_step',
    'log_on_each_node', 'logging_nan_inf_filter', 'include_num_input_tokens_seen', 'log_level',
    'log_level_replica', 'disable_tqdm', 'report_to', 'run_name', 'project', 'trackio_space_id',
    'trackio_bucket_id', 'trackio_static_space_id', 'eval_strategy', 'eval_steps', 'eval_delay',
    'per_device_eval_batch_size', 'prediction_loss_only', 'eval_on_start', 'eval_do_concat_batches',
    'eval_use_gather_object', 'eval_accumulation_steps', 'include_for_metrics', 'batch_eval_metrics',
    'save_only_model', 'save_strategy', 'save_steps', 'save_on_each_node', 'save_total_limit',
    'enable_jit_checkpoint', 'push_to_hub', 'hub_token', 'hub_private_repo', 'hub_model_id', 'hub_strategy',
    'hub_always_push', 'hub_revision', 'load_best_model_at_end', 'metric_for_best_model', 'greater_is_better',
    'ignore_data_skip', 'restore_callback_states_from_checkpoint', 'full_determinism', 'seed', 'data_seed',
    'use_cpu', 'accelerator_config', 'parallelism_config', 'dataloader_drop_last', 'dataloader_num_workers',
    'dataloader_pin_memory', 'dataloader_persistent_workers', 'dataloader_prefetch_factor',
    'dataloader_multiprocessing_context', 'dataloader_in_order', 'remove_unused_columns', 'label_names',
    'train_sampling_strategy', 'length_column_name', 'ddp_find_unused_parameters', 'ddp_bucket_cap_mb',
    'ddp_broadcast_buffers', 'ddp_static_graph', 'ddp_backend', 'ddp_timeout', 'fsdp', 'fsdp_config', 'deepspeed',
    'debug', 'skip_memory_metrics', 'do_train', 'do_eval', 'do_predict', 'resume_from_checkpoint', 'local_rank',
    'model_init_kwargs', 'trust_remote_code', 'router_aux_loss_coef', 'disable_dropout', 'num_generations_eval',
    'ds3_gather_for_generation', 'shuffle_dataset', 'pad_to_multiple_of', 'min_p', 'generation_kwargs',
    'chat_template_kwargs', 'repetition_penalty', 'cache_implementation', 'vllm_mode', 'vllm_model_impl',
    'vllm_enable_sleep_mode', 'vllm_structured_outputs_regex', 'vllm_server_base_url', 'vllm_server_host',
    'vllm_server_port', 'vllm_server_timeout', 'vllm_group_port', 'vllm_gpu_memory_utilization',
    'vllm_max_model_length', 'vllm_tensor_parallel_size', 'vespo_k_pos', 'vespo_lambda_pos', 'vespo_k_neg',
    'vespo_lambda_neg', 'ref_model_mixup_alpha', 'ref_model_sync_steps', 'entropy_coef_min', 'entropy_coef_max',
    'entropy_coef_delta', 'entropy_target', 'max_tool_calling_iterations', 'log_completions', 'log_multimodal', 'num_completions_to_print',
    'log_unique_prompts', 'log_completions_hub_repo', 'use_transformers_continuous_batching',
    'transformers_continuous_batching_config', 'use_transformers_paged', 'vllm_importance_sampling_cap',
))

#: the other keys of a ``trl grpo --config FILE``, the model, its adapters and the data (outside the loss). The
#: ``TrlParser`` of TRL 1.16.0's ``trl/scripts/grpo.py`` reads ``GRPOScriptArguments``, ``GRPOConfig``,
#: ``ModelConfig`` and ``DatasetMixtureConfig`` from one file.
TRL_SCRIPT_FIELDS = frozenset((
    # GRPOScriptArguments (ScriptArguments and its reward fields)
    'dataset_name', 'dataset_config', 'dataset_train_split', 'dataset_test_split', 'dataset_streaming',
    'ignore_bias_buffers', 'reward_funcs', 'reward_model_name_or_path',
    # ModelConfig
    'model_name_or_path', 'model_revision', 'dtype', 'attn_implementation', 'use_peft', 'lora_r', 'lora_alpha',
    'lora_dropout', 'lora_target_modules', 'lora_target_parameters', 'lora_modules_to_save', 'lora_task_type',
    'use_rslora', 'use_dora', 'load_in_8bit', 'load_in_4bit', 'bnb_4bit_quant_type', 'use_bnb_nested_quant',
    'bnb_4bit_quant_storage',
    # DatasetMixtureConfig
    'datasets', 'streaming', 'test_split_size',
))

_A = "actor_rollout_ref.actor."
#: dotted key of verl 0.9.1's trainer config -> its default (``ppo_trainer.yaml``, composed)
VERL_DEFAULTS: dict = {
    "algorithm.adv_estimator": "gae", "algorithm.norm_adv_by_std_in_grpo": True, "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0, "algorithm.use_kl_in_reward": False, "algorithm.kl_penalty": "kl",
    "algorithm.kl_ctrl.kl_coef": 0.001, "algorithm.filter_groups.enable": False,
    "algorithm.filter_groups.metric": "reward", "algorithm.filter_groups.max_num_gen_batches": 0,
    "algorithm.rollout_correction.rollout_is": None, "algorithm.rollout_correction.rollout_rs": None,
    "algorithm.rollout_correction.rollout_is_threshold": 2.0, "algorithm.rollout_correction.bypass_mode": False,
    "algorithm.rollout_correction.loss_type": "ppo_clip", "algorithm.rollout_correction.rollout_is_batch_normalize": False,
    "algorithm.use_pf_ppo": False,
    _A + "policy_loss.loss_mode": "vanilla", _A + "policy_loss.clip_cov_ratio": 0.0002,
    _A + "policy_loss.clip_cov_lb": 1.0, _A + "policy_loss.clip_cov_ub": 5.0, _A + "policy_loss.kl_cov_ratio": 0.0002,
    _A + "policy_loss.ppo_kl_coef": 0.1, _A + "clip_ratio": 0.2, _A + "clip_ratio_low": 0.2,
    _A + "clip_ratio_high": 0.2, _A + "clip_ratio_c": 3.0, _A + "tau_pos": 1.0, _A + "tau_neg": 1.05,
    _A + "loss_agg_mode": "token-mean", _A + "loss_scale_factor": None, _A + "entropy_coeff": 0,
    _A + "use_kl_loss": False, _A + "kl_loss_coef": 0.001, _A + "kl_loss_type": "low_var_kl", _A + "ppo_epochs": 1,
    _A + "ppo_mini_batch_size": 256, _A + "ppo_micro_batch_size_per_gpu": None,
    _A + "optim.lr": 1e-06, _A + "optim.weight_decay": 0.01, _A + "optim.betas": [0.9, 0.999],
    _A + "optim.clip_grad": 1.0, _A + "optim.lr_warmup_steps": -1, _A + "optim.lr_warmup_steps_ratio": 0.0,
    _A + "optim.lr_scheduler_type": "constant",
    "actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_p": 1, "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.rollout.dtype": "bfloat16", "actor_rollout_ref.rollout.logprobs_mode": "processed_logprobs",
    "actor_rollout_ref.rollout.calculate_log_probs": True,
    "data.max_response_length": 512, "data.train_batch_size": 1024,
    "reward.reward_manager.name": "naive", "trainer.nnodes": 1, "trainer.n_gpus_per_node": 8,
    "critic.enable": None, "critic.optim.lr": 1e-05, "critic.optim.lr_scheduler_type": "constant",
    "critic.optim.lr_warmup_steps": -1, "critic.optim.lr_warmup_steps_ratio": 0.0, "critic.cliprange_value": 0.5,
    "trainer.critic_warmup": 0,
}

#: the sections whose every key must be known, which are the actor (but its engine, checkpoint, profiler and
#: optimiser subsections), the algorithm and the custom reward function
VERL_STRICT_SECTIONS = (_A, "algorithm.", "custom_reward_function.")
_OPEN = tuple(_A + s for s in ("fsdp_config.", "checkpoint.", "profiler.", "optim.", "qat.")) + (
    "algorithm.pf_ppo.",)
#: the other keys of the strict sections in verl 0.9.1 (known, outside the loss)
VERL_OTHER_KEYS = frozenset([_A + k for k in (
    "_target_", "rollout_n", "strategy", "ppo_micro_batch_size", "use_dynamic_bsz", "ppo_max_token_len_per_gpu",
    "freeze_vision_tower", "policy_loss._target_", "policy_loss.dro_beta", "calculate_entropy",
    "calculate_sum_pi_squared", "use_prefix_grouper", "use_torch_compile", "shuffle", "data_loader_seed",
    "use_fused_kernels", "grad_clip", "ulysses_sequence_parallel_size", "entropy_from_logits_with_chunking",
    "entropy_from_logits_chunk_size", "entropy_checkpointing", "pad_to_length", "use_remove_padding")]
    + ["algorithm." + k for k in (
        "_target_", "filter_groups._target_", "filter_groups.max_inflight_gen_batches", "kl_ctrl._target_",
        "kl_ctrl.type", "kl_ctrl.horizon", "kl_ctrl.target_kl", "rollout_correction.rollout_rs_threshold")]
    + ["custom_reward_function.path", "custom_reward_function.name"])
#: prefixes of keys in the strict sections that hold no loss setting (any key under them is accepted)
VERL_OPEN_PREFIXES = _OPEN
#: the top-level sections of verl 0.9.1's trainer config
VERL_SECTIONS = ("actor_rollout_ref", "algorithm", "critic", "custom_reward_function", "data", "distillation",
                 "global_profiler", "model_engine", "ray_kwargs", "reward", "reward_model", "sandbox_fusion", "skip",
                 "trainer", "transfer_queue")
