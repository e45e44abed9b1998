"""TRL SFTConfig / transformers TrainingArguments keys in a `--config` YAML, mapped to this trainer's.

A YAML written for `trl sft --config FILE` (or a TrainingArguments dump) works here: each
common key is translated to the setting with the same meaning, and each key that has no
counterpart is refused with the reason, so nothing is silently ignored. The global batch
follows transformers' arithmetic: per_device_train_batch_size x gradient_accumulation_steps
x workers, unless global_batch_size is given too (then the three must agree).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Mapping

from facts.errors import Problems
from trainer.config.flags import FLAGS, REPORT_TO

# keys read with their own rules below (units, precedence, lists); every other key a flag declares
# under `trl=` (trainer.config.flags) is a plain rename with the same meaning and unit
CONVERTED = frozenset({"use_peft", "lora_target_modules",
                       "num_train_epochs", "max_steps", "warmup_steps", "warmup_ratio", "lr_scheduler_type",
                       "output_dir", "report_to", "gradient_accumulation_steps", "lr_scheduler_kwargs",
                       "completion_only_loss", "assistant_only_loss"})
# key -> our field, from the declarations
RENAMES = {key: name for name, f in FLAGS.items() for key in f.trl if key not in CONVERTED}

SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant", "constant_with_warmup": "constant",
             "cosine_with_min_lr": "cosine"}
HF_DEFAULT_MICRO_BATCH = 8  # TrainingArguments.per_device_train_batch_size

# why each key has no counterpart (keys of TrainingArguments not listed get a generic reason)
_REFUSED_BY_REASON = {
    "training runs in bf16 on GPU (fp32 on CPU); fp16 is not supported": ("fp16",),
    "TF32 matmuls are not configurable here": ("tf32",),
    "the optimizer is AdamW (fused on GPU); other optimizers are not supported": ("optim",),
    "this trainer has no evaluation loop": ("eval_strategy", "evaluation_strategy", "eval_steps", "do_eval",
                                            "per_device_eval_batch_size", "eval_packing", "eval_dataset_name",
                                            "dataset_test_split"),
    "the exported model folder is not uploaded; push it yourself (huggingface-cli upload)": (
        "push_to_hub", "hub_model_id", "hub_strategy"),
    "metrics go to the run folder (metrics.jsonl, tensorboard/)": ("logging_dir",),
    "metrics are logged every log_every steps": ("logging_first_step",),
    "a run folder is never overwritten: resubmitting its name resumes it": ("overwrite_output_dir",),
    "resubmitting the same run name resumes from its last complete checkpoint": ("resume_from_checkpoint",),
    "sharding is FSDP2, set up by this trainer (--sharding)": ("deepspeed", "fsdp", "fsdp_config"),
    "Ray Train sets up the process group (NCCL on GPU, gloo on CPU)": ("ddp_backend", "local_rank"),
    "packed rows are memory-mapped; there is no DataLoader": ("dataloader_num_workers", "dataloader_pin_memory"),
    "tokenization runs once per node in the worker": ("dataset_num_proc",),
    "quantized training is not implemented yet (QLoRA is planned: `python -m trainer plan` shows what it needs per "
    "GPU); use use_peft: true without it": ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
                                            "use_bnb_nested_quant"),
    "kernels and compilation are chosen by this trainer": ("use_liger_kernel", "torch_compile"),
    "rows are always packed with per-document position ids": ("padding_free",),
    "packing is always best-fit decreasing, documents truncated to the sequence length": ("packing_strategy",),
    "documents are always truncated at the end (keep_start)": ("truncation_mode",),
    "packed rows are always shuffled per epoch with the seed": ("shuffle_dataset",),
    "datasets and models are prepared by this trainer": ("dataset_kwargs", "model_init_kwargs"),
    "the loss is the mean negative log-likelihood over trained tokens": ("loss_type",),
    "NEFTune is not supported": ("neftune_noise_alpha",),
    "label smoothing is not supported": ("label_smoothing_factor",),
    "rows are packed, not grouped by length": ("group_by_length",),
    "activation checkpointing is per decoder layer, not configurable": ("gradient_checkpointing_kwargs",),
    "checkpoints always hold model, optimizer and data position (needed to resume)": ("save_only_model",),
    "the exported model is always safetensors": ("save_safetensors",),
    "use --device cpu": ("use_cpu",),
}
REFUSED = {key: reason for reason, keys in _REFUSED_BY_REASON.items() for key in keys}
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

}


@functools.cache
def _training_argument_names() -> frozenset[str]:
    try:
        import dataclasses

        from transformers import TrainingArguments

        return frozenset(f.name for f in dataclasses.fields(TrainingArguments))
    except Exception:  # noqa: BLE001 - without transformers, only the listed keys are known
        return frozenset()


def training_arguments(cfg: Any, names: Iterable[str]) -> dict[str, Any]:
    """transformers TrainingArguments keywords carrying these settings' values, through each one's declared
    key (a plain rename: the same meaning and unit), e.g. for a baseline that must train like the config."""
    out = {}
    for name in names:
        keys = [key for key in FLAGS[name].trl if key in RENAMES]
        if not keys:
            raise ValueError(f"{name}: no TRL/transformers key of the same meaning and unit is declared for it "
                             f"(trainer.config.flags, trl=); translate it by hand")
        out[keys[0]] = getattr(cfg, name)
    return out


def known_keys() -> set[str]:
    """The TRL/transformers names this module maps (for "did you mean" hints)."""
    return set(RENAMES) | CONVERTED


def is_hf_key(name: str) -> bool:
    return name in RENAMES or name in REFUSED or name in REFUSED_VALUES or name in CONVERTED or \
        name in _training_argument_names()


# names both trainers use, read with transformers' rules (a float warmup_steps below 1 is a ratio, report_to and
# lora_target_modules a list)
SHARED_SEMANTICS = {"warmup_steps", "warmup_ratio", "report_to", "lora_target_modules"}


def translate(values: Mapping[str, Any], source: str, ours: set[str],
              problems: Problems) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """YAML keys as (our keys, TRL/transformers keys translated to ours, the TRL/transformers keys as
    given), each problem added to `problems`; unknown keys are left to the caller."""
    own: dict[str, Any] = {}
    mapped: dict[str, Any] = {}
    hf = {k: v for k, v in values.items() if (k not in ours or k in SHARED_SEMANTICS) and is_hf_key(k)}

    def refuse(key: str, why: str) -> None:
        problems.append(f"{source} key {key!r} = {values[key]!r}: not applicable here: {why}")

    for key, value in values.items():
        if key in ours and key not in hf:
            own[key] = value
    _renamed(hf, mapped, refuse)
    _epochs_and_steps(hf, mapped, refuse)
    _warmup(hf, mapped, refuse)
    _schedule(hf, mapped, refuse)
    _loss_mask(hf, mapped, refuse)
    _peft(hf, mapped, refuse)
    if "output_dir" in hf:
        mapped["out"] = hf["output_dir"]
    if "report_to" in hf:
        _report_to(hf["report_to"], mapped, refuse)
    for key in set(own) & set(mapped):
        problems.append(f"{source}: both {key!r} and its TRL/transformers name are given; keep one")
    _gradient_accumulation(hf, mapped, refuse)
    return own, mapped, hf


def _renamed(hf: dict, mapped: dict, refuse) -> None:
    """Each key by its table: a refused value, a rename, refused outright, converted later, or unknown here."""
    for key, value in hf.items():
        if key in REFUSED_VALUES:
            ok, why = REFUSED_VALUES[key]
            if not ok(value):
                refuse(key, why)
        elif key in RENAMES:
            mapped[RENAMES[key]] = value
        elif key in REFUSED:
            refuse(key, REFUSED[key])
        elif key not in CONVERTED:
            refuse(key, "a transformers TrainingArguments option with no counterpart in this trainer")


def _peft(hf: dict, mapped: dict, refuse) -> None:
    """TRL's use_peft (LoRA through peft) as --method, its lora_target_modules (a name, a list, all-linear) as text."""
    if "use_peft" in hf:
        if not isinstance(hf["use_peft"], bool):
            refuse("use_peft", "must be true or false")
        else:
            mapped["method"] = "lora" if hf["use_peft"] else "full"
    if "lora_target_modules" in hf:
        value = hf["lora_target_modules"]
        items = value if isinstance(value, list) else [value]
        if value is None:  # unset (a job's own YAML writes it so): every linear layer of the decoder layers
            mapped["lora_target_modules"] = None
        elif not items or not all(isinstance(v, str) for v in items):
            refuse("lora_target_modules", "expected a module name, a list of them, or all-linear")
        else:
            mapped["lora_target_modules"] = ",".join(items)


def _gradient_accumulation(hf: dict, mapped: dict, refuse) -> None:
    """Accumulation steps come from the batch sizes here; given without a micro batch, transformers' default one."""
    if "gradient_accumulation_steps" not in hf:
        return
    gas = hf["gradient_accumulation_steps"]
    if isinstance(gas, bool) or not isinstance(gas, int) or gas < 1:
        refuse("gradient_accumulation_steps", "must be a whole number, at least 1")
    elif "per_device_train_batch_size" not in hf:
        mapped["micro_batch_size"] = HF_DEFAULT_MICRO_BATCH


def _report_to(value: Any, mapped: dict, refuse) -> None:
    """transformers' report_to (a name, a list, "none"; "all" is ambiguous here) as --report-to text."""
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        refuse("report_to", f"expected a name or a list of names ({', '.join(REPORT_TO)}, none)")
    elif "all" in items:
        refuse("report_to", f"'all' means every installed integration in transformers; name the backends here: "
                            f"{', '.join(REPORT_TO)} or none")
    else:
        mapped["report_to"] = ",".join(items) if items else "none"


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
