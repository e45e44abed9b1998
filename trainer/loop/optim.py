"""The optimizer and the learning-rate schedule, apart from model loading (the benchmark uses them too).

AdamW (--lr, --weight-decay, --adam-beta1/2, --adam-epsilon) with no decay on biases and norm
weights; a linear warm-up, then cosine, linear or constant to --min-lr-ratio of the peak. The
schedule is a LambdaLR, so its state is saved and restored with the checkpoint.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from trainer.config.flags import TrainConfig


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float, fused: bool,
                    betas: tuple[float, float] = (TrainConfig.adam_beta1, TrainConfig.adam_beta2),
                    eps: float = TrainConfig.adam_epsilon) -> torch.optim.Optimizer:
    """AdamW without decay on biases and norm weights; fused kernels on GPU (betas and epsilon: the
    declared defaults of --adam-beta1/2 and --adam-epsilon unless given)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if fused:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=True)


def lr_factor(step: int, *, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak LR at a step: linear warm-up, then cosine/linear decay to min_ratio."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * shape


def build_scheduler(optimizer: torch.optim.Optimizer, *, warmup: int, total: int, schedule: str,
                    min_ratio: float) -> torch.optim.lr_scheduler.LambdaLR:
    fn = partial(lr_factor, warmup=warmup, total=total, schedule=schedule, min_ratio=min_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def adamw_arguments(cfg: TrainConfig) -> dict:
    """build_optimizer's hyperparameters as a TrainConfig sets them (the benchmark steps with these too)."""
    return {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "betas": (cfg.adam_beta1, cfg.adam_beta2),
            "eps": cfg.adam_epsilon}


def for_run(model: nn.Module, cfg: TrainConfig,
            total_steps: int) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The optimizer and schedule a TrainConfig asks for, over `total_steps` steps."""
    # CPU offload: the states and the step are on the host (FSDP2's CPUOffloadPolicy), where foreach runs
    optimizer = build_optimizer(model, fused=cfg.use_gpu and cfg.offload != "cpu", **adamw_arguments(cfg))
    scheduler = build_scheduler(optimizer, warmup=cfg.warmup_for(total_steps), total=total_steps,
                                schedule=cfg.schedule, min_ratio=cfg.min_lr_ratio)
    return optimizer, scheduler
