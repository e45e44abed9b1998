"""One optimizer step: micro-batches with gradient accumulation, loss on response tokens only.

The loss of a step is the mean over every response token of the *global* batch, not a
mean of per-micro-batch means: each micro-batch contributes sum(token losses) x
world_size / global_response_tokens, and FSDP's gradient reduction averages over ranks.
That makes a step with 1 worker x 4 micro-batches equal to 2 workers x 2 micro-batches.

Packed rows carry position ids that restart at 0 for every document and no attention
mask; transformers then derives a block-diagonal causal mask from the position ids
(sdpa/eager/flex) or uses variable-length kernels (flash attention), so attention never
crosses documents. Labels arrive already shifted (labels[t] is the target of token t).

Imports only torch: the benchmark runs this exact step without ray or datasets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F

IGNORE_INDEX = -100


@dataclass
class StepOutput:
    loss: torch.Tensor          # mean loss per response token over the global batch (0-dim, on device)
    grad_norm: torch.Tensor     # global gradient norm before clipping (0-dim, on device)
    lr: float
    real_tokens: int            # non-padding tokens this rank processed
    loss_tokens: int            # response tokens this rank processed


def to_device(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def token_loss_sum(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Sum of cross-entropy over the labelled tokens of one micro-batch (fp32).

    The one place that turns hidden states into a loss: swap in a fused linear
    cross-entropy here without touching the rest of the step.
    """
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    logits = out.logits
    return F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def _all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    micro_batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    device: torch.device,
    grad_clip: float = 1.0,
) -> StepOutput:
    """Forward/backward every micro-batch, clip, step optimizer and schedule; returns device tensors."""
    micro_batches = list(micro_batches)
    # Counted on the host copies, before the transfer, so the step never waits on the device.
    local_loss_tokens = sum(int((mb["labels"] != IGNORE_INDEX).sum()) for mb in micro_batches)
    real_tokens = sum(int(mb["real_tokens"].sum()) if "real_tokens" in mb else mb["input_ids"].numel()
                      for mb in micro_batches)
    micro_batches = [to_device(mb, device) for mb in micro_batches]
    world = _world_size()
    global_tokens = _all_reduce_sum(torch.tensor(float(local_loss_tokens), device=device))
    scale = world / global_tokens.clamp(min=1.0)

    loss_sum = torch.zeros((), device=device, dtype=torch.float32)
    for mb in micro_batches:
        mb_loss = token_loss_sum(model, mb)
        (mb_loss * scale).backward()
        loss_sum += mb_loss.detach()

    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = _local(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True))
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    loss = _all_reduce_sum(loss_sum) / global_tokens.clamp(min=1.0)
    return StepOutput(loss=loss, grad_norm=grad_norm.detach(), lr=lr,
                      real_tokens=real_tokens, loss_tokens=local_loss_tokens)


@torch.no_grad()
def document_losses(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """Per-document mean response-token loss of a packed micro-batch (documents split at position 0)."""
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    token_loss = F.cross_entropy(out.logits.float().flatten(0, 1), batch["labels"].flatten(),
                                 ignore_index=IGNORE_INDEX, reduction="none").view(batch["labels"].shape)
    losses = []
    for row in range(batch["input_ids"].shape[0]):
        pos = batch["position_ids"][row]
        starts = (pos == 0).nonzero().flatten().tolist() + [pos.numel()]
        for a, b in zip(starts[:-1], starts[1:]):
            mask = batch["labels"][row, a:b] != IGNORE_INDEX
            if mask.any():
                losses.append(token_loss[row, a:b][mask].mean())
    return losses
