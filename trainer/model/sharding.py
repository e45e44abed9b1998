"""FSDP2 sharding of a model's parts: one group per decoder layer, the embedding/norm/lm_head group, the root.

Tied embedding and lm_head are sharded together, which torch >= 2.13 requires for tied weights.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from trainer.model.parts import model_parts


def mixed_precision(use_gpu: bool):
    """bf16 compute with fp32 gradient reduction on GPU; plain fp32 on CPU."""
    if use_gpu:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)


def shard_kwargs(mp_policy, mesh=None, ignored_params: set | None = None, offload: bool = False) -> dict:
    """fully_shard's arguments for every group: `offload` is FSDP2's CPUOffloadPolicy (sharded parameters,
    gradients and optimizer states in pinned host memory, the optimizer step on the CPU)."""
    return {"mesh": mesh, "mp_policy": mp_policy,
            "offload_policy": CPUOffloadPolicy(pin_memory=True) if offload else OffloadPolicy(),
            **({"ignored_params": ignored_params} if ignored_params else {})}


def shard_model(model: nn.Module, mp_policy, mesh=None, ignored_params: set | None = None,
                offload: bool = False) -> nn.Module:
    """fully_shard each decoder layer, the embedding/norm/lm_head group, then the root (everything else);
    `ignored_params` stay outside FSDP2, whole on every rank; `offload`: shard_kwargs."""
    parts = model_parts(model)
    kw = shard_kwargs(mp_policy, mesh, ignored_params, offload)
    for i, layer in enumerate(parts.layers):
        # The last layer is needed again right away by backward: keep it gathered.
        fully_shard(layer, reshard_after_forward=i < len(parts.layers) - 1, **kw)
    tail = [m for m in (parts.norm, parts.head) if m is not None]
    if parts.tied:
        fully_shard([parts.embed, *tail], **kw)
    else:
        fully_shard(parts.embed, **kw)
        fully_shard(tail, **kw)
    fully_shard(model, **kw)
    keep_library_class(model)
    return model


def keep_library_class(model: nn.Module) -> None:
    """transformers still treats a sharded model as its own class, not as custom code.

    fully_shard swaps in a subclass FSDP<Name> defined in torch's module; transformers' `is_custom_code`
    (the class's module is not transformers') would then skip its key renaming on load and the part
    of its weight initialisation that trusts its own init functions. The answer stays the original class's.
    """
    for module in model.modules():
        cls = type(module)
        original = next((c for c in cls.__mro__[1:] if c.__name__ == cls.__name__.removeprefix("FSDP")), None)
        if original is None or original is cls or not hasattr(original, "is_custom_code"):
            continue
        if "is_custom_code" not in cls.__dict__:
            cls.is_custom_code = classmethod(lambda _cls, _original=original: _original.is_custom_code())


def shard_index(param: torch.Tensor) -> tuple[int, int]:
    """(this rank's chunk, how many) of a dim-0 sharded DTensor, on the mesh's shard dimension (hybrid sharding
    replicates over the other); (0, 1) for a plain tensor."""
    placements = getattr(param, "placements", None)
    if placements is None:
        return 0, 1
    from torch.distributed.tensor import Shard

    mesh = param.device_mesh
    dims = [d for d, p in enumerate(placements) if isinstance(p, Shard)]
    if not dims:
        return 0, 1
    return mesh.get_local_rank(dims[0]), mesh.size(dims[0])
