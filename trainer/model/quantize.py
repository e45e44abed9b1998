"""QLoRA's frozen base: the decoder layers' linear weights stored as torchao's NF4 tensor, sharded by FSDP2.

torchao's NF4Tensor implements FSDP2's all-gather extension (fsdp_pre_all_gather / fsdp_post_all_gather: the
4-bit codes and int8 block scales are gathered, never a dequantized weight) and its F.linear dequantizes on
the fly, so peft's LoRA layer runs unchanged on top of an nn.Linear whose weight is NF4 (no bitsandbytes,
whose 4-bit weights FSDP2 shards wrongly). The weights become NF4 on the meta device before fully_shard
(`quantize_blocks`), and each is quantized as it loads (`load_full`): the whole tensor, one at a time, is
quantized on its rank and only this rank's rows kept. That is torchtune's order, and it makes the shards
exactly the unsharded `to_nf4` result, whose scale statistics (the block maxima's mean) span the tensor.

NF4 needs 64-element blocks whose scales are quantized in groups (`scaler_block_size`, 256 as in torchao),
and FSDP2's row shards must hold whole groups; a tensor too small for 256 uses the largest power of two that
divides its share (only tiny test shapes do). Imports torch, and torchao only where a weight is made NF4.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from trainer.model.parts import model_parts
from trainer.model.sharding import shard_index

BLOCK = 64
SCALER_BLOCK = 256
_NF4_MODULE = "torchao.quantization.quantize_.workflows.nf4.nf4_tensor"
_SHARDED = ("quantized_scalers", "quantization_factor", "quantized_data")


def is_nf4(t: torch.Tensor) -> bool:
    """Without importing torchao (slow, and optional for a full fine-tune): nothing is NF4 before it is loaded."""
    module = sys.modules.get(_NF4_MODULE)
    return module is not None and isinstance(getattr(t, "_local_tensor", t), module.NF4Tensor)


def block_sizes(shape: tuple[int, ...], ranks: int) -> tuple[int, int] | None:
    """(block_size, scaler_block_size) that shard evenly into `ranks` row chunks; None when none does."""
    if len(shape) != 2 or shape[0] % ranks:
        return None
    share = shape[0] // ranks * shape[1]
    if share % BLOCK:
        return None
    blocks = share // BLOCK
    scaler = SCALER_BLOCK
    while scaler > 1 and blocks % scaler:
        scaler //= 2
    return (BLOCK, scaler) if blocks % scaler == 0 and blocks >= scaler else None


def block_linear_weights(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """Every nn.Linear of the decoder layers (a LoRA layer's base_layer included), by module name."""
    out = []
    for i, layer in enumerate(model_parts(model).layers):
        out += [(f"{i}.{name}", m) for name, m in layer.named_modules() if type(m) is nn.Linear
                and ".lora_" not in f".{name}"]
    return out


def quantizable(model: nn.Module, ranks: int) -> list[str]:
    return [name for name, m in block_linear_weights(model) if block_sizes(tuple(m.weight.shape), ranks)]


def check(config, ranks: int) -> list[str]:
    """The pre-flight: the block linears NF4 can store over `ranks`, on the meta device; ValueError when none."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = quantizable(model, ranks)
    if not names:
        raise ValueError(_none_error(model, ranks))
    return names


def _none_error(model: nn.Module, ranks: int) -> str:
    return (f"QLoRA: the decoder layers of {type(model).__name__} have no nn.Linear weight NF4 can store (2-D, rows "
            f"divisible by the {ranks} rank(s), a multiple of {BLOCK} elements per shard); use --method lora")


def quantize_blocks(model: nn.Module, ranks: int, dtype: torch.dtype) -> list[str]:
    """Replace each block linear's (frozen) weight by an NF4 tensor of its shape, on the model's (meta) device.

    Returns the quantized modules; ValueError when the blocks hold no linear weight NF4 can store."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    done = []
    for name, m in block_linear_weights(model):
        sizes = block_sizes(tuple(m.weight.shape), ranks)
        if sizes is None or m.weight.requires_grad:
            continue
        empty = torch.zeros(m.weight.shape, dtype=dtype, device=m.weight.device)
        m.weight = nn.Parameter(to_nf4(empty, *sizes), requires_grad=False)
        done.append(name)
    if not done:
        raise ValueError(_none_error(model, ranks))
    return done


def unsharded(model: nn.Module, ranks: int) -> set[nn.Parameter]:
    """The NF4 weights FSDP2 must leave alone: all of them on one rank, where its all-gather shortcut copies a
    parameter's first all-gather input only (torch 2.13's world-size-1 path), which an NF4 tensor has three of."""
    return {p for p in model.parameters() if is_nf4(p)} if ranks == 1 else set()


def local_nf4(param: torch.Tensor):
    """The NF4 object FSDP2 all-gathers from (its DTensor's local tensor itself: `to_local()` gives a copy)."""
    return getattr(param, "_local_tensor", param)


@torch.no_grad()
def load_full(param: torch.Tensor, full: torch.Tensor) -> None:
    """Quantize the whole weight `full` as torchao's to_nf4 does and keep this rank's rows in `param`."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    local = local_nf4(param)
    if tuple(full.shape) != tuple(param.shape):
        raise ValueError(f"shape {tuple(full.shape)} does not fit the NF4 weight of shape {tuple(param.shape)}")
    index, count = shard_index(param)
    device = local.quantized_data.device
    whole = to_nf4(full.to(device, local.dtype).contiguous(), local.block_size, local.scaler_block_size)
    chunk = torch.chunk(whole, count, dim=0)[index]
    for attr in _SHARDED:
        getattr(local, attr).copy_(getattr(chunk, attr))
    local.scaler_mean = chunk.scaler_mean.clone()  # not allocated by to_empty (torchao's empty_like keeps it meta)
    local.nf4 = chunk.nf4.clone()


@torch.no_grad()
def init_random(model: nn.Module, seed: int) -> None:
    """For the benchmark's random-init shapes (a run's --random-init is refused with qlora): each NF4 weight as
    transformers initialises a linear (normal, std = initializer_range), drawn whole from one seeded generator,
    quantized, and flagged so the model's own initialisation skips it."""
    config = model.config.get_text_config()
    std = getattr(config, "initializer_range", None) or 0.02
    generator = torch.Generator().manual_seed(seed)
    for _, p in sorted((n, p) for n, p in model.named_parameters() if is_nf4(p)):
        load_full(p, torch.randn(tuple(p.shape), generator=generator) * std)
        p._is_hf_initialized = True


@torch.no_grad()
def dequantized(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: every NF4 weight, unsharded and dequantized (each layer gathered in turn), by state-dict name."""
    out: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for layer in model_parts(model).layers:
        nf4 = [names[id(p)] for p in layer.parameters() if is_nf4(p)]
        if not nf4:
            continue
        if hasattr(layer, "unshard"):
            layer.unshard()
        prefix = next(n for n, m in model.named_modules() if m is layer)
        for name, p in layer.named_parameters():
            if f"{prefix}.{name}" in nf4:
                out[f"{prefix}.{name}"] = local_nf4(p).get_original_weight()
        if hasattr(layer, "reshard"):
            layer.reshard()
    return out
