"""The parts of a transformers causal LM that FSDP2 groups: decoder layers, embeddings, final norm, lm_head.

Found through what transformers itself exposes for the model (`_no_split_modules`, the pipeline
plan, `get_*_embeddings`), so a new architecture needs no list here.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from trainer.model.errors import UnsupportedArchitecture


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
