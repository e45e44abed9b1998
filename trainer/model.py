"""Model setup: build on the meta device, shard with FSDP2 (trainer.parallel), load the shards of the folder
trainer.sources resolved.

No rank ever materialises the full model in host memory: every rank builds the model on
the meta device, shards it with fully_shard (one group per decoder layer, and the tied
embedding, final norm and lm_head together, which torch >= 2.13 requires for tied
weights), allocates only its own shard, and reads only its slices of the Hugging Face
safetensors files through torch.distributed.checkpoint's HuggingFaceStorageReader.

Imports torch and transformers only (no ray, no datasets): the benchmark reuses it.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from trainer.parallel import shard_model
from trainer.sources import ModelSourceError, no_weights, weight_files

log = logging.getLogger("trainer")
def mixed_precision(use_gpu: bool):
    """bf16 compute with fp32 gradient reduction on GPU; plain fp32 on CPU."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if use_gpu:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)


class UnsupportedArchitecture(ModelSourceError):
    """The model's class does not expose what sharding needs (decoder layers, embeddings, lm_head)."""


@dataclass(frozen=True)
class ModelParts:
    """The modules FSDP2 groups, found through what transformers exposes for the model."""

    decoder: nn.Module           # get_decoder(): the base model holding the layers
    layers: tuple[nn.Module, ...]  # classes named in _no_split_modules (what HF's own FSDP wrapping uses)
    embed: nn.Module             # get_input_embeddings()
    norm: nn.Module | None       # the stage after the layers in the base model's pipeline plan
    head: nn.Module              # get_output_embeddings()

    @property
    def tied(self) -> bool:
        return getattr(self.head, "weight", None) is not None and self.head.weight is getattr(self.embed, "weight", None)


def model_name(model: nn.Module) -> str:
    """The transformers class name, also once fully_shard has swapped in FSDP<Name>."""
    return type(model).__name__.removeprefix("FSDP")


def _class_names(module: nn.Module) -> set[str]:
    """The module's class and its bases: FSDP2 swaps in a subclass named FSDP<Name>."""
    return {c.__name__ for c in type(module).__mro__}


def _pipeline_stages(decoder: nn.Module) -> list[str]:
    plan = getattr(decoder, "_pp_plan", None) or getattr(getattr(decoder, "config", None), "base_model_pp_plan", None)
    return list(plan or {})


def model_parts(model: nn.Module) -> ModelParts:
    """Decoder layers, embeddings, final norm and lm_head of a transformers causal LM.

    Layers are the modules whose class is in `_no_split_modules` (else the ModuleList of the
    base model's pipeline plan); the final norm is the stage after the layers in that plan
    (else a direct child of the base model whose class name has "Norm", transformers' own
    test in `_init_weights`); without one it stays in the root FSDP group. Raises
    UnsupportedArchitecture naming what is missing.
    """
    name = model_name(model)
    missing = []
    try:
        embed = model.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        embed = None
    if embed is None or getattr(embed, "weight", None) is None:
        missing.append("input embeddings (get_input_embeddings() gives no module with a weight)")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "weight", None) is None:
        missing.append("an lm_head (get_output_embeddings() gives no module with a weight)")
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    no_split = set(getattr(model, "_no_split_modules", None) or ())
    layers: list[nn.Module] = []
    if no_split:
        inside: set[int] = set()
        for module in decoder.modules():
            if id(module) in inside:
                continue
            if _class_names(module) & no_split:
                layers.append(module)
                inside.update(id(m) for m in module.modules())
    if not layers:
        lists = [getattr(decoder, s, None) for s in _pipeline_stages(decoder)]
        layers = next((list(m) for m in lists if isinstance(m, nn.ModuleList) and len(m)), [])
    if not layers:
        missing.append(f"decoder layers (no module of {type(decoder).__name__} is of a class in _no_split_modules "
                       f"{sorted(no_split) or '(empty)'}, and its pipeline plan names no layer list)")
    if missing:
        raise UnsupportedArchitecture(f"{name} ({getattr(model.config, 'model_type', '?')}) cannot be sharded by "
                                      f"the trainer: it has no {'; no '.join(missing)}. Use a causal LM whose "
                                      f"transformers class exposes them (Llama, Qwen, Mistral, Gemma, Phi-3, "
                                      f"GPT-NeoX, Mixtral, ...)")
    norm = _final_norm(decoder, layers, embed)
    return ModelParts(decoder, tuple(layers), embed, norm, head)


def _final_norm(decoder: nn.Module, layers: list[nn.Module], embed: nn.Module) -> nn.Module | None:
    stages = _pipeline_stages(decoder)
    layer_ids = {id(m) for m in layers}
    after = []
    for i, stage in enumerate(stages):
        module = getattr(decoder, stage, None)
        if isinstance(module, nn.ModuleList) and any(id(m) in layer_ids for m in module):
            after = [getattr(decoder, s, None) for s in stages[i + 1:]]
    candidates = [m for m in after if isinstance(m, nn.Module) and any(True for _ in m.parameters())]
    if not candidates:
        candidates = [m for m in decoder.children() if any("Norm" in n for n in _class_names(m))
                      and id(m) not in layer_ids and m is not embed]
    return candidates[-1] if candidates else None


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


def has_weights(path: str | Path) -> bool:
    return bool(weight_files(path))


def initialise_unloaded(model: nn.Module, seed: int) -> None:
    """What from_pretrained does after loading: the model's own `_init_weights` for every module.

    Loaded tensors carry transformers' `_is_hf_initialized` flag, which its init functions
    respect, so this sets only what no checkpoint holds: non-persistent buffers (RoPE
    frequencies per layer type, Gemma's embedding scale) and missing weights.
    """
    torch.manual_seed(seed)
    with torch.no_grad():
        model.initialize_weights()


def load_weights(model: nn.Module, path: str | Path) -> dict:
    """Read this rank's slices of the checkpoint into the sharded parameters (trainer.weights)."""
    from trainer.weights import load_sharded

    return load_sharded(model, Path(path))


@functools.lru_cache(maxsize=None)
def liger_kernels_available() -> bool:
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or no working Triton
        return False
    return True


def apply_liger_kernels(model: nn.Module) -> bool:
    """Liger's fused RMSNorm, SwiGLU and RoPE kernels on this model instance (not its loss: see trainer.losses)."""
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
) -> nn.Module:
    """A sharded, weight-loaded causal LM ready to train; `random_init`: the config's initialisation instead
    (a folder without weights is an error otherwise: trainer.sources.check_weights).

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
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    if compile:
        compile_layers(model)
    shard_model(model, mixed_precision(use_gpu), mesh=mesh)
    model.to_empty(device=device)
    if not random_init:
        if not has_weights(path):
            raise no_weights(str(path))
        load_weights(model, path)
    initialise_unloaded(model, seed)
    model.train()
    return model


# ---------------------------------------------------------------- sharding plan
