"""FSDP2 sharding of a model's parts: one group per decoder layer, the embedding/norm/lm_head group, the root.

Tied embedding and lm_head are sharded together, which torch >= 2.13 requires for tied weights.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer.model.parts import model_parts


def mixed_precision(use_gpu: bool):
    """bf16 compute with fp32 gradient reduction on GPU; plain fp32 on CPU."""
    if use_gpu:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)


def shard_model(model: nn.Module, mp_policy, mesh=None) -> nn.Module:
    """fully_shard each decoder layer, the embedding/norm/lm_head group, then the root (everything else)."""
    parts = model_parts(model)
    for i, layer in enumerate(parts.layers):
        # The last layer is needed again right away by backward: keep it gathered.
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=i < len(parts.layers) - 1)
    tail = [m for m in (parts.norm, parts.head) if m is not None]
    if parts.tied:
        fully_shard([parts.embed, *tail], mesh=mesh, mp_policy=mp_policy)
    else:
        fully_shard(parts.embed, mesh=mesh, mp_policy=mp_policy)
        fully_shard(tail, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    return model
