"""LoRA adapters through peft, put on the meta-built model before FSDP2 shards it (trainer.model.build's hook).

peft wraps each targeted nn.Linear of the decoder layers in a LoRA layer (the original weight
becomes `<name>.base_layer.weight`, the adapters `<name>.lora_A.default.weight` and
`<name>.lora_B.default.weight`); everything but the adapters is frozen. Built on the meta device,
the adapters are sharded by FSDP2 with their layer (trainer.model.sharding), so only they carry
gradients and optimizer state. `base_names` shows the weight loader (trainer.model.weights) the
checkpoint's own names while it reads the base, and `init_adapters` then sets the adapters as peft
does (A: Kaiming-uniform, B: zeros, so the adapted model starts as the base), from one seeded full
tensor per matrix, so every world size starts from the same adapters.

`--method lora` (trainer.config.flags) turns it on; the export merges the adapters into the base
(`merged`, as peft's merge_and_unload) and writes them as a peft adapter folder (`peft_state`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
from torch import nn

from trainer.model.parts import model_parts
from trainer.model.sharding import shard_index

ADAPTER = "default"  # peft's adapter name


def block_linears(model: nn.Module) -> list[str]:
    """The module names (last part) of every nn.Linear in the decoder layers: TRL's `all-linear` of the blocks."""
    return sorted({name.rsplit(".", 1)[-1] for layer in model_parts(model).layers
                   for name, m in layer.named_modules() if isinstance(m, nn.Linear)})


def apply_lora(model: nn.Module, *, rank: int, alpha: float, dropout: float = 0.0,
               targets: tuple[str, ...] | None = None, frozen_dtype: torch.dtype | None = None) -> list[str]:
    """Inject peft's LoRA layers (on the model's device, the meta device in build) and freeze the rest, stored in
    `frozen_dtype` when given (bf16 on GPU: the base needs no fp32 master copy; the adapters stay fp32, and FSDP2
    asks a uniform dtype of the trained parameters only).

    Returns the targeted module names; ValueError when a target matches no linear of the blocks."""
    from peft import LoraConfig, inject_adapter_in_model

    linears = block_linears(model)
    chosen = list(targets) if targets else linears
    unknown = [t for t in chosen if t not in linears]
    if unknown or not chosen:
        raise ValueError(f"LoRA target modules {', '.join(unknown) or '(none)'} match no linear layer of the decoder "
                         f"layers; this model's are {', '.join(linears) or 'none'}")
    layers = len(model_parts(model).layers)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=chosen,
                        layers_to_transform=list(range(layers)))
    device = next(model.parameters()).device
    with torch.device(device):
        inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
        if frozen_dtype is not None and not p.requires_grad:
            p.data = p.data.to(frozen_dtype)
    return chosen


def adapter_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if ".lora_" in n}


@contextlib.contextmanager
def base_names(model: nn.Module) -> Iterator[None]:
    """While it lasts, the model's state_dict names the base weights as the checkpoint does, without adapters."""
    def hook(module, state, prefix, local_metadata):
        for key in [k for k in state if ".lora_" in k]:
            del state[key]
        for key in [k for k in state if ".base_layer." in k]:
            state[key.replace(".base_layer.", ".")] = state.pop(key)
        return state

    handle = model._register_state_dict_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _local_rows(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's rows of `full` as FSDP2 shards it (torch.chunk on the first dimension)."""
    if not hasattr(param, "to_local"):
        return full
    index, count = shard_index(param)
    pieces = full.chunk(count, dim=0)
    return pieces[index] if index < len(pieces) else full[:0]


def init_adapters(model: nn.Module, seed: int) -> None:
    """peft's initialisation (A Kaiming-uniform with a = sqrt(5), B zeros), each matrix from one seeded full
    tensor, its local rows copied: the same adapters for any number of ranks."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(adapter_parameters(model).items()):
            full = torch.zeros(p.shape, dtype=p.dtype)
            if ".lora_A." in name:
                bound = 1 / math.sqrt(p.shape[1])  # kaiming_uniform_(a=sqrt(5)): gain sqrt(1/3) x sqrt(3 / fan_in)
                full.uniform_(-bound, bound, generator=generator)
            local = p.to_local() if hasattr(p, "to_local") else p
            local.copy_(_local_rows(full, p))


def check_targets(config, targets: tuple[str, ...] | None) -> list[str]:
    """The pre-flight: the adapters' modules on the meta device; ValueError naming the model's linears otherwise."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return apply_lora(model, rank=1, alpha=1.0, targets=targets)


def scaling(lora: dict) -> float:
    return lora["alpha"] / lora["rank"]


def merged(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """The full state dict with each adapter merged into its base weight (W + scale x B @ A, as peft's
    merge_and_unload computes it) under the checkpoint's own names, adapters dropped."""
    out = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        if ".base_layer." in key:
            stem = key.split(".base_layer.")[0]
            a, b = state.get(f"{stem}.lora_A.{ADAPTER}.weight"), state.get(f"{stem}.lora_B.{ADAPTER}.weight")
            if a is not None and key.endswith(".weight"):
                value = value + (b @ a) * scale
            key = key.replace(".base_layer.", ".")
        out[key] = value
    return out


def peft_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters under the names peft's save_pretrained writes (PeftModel.from_pretrained reads them)."""
    return {"base_model.model." + k.replace(f".{ADAPTER}.", "."): v for k, v in state.items() if ".lora_" in k}


def peft_config(lora: dict, targets: list[str], source: str | None):
    from peft import LoraConfig

    return LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"], target_modules=targets,
                      task_type="CAUSAL_LM", base_model_name_or_path=source)
