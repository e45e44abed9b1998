"""Model setup: build on the meta device, shard with FSDP2 (trainer.model.sharding), load the shards of the
folder trainer.model.sources resolved.

No rank ever materialises the full model in host memory: every rank builds the model on
the meta device, shards it with fully_shard (one group per decoder layer, and the tied
embedding, final norm and lm_head together, which torch >= 2.13 requires for tied
weights), allocates only its own shard, and reads only its slices of the Hugging Face
weight files (trainer.model.weights).

Imports torch and transformers only (no ray, no datasets): the benchmark reuses it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path

import torch
from torch import nn

from trainer.model import adapters, quantize
from trainer.model.errors import UnsupportedArchitecture
from trainer.model.parts import ModelParts, model_parts
from trainer.model.sharding import mixed_precision, shard_model
from trainer.model.sources import no_weights, weight_files
from trainer.model.weights import load_sharded, remember_conversions, shard_rows, unloaded, unloaded_error

log = logging.getLogger("trainer")


def check_architecture(config) -> ModelParts:
    """Build the model on the meta device (no memory) and find its parts: the pre-flight check."""
    from transformers import AutoModelForCausalLM

    model_type = getattr(config, "model_type", "?")
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - whatever transformers raises, the user gets the config named
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        if "Unrecognized configuration class" in first:
            raise UnsupportedArchitecture(f"model_type {model_type!r}: transformers has no causal-LM class the "
                                          f"trainer can build for it ({first})") from None
        raise UnsupportedArchitecture(f"model_type {model_type!r}: transformers cannot build the model from this "
                                      f"config.json ({type(e).__name__}: {first}); fix the config") from None
    return model_parts(model)


def check_checkpoint(config, folder: str | Path) -> int:
    """Every tensor of the model maps to a key of the local checkpoint (headers only, on the meta device);
    ModelSourceError naming the counts and examples otherwise. Returns how many tensors it has."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    missing, total = unloaded(model, Path(folder))
    if missing:
        raise unloaded_error(model, Path(folder), missing, total)
    return total


def has_weights(path: str | Path) -> bool:
    return bool(weight_files(path))


def initialise_unloaded(model: nn.Module, seed: int) -> None:
    """What from_pretrained does after loading: the model's own `_init_weights` for every module.

    Loaded tensors carry transformers' `_is_hf_initialized` flag, which its init functions
    respect, so this sets only what no checkpoint holds: non-persistent buffers (RoPE
    frequencies per layer type, Gemma's embedding scale) and missing weights. On a sharded
    model each module's init runs on its whole parameters (trainer.model.build._whole_params).
    """
    from transformers import PreTrainedModel

    torch.manual_seed(seed)
    patched = [m for m in model.modules() if isinstance(m, PreTrainedModel)]
    for sub in patched:
        sub._init_weights = _whole_params(sub._init_weights)
    try:
        with torch.no_grad():
            model.initialize_weights()
    finally:
        for sub in patched:
            sub.__dict__.pop("_init_weights", None)


def _whole_params(init_weights):
    """A module's `_init_weights`; where it mixes a sharded parameter with plain tensors, run again on the
    module's whole parameters, keeping each shard's rows.

    transformers' init computes with the parameters as tensors (RWKV's `time_first * log(0.3) + zigzag`,
    Mamba's `copy_(A_log, log(arange))` on its mixer's children), which a DTensor refuses. Every rank
    walks the modules in the same order and fails alike, so the all-gathers match; only that module's
    parameters are whole at a time."""
    def run(module: nn.Module) -> None:
        try:
            return init_weights(module)
        except (RuntimeError, NotImplementedError):  # DTensor: "mixed torch.Tensor and DTensor", "no sharding strategy"
            sharded = [(owner, n, p) for owner in module.modules() for n, p in owner._parameters.items()
                       if p is not None and hasattr(p, "to_local")]
            if not sharded:
                raise
        for owner, n, p in sharded:
            whole = nn.Parameter(p.full_tensor().detach(), requires_grad=p.requires_grad)
            if getattr(p, "_is_hf_initialized", False):
                whole._is_hf_initialized = True
            owner._parameters[n] = whole
        try:
            init_weights(module)
        finally:
            for owner, n, p in sharded:
                whole = owner._parameters[n]
                owner._parameters[n] = p
                if not getattr(p, "_is_hf_initialized", False):
                    rows, _ = shard_rows(p)
                    p.to_local().copy_(whole.detach()[rows] if rows is not None else whole.detach())
    return run


