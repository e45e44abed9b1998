"""TRL SFTConfig / transformers TrainingArguments keys in a `--config` YAML, mapped to this trainer's.

A YAML written for `trl sft --config FILE` (or a TrainingArguments dump) works here: each
common key is translated to the setting with the same meaning, and each key that has no
counterpart is refused with the reason, so nothing is silently ignored. The global batch
follows transformers' arithmetic: per_device_train_batch_size x gradient_accumulation_steps
x workers, unless global_batch_size is given too (then the three must agree).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping

# key -> our field, same meaning and unit
RENAMES = {
    "learning_rate": "lr", "per_device_train_batch_size": "micro_batch_size", "max_length": "seq_len",
    "max_seq_length": "seq_len", "weight_decay": "weight_decay", "max_grad_norm": "grad_clip",
    "save_steps": "checkpoint_every", "logging_steps": "log_every", "seed": "seed",
    "gradient_checkpointing": "activation_checkpointing", "dataset_text_field": "dataset_text_field",
    "run_name": "run_name", "save_total_limit": "num_to_keep", "model_name_or_path": "model",
    "dataset_name": "dataset", "dataset_config": "dataset_config", "dataset_train_split": "dataset_split",
    "attn_implementation": "attn_implementation", "chat_template_path": "chat_template",
}
SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant", "constant_with_warmup": "constant",
             "cosine_with_min_lr": "cosine"}
HF_DEFAULT_MICRO_BATCH = 8  # TrainingArguments.per_device_train_batch_size

# keys with no counterpart, and why (keys of TrainingArguments not listed get a generic reason)
REFUSED = {
    "fp16": "training runs in bf16 on GPU (fp32 on CPU); fp16 is not supported",
    "tf32": "TF32 matmuls are not configurable here",
    "optim": "the optimizer is AdamW (fused on GPU); other optimizers are not supported",
    "adam_beta1": "AdamW's betas are fixed at (0.9, 0.95) here", "adam_beta2": "AdamW's betas are fixed at (0.9, 0.95) here",
    "adam_epsilon": "AdamW's epsilon is fixed at 1e-8 here",
    "eval_strategy": "this trainer has no evaluation loop", "evaluation_strategy": "this trainer has no evaluation loop",
    "eval_steps": "this trainer has no evaluation loop", "do_eval": "this trainer has no evaluation loop",
    "per_device_eval_batch_size": "this trainer has no evaluation loop", "eval_packing": "this trainer has no evaluation loop",
    "eval_dataset_name": "this trainer has no evaluation loop", "dataset_test_split": "this trainer has no evaluation loop",
    "push_to_hub": "the exported model folder is not uploaded; push it yourself (huggingface-cli upload)",
    "hub_model_id": "the exported model folder is not uploaded; push it yourself (huggingface-cli upload)",
    "hub_strategy": "the exported model folder is not uploaded; push it yourself (huggingface-cli upload)",
    "logging_dir": "metrics go to the run folder (metrics.jsonl, tensorboard/)",
    "logging_first_step": "metrics are logged every log_every steps",
    "overwrite_output_dir": "a run folder is never overwritten: resubmitting its name resumes it",
    "resume_from_checkpoint": "resubmitting the same run name resumes from its last complete checkpoint",
    "deepspeed": "sharding is FSDP2, set up by this trainer (--sharding)",
    "fsdp": "sharding is FSDP2, set up by this trainer (--sharding)",
    "fsdp_config": "sharding is FSDP2, set up by this trainer (--sharding)",
    "ddp_backend": "Ray Train sets up the process group (NCCL on GPU, gloo on CPU)",
    "dataloader_num_workers": "packed rows are memory-mapped; there is no DataLoader",
    "dataloader_pin_memory": "packed rows are memory-mapped; there is no DataLoader",
    "dataset_num_proc": "tokenization runs once per node in the worker",
    "use_peft": "full fine-tuning only (no PEFT/LoRA)", "lora_r": "full fine-tuning only (no PEFT/LoRA)",
    "lora_alpha": "full fine-tuning only (no PEFT/LoRA)", "lora_dropout": "full fine-tuning only (no PEFT/LoRA)",
    "lora_target_modules": "full fine-tuning only (no PEFT/LoRA)",
    "load_in_4bit": "full fine-tuning only (no quantization)", "load_in_8bit": "full fine-tuning only (no quantization)",
    "use_liger_kernel": "kernels are chosen by this trainer", "torch_compile": "compilation is chosen by this trainer",
    "padding_free": "rows are always packed with per-document position ids",
    "packing_strategy": "packing is always best-fit decreasing, documents truncated to the sequence length",
    "truncation_mode": "documents are always truncated at the end (keep_start)",
    "shuffle_dataset": "packed rows are always shuffled per epoch with the seed",
    "dataset_kwargs": "datasets are prepared by this trainer", "model_init_kwargs": "the model is loaded by this trainer",
    "loss_type": "the loss is the mean negative log-likelihood over trained tokens",
    "neftune_noise_alpha": "NEFTune is not supported", "label_smoothing_factor": "label smoothing is not supported",
    "group_by_length": "rows are packed, not grouped by length",
    "gradient_checkpointing_kwargs": "activation checkpointing is per decoder layer, not configurable",
    "save_only_model": "checkpoints always hold model, optimizer and data position (needed to resume)",
    "save_safetensors": "the exported model is always safetensors",
    "local_rank": "Ray Train assigns ranks", "use_cpu": "use --device cpu",
}
REFUSED_VALUES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "bf16": (lambda v: v is True, "training always uses bf16 parameters on GPU (fp32 on CPU); remove the key"),
    "fp16": (lambda v: v is False, REFUSED["fp16"]),
    "packing": (lambda v: v is True, "documents are always packed (position ids restart per document, so attention "
                                     "never crosses them); packing: false is not supported"),
    "do_train": (lambda v: v is True, "training is what this trainer does; remove the key"),
    "logging_strategy": (lambda v: v == "steps", "metrics are logged every logging_steps steps"),
    "save_strategy": (lambda v: v in ("steps", "no"), "checkpoints are saved every save_steps steps (or only at "
                                                       "the end with save_strategy: no)"),
    "optim": (lambda v: v in ("adamw_torch", "adamw_torch_fused"), REFUSED["optim"]),
    "dtype": (lambda v: v in ("bfloat16", "auto"), "parameters are bf16 on GPU, fp32 on CPU"),
    "torch_dtype": (lambda v: v in ("bfloat16", "auto"), "parameters are bf16 on GPU, fp32 on CPU"),
    "trust_remote_code": (lambda v: v is False, "models with custom code are not loaded (no trust_remote_code)"),
    "use_peft": (lambda v: v is False, REFUSED["use_peft"]),
}


@functools.cache
def _training_argument_names() -> frozenset[str]:
    try:
        import dataclasses

        from transformers import TrainingArguments

        return frozenset(f.name for f in dataclasses.fields(TrainingArguments))
    except Exception:  # noqa: BLE001 - without transformers, only the listed keys are known
        return frozenset()


def known_keys() -> set[str]:
    """The TRL/transformers names this module maps (for "did you mean" hints)."""
    return set(RENAMES) | _EXTRA


def is_hf_key(name: str) -> bool:
    return name in RENAMES or name in REFUSED or name in REFUSED_VALUES or name in _EXTRA or \
        name in _training_argument_names()


# names both trainers use, read with transformers' rules (a float warmup_steps below 1 is a ratio, report_to a list)
SHARED_SEMANTICS = {"warmup_steps", "warmup_ratio", "report_to"}
_EXTRA = {"num_train_epochs", "max_steps", "warmup_steps", "warmup_ratio", "lr_scheduler_type", "output_dir",
          "report_to", "gradient_accumulation_steps", "lr_scheduler_kwargs", "completion_only_loss", "assistant_only_loss"}


def translate(values: Mapping[str, Any], source: str,
              ours: set[str]) -> tuple[dict[str, Any], dict[str, Any], list[str], dict[str, Any]]:
    """YAML keys as (our keys, TRL/transformers keys translated to ours, problems, the TRL/transformers
    keys as given); unknown keys are left to the caller."""
    own: dict[str, Any] = {}
    mapped: dict[str, Any] = {}
    problems: list[str] = []
    hf = {k: v for k, v in values.items() if (k not in ours or k in SHARED_SEMANTICS) and is_hf_key(k)}

    def refuse(key: str, why: str) -> None:
        problems.append(f"{source} key {key!r} = {values[key]!r}: not applicable here: {why}")

    for key, value in values.items():
        if key in ours and key not in hf:
            own[key] = value
    for key, value in hf.items():
        if key in REFUSED_VALUES:
            ok, why = REFUSED_VALUES[key]
            if not ok(value):
                refuse(key, why)
        elif key in RENAMES:
            mapped[RENAMES[key]] = value
        elif key in REFUSED:
            refuse(key, REFUSED[key])
        elif key not in _EXTRA:
            refuse(key, "a transformers TrainingArguments option with no counterpart in this trainer")
    _epochs_and_steps(hf, mapped, refuse)
    _warmup(hf, mapped, refuse)
    _schedule(hf, mapped, refuse)
    _loss_mask(hf, mapped, refuse)
    if "output_dir" in hf:
        mapped["out"] = hf["output_dir"]
    if "report_to" in hf:
        mapped["report_to"] = hf["report_to"]
    for key in set(own) & set(mapped):
        problems.append(f"{source}: both {key!r} and its TRL/transformers name are given; keep one")
    if "gradient_accumulation_steps" in hf:
        gas = hf["gradient_accumulation_steps"]
        if isinstance(gas, bool) or not isinstance(gas, int) or gas < 1:
            refuse("gradient_accumulation_steps", "must be a whole number, at least 1")
        elif "per_device_train_batch_size" not in hf:
            mapped["micro_batch_size"] = HF_DEFAULT_MICRO_BATCH
    return own, mapped, problems, hf


def _epochs_and_steps(hf: dict, mapped: dict, refuse) -> None:
    steps = hf.get("max_steps")
    if steps is not None and steps != -1:
        mapped["steps"] = steps
    epochs = hf.get("num_train_epochs")
    if epochs is not None and "steps" not in mapped:  # transformers: max_steps > 0 overrides num_train_epochs
        if isinstance(epochs, (int, float)) and not isinstance(epochs, bool) and float(epochs).is_integer():
            mapped["epochs"] = int(epochs)
        else:
            refuse("num_train_epochs", "only whole epochs are supported; use max_steps for a partial epoch")


def _warmup(hf: dict, mapped: dict, refuse) -> None:
    steps, ratio = hf.get("warmup_steps"), hf.get("warmup_ratio")
    if isinstance(steps, float) and 0 < steps < 1:  # transformers 5: a float below 1 is a ratio
        steps, ratio = None, steps if ratio is None else ratio
    if steps:  # transformers: warmup_steps > 0 wins over warmup_ratio
        mapped["warmup_steps"] = steps
    elif ratio is not None:
        mapped["warmup_ratio"] = ratio
    elif steps == 0:
        mapped["warmup_steps"] = 0


def _schedule(hf: dict, mapped: dict, refuse) -> None:
    name = hf.get("lr_scheduler_type")
    if "lr_scheduler_kwargs" in hf and name != "cosine_with_min_lr":
        refuse("lr_scheduler_kwargs", "only cosine_with_min_lr's min_lr_rate is understood (or use min_lr_ratio)")
    if name is None:
        return
    if name not in SCHEDULES:
        refuse("lr_scheduler_type", f"supported: {', '.join(SCHEDULES)} (cosine/linear decay to 0, or to "
                                    f"min_lr_ratio x the learning rate)")
        return
    if name == "constant" and (mapped.get("warmup_steps") or mapped.get("warmup_ratio")):
        refuse("lr_scheduler_type", "transformers' 'constant' ignores the warm-up; use constant_with_warmup, "
                                    "or remove the warm-up")
        return
    mapped["schedule"] = SCHEDULES[name]
    kwargs = hf.get("lr_scheduler_kwargs") or {}
    if name == "cosine_with_min_lr":
        rate = kwargs.get("min_lr_rate") if isinstance(kwargs, dict) else None
        if rate is None:
            refuse("lr_scheduler_type", "cosine_with_min_lr needs lr_scheduler_kwargs: {min_lr_rate: R} "
                                        "(the final learning rate as a fraction of learning_rate)")
        else:
            mapped["min_lr_ratio"] = rate


def _loss_mask(hf: dict, mapped: dict, refuse) -> None:
    assistant, completion = hf.get("assistant_only_loss"), hf.get("completion_only_loss")
    if assistant is True:
        mapped["train_on"] = "completion"
    elif completion is False:
        mapped["train_on"] = "all"
    elif assistant is False and "assistant_only_loss" in hf and completion is not True:
        refuse("assistant_only_loss", "TRL trains messages records on every token unless assistant_only_loss is "
                                      "true, but prompt/completion records on the completion; this trainer applies "
                                      "one rule: use train_on: completion (assistant and completion tokens) or "
                                      "train_on: all")
    elif completion is True:
        mapped["train_on"] = "completion"


def global_batch(values: Mapping[str, Any], hf: Mapping[str, Any]) -> int | None:
    """transformers' global batch (per device x accumulation x workers) when the YAML gives those keys."""
    if "per_device_train_batch_size" not in hf and "gradient_accumulation_steps" not in hf:
        return None
    micro = values.get("micro_batch_size", HF_DEFAULT_MICRO_BATCH)
    workers = values.get("num_workers")
    gas = hf.get("gradient_accumulation_steps", 1)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (micro, workers, gas)):
        return None
    return micro * gas * workers


def warmup_steps_for(warmup_steps: int, warmup_ratio: float, total: int) -> int:
    """transformers' rule: explicit steps, else ceil(ratio x total steps)."""
    return warmup_steps if warmup_steps else math.ceil(total * warmup_ratio)