def buffers_to(model: nn.Module, device: torch.device) -> None:
    """Every buffer (empty, still to be written) on `device`: with CPU offload only the parameters live on the host."""
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                module._buffers[name] = torch.empty_like(buf, device=device)


def shard_ranks(mesh) -> int:
    """How many ranks FSDP2 splits each parameter over: the mesh's last (shard) dimension, else the world."""
    if mesh is not None:
        return mesh.size(mesh.ndim - 1)
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def poison(model: nn.Module) -> None:
    """Every floating-point tensor NaN (this rank's shard): a tensor nothing writes is then seen, not trained.
    NF4 weights (QLoRA) are skipped: only loading gives them values, and a missing one is an error there."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if quantize.is_nf4(t):
                continue
            local = t.to_local() if hasattr(t, "to_local") else t
            if local.is_floating_point():
                local.fill_(float("nan"))


def check_written(model: nn.Module, random_init: bool) -> None:
    """No tensor left NaN by loading and initialisation; UnsupportedArchitecture naming them otherwise.

    A tensor the checkpoint wrote (the loader's `_is_hf_initialized`) holds the checkpoint's own values: a NaN
    there is the model's, which the first step reports as divergence."""
    unset = []
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if getattr(t, "_is_hf_initialized", False):
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        if local.is_floating_point() and local.numel() and bool(torch.isnan(local).any()):
            unset.append(name)
    if not unset:
        return
    what = ", ".join(unset[:6]) + (", ..." if len(unset) > 6 else "")
    if random_init:
        name = type(model).__name__.removeprefix("FSDP")
        raise UnsupportedArchitecture(f"--random-init: transformers' initialisation of {name} "
                                      f"leaves {len(unset)} tensor(s) unset ({what}); train from a checkpoint of "
                                      f"the model instead")
    raise UnsupportedArchitecture(f"{len(unset)} tensor(s) of {type(model).__name__.removeprefix('FSDP')} are in no "
                                  f"checkpoint and transformers' initialisation leaves them unset ({what})")


def _load_checked(model: nn.Module, path: str | Path) -> dict:
    if not has_weights(path):
        raise no_weights(str(path))
    return load_weights(model, path)


def load_weights(model: nn.Module, path: str | Path) -> dict:
    """Read this rank's slices of the checkpoint into the sharded parameters (trainer.model.weights)."""
    return load_sharded(model, Path(path))


@functools.lru_cache(maxsize=None)
def liger_kernels_available() -> bool:
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or no working Triton
        return False
    return True


def apply_liger_kernels(model: nn.Module) -> bool:
    """Liger's fused RMSNorm, SwiGLU and RoPE kernels on this model instance (not its loss: see trainer.model.losses)."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    before = {name: m.__dict__.get("forward") for name, m in model.named_modules()}
    _apply_liger_kernel_to_instance(model=model, rope=True, rms_norm=True, swiglu=True,
                                    fused_linear_cross_entropy=False, cross_entropy=False)
    return any(m.__dict__.get("forward") is not before.get(name) for name, m in model.named_modules())


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer in backward instead of keeping its activations.

    transformers' per-layer flag, read at call time, so it can also be turned on after
    sharding (when the micro-batch probe finds that memory forces it).
    """
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def compile_layers(model: nn.Module) -> None:
    """torch.compile each decoder layer's forward, leaving FSDP2's hooks (on the module call) eager.

    Compiling the module itself (`layer.compile()`) would trace the FSDP hooks too, which
    break the graph: that variant measured slower than eager on the H200.
    """
    import torch

    for layer in model_parts(model).layers:
        layer.forward = torch.compile(layer.forward)


def _adapt(model: nn.Module, lora: dict, *, qlora: bool, use_gpu: bool, mesh) -> None:
    """peft's LoRA layers on the meta model, sharded with their layer (trainer.model.adapters); with `qlora` the
    frozen linear weights of the blocks NF4 (trainer.model.quantize)."""
    frozen = torch.bfloat16 if use_gpu else None
    adapters.apply_lora(model, **{"frozen_dtype": frozen, **lora})
    if qlora:
        done = quantize.quantize_blocks(model, shard_ranks(mesh), frozen or torch.float32)
        total = len(quantize.block_linear_weights(model))
        if total > len(done) and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
            log.warning("QLoRA: %d of the %d linear weights of the decoder layers do not shard evenly in NF4 over "
                        "%d rank(s) and stay %s", total - len(done), total, shard_ranks(mesh), frozen or torch.float32)


def _load_base(model: nn.Module, path, *, lora: bool, qlora: bool, random_init: bool, seed: int) -> None:
    """The checkpoint's shards (under its own names with adapters on); random NF4 weights for a random qlora base."""
    if not random_init:
        with adapters.base_names(model) if lora else contextlib.nullcontext():
            _load_checked(model, path)
    elif qlora:
        quantize.init_random(model, seed)


def build_model(
    path: str | Path,
    *,
    device: torch.device,
    use_gpu: bool,
    attn_implementation: str = "sdpa",
    activation_checkpointing: bool = False,
    mesh=None,
    seed: int = 0,
    kernels: str = "auto",
    compile: bool = False,
    random_init: bool = False,
    lora: dict | None = None,
    qlora: bool = False,
    offload: bool = False,
) -> nn.Module:
    """A sharded, weight-loaded causal LM ready to train; `random_init`: the config's initialisation instead
    (a folder without weights is an error otherwise: trainer.model.sources.check_weights).

    `lora` (apply_lora's arguments): peft's LoRA adapters, the rest frozen (trainer.model.adapters); with
    `qlora` the decoder layers' frozen linear weights are NF4, quantized as they load (trainer.model.quantize).
    `offload`: FSDP2's CPU offload (trainer.model.sharding.shard_kwargs): the parameters materialise in host
    memory, the buffers (RoPE frequencies) on `device`, where the layers compute.
    `kernels`: "liger" patches Liger's RMSNorm/SwiGLU/RoPE kernels into the model, "auto"
    does so on GPU when liger-kernel is installed, "none" keeps transformers' modules.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if kernels not in ("auto", "liger", "none"):
        raise ValueError(f"kernels {kernels!r}: use auto, liger or none")
    if kernels == "liger" and not (use_gpu and liger_kernels_available()):
        raise ValueError("kernels 'liger' needs a GPU and the liger-kernel package; use 'none' or 'auto'")
    config = AutoConfig.from_pretrained(str(path))
    config.use_cache = False

    def on_meta() -> nn.Module:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation,
                                                    dtype=torch.float32)

    model = on_meta()
    if kernels == "liger" or (kernels == "auto" and use_gpu and liger_kernels_available()):
        try:
            model.liger_kernels = apply_liger_kernels(model)
        except Exception as e:
            if kernels == "liger":
                raise
            log.warning("Liger kernels not applied (%s: %s); using transformers' modules", type(e).__name__, e)
            model = on_meta()
    if lora:
        _adapt(model, lora, qlora=qlora, use_gpu=use_gpu, mesh=mesh)
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    if compile:
        compile_layers(model)
    remember_conversions(model)  # before fully_shard renames the classes transformers looks them up by
    shard_model(model, mixed_precision(use_gpu), mesh=mesh, ignored_params=quantize.unsharded(model, shard_ranks(mesh)),
                offload=offload)
    model.to_empty(device="cpu" if offload else device)
    if offload:
        buffers_to(model, device)
    poison(model)
    _load_base(model, path, lora=bool(lora), qlora=qlora, random_init=random_init, seed=seed)
    initialise_unloaded(model, seed)
    if lora:
        adapters.init_adapters(model, seed)
    check_written(model, random_init)
    model.train()
    return model

