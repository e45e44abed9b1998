"""Memory fitting: the micro-batch that fits, and activation checkpointing when memory forces it.

`--micro-batch-size auto` takes the largest divisor of a rank's sequences per step that fits:
measured on a GPU (forward/backward probes of 1 and 2 sequences), estimated on a CPU from the
model shape and the host memory its ranks share. When not even one sequence fits, activation
checkpointing is turned on and the fit found again. Every rank takes the smallest answer.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from facts.errors import UserError
from trainer.config.flags import TrainConfig
from trainer.loop.parallel import Collectives, WorkerEnv
from trainer.loop.step import DEFAULT_LOSS, IGNORE_INDEX, loss_index, loss_path, resolve_loss, token_loss_sum
from trainer.model import footprint
from trainer.model.build import enable_activation_checkpointing

log = logging.getLogger("trainer")


def fit_micro_batch(rows: int, *, fixed_bytes: float, per_row_bytes: float, budget_bytes: float) -> int:
    """Largest divisor of `rows` (a rank's sequences per step) whose memory fits the budget; at least 1."""
    fits = [d for d in range(1, rows + 1) if rows % d == 0 and fixed_bytes + d * per_row_bytes <= budget_bytes]
    return max(fits, default=1)


def available_host_bytes() -> float:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


def activation_bytes_per_row(config, seq_len: int, dtype_bytes: int = 4, checkpointed: bool = False) -> float:
    """Rough activation memory one sequence keeps for backward (CPU, where nothing can be measured).

    With activation checkpointing only each layer's input is kept, plus one layer's
    activations while it is recomputed.
    """
    d, ff, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    heads = config.num_attention_heads
    per_token_layer = 16 * d + 4 * ff + heads * seq_len  # projections, norms, MLP, attention probabilities
    per_token = layers * d + per_token_layer if checkpointed else layers * per_token_layer
    return float(seq_len * per_token * dtype_bytes)


def probe_peak(model, rows: int, seq_len: int, device: torch.device, impl: str) -> float:
    """Peak extra device memory of one forward/backward of `rows` random sequences (no optimizer step)."""
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (rows, seq_len), device=device)
    pos = torch.arange(seq_len, device=device).expand(rows, seq_len)
    labels = torch.roll(ids, -1, 1)
    labels[:, -1] = IGNORE_INDEX
    batch = {"input_ids": ids, "position_ids": pos, "labels": labels}
    if impl != "plain":
        batch["loss_index"] = loss_index(labels.cpu()).to(device)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    token_loss_sum(model, batch, impl).backward()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    model.zero_grad(set_to_none=True)
    return float(peak)


def measure_row_memory(probe: Callable[[int], float], *, budget: float, states: float,
                       agree: Callable[[bool], bool] = lambda ok: ok) -> tuple[float, float]:
    """(fixed, per-sequence) bytes from probe passes of 1 and, when it is safe, 2 sequences.

    The 2-sequence pass runs only when the first says it fits with room to spare, on every
    rank (`agree`: the passes are collectives, so all ranks must run the same ones); a long
    sequence on a small GPU would otherwise run out of memory in the probe itself. Without
    it the whole 1-sequence peak counts per sequence: an overestimate, so the choice stays safe.
    """
    one = probe(1)
    if agree(2 * one + states <= budget):
        two = probe(2)
        return max(2 * one - two, 0.0), max(two - one, 1.0)
    return 0.0, max(one, 1.0)


def choose_micro_batch(model, optimizer: torch.optim.Optimizer, *, rows: int, seq_len: int, device: torch.device,
                       collectives: Collectives, loss: str = DEFAULT_LOSS, headroom: float = 0.9,
                       ranks_per_host: int = 1) -> dict:
    """The largest micro-batch (a divisor of this rank's rows per step) that fits in free memory.

    On a GPU it is measured: one forward/backward of 1 and of 2 sequences gives the fixed
    and the per-sequence peak (measure_row_memory); optimizer states not created yet (2 fp32 copies of this
    rank's shard for AdamW) are added. On a CPU it is estimated from the model shape and
    the host's available memory, split evenly between the `ranks_per_host` ranks that
    share it (each GPU has its own memory). Every rank takes the smallest answer; `fits`
    is false when not even one sequence fits.
    """
    if ranks_per_host < 1:
        raise ValueError(f"ranks_per_host = {ranks_per_host}: must be at least 1 (the ranks sharing this host)")
    impl = loss_path(model, resolve_loss(loss, device))  # the loop checks it first (check_loss_path)
    checkpointed = bool(getattr(model, "is_gradient_checkpointing", False))
    local_params = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters()
                       if p.requires_grad)  # only what trains gets optimizer state (LoRA: the adapters)
    states = 0 if optimizer.state else 8 * local_params
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = (free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)) * headroom
        try:
            fixed, per_row = measure_row_memory(lambda n: probe_peak(model, n, seq_len, device, impl),
                                                budget=budget, states=states,
                                                agree=lambda ok: bool(collectives.min([int(ok)], device)[0]))
        except torch.cuda.OutOfMemoryError:
            # Not even one sequence fits: the caller turns activation checkpointing on and probes again.
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            fixed, per_row = 0.0, budget + 1.0  # more than the whole budget: `fits` is false
        source = "measured"
    else:
        per_row = activation_bytes_per_row(model.config, seq_len, checkpointed=checkpointed)
        fixed, budget, source = 0.0, available_host_bytes() * headroom / ranks_per_host, "estimated"
    chosen = fit_micro_batch(rows, fixed_bytes=fixed + states, per_row_bytes=per_row, budget_bytes=budget)
    chosen, fits = collectives.min([chosen, int(fixed + states + per_row <= budget)], device)
    return {"micro_batch_size": chosen, "fits": bool(fits), "activation_checkpointing": checkpointed,
            "per_row_gib": per_row / 2**30, "fixed_gib": (fixed + states) / 2**30,
            "budget_gib": budget / 2**30, "source": source, "ranks_per_host": ranks_per_host}


class MemoryFitError(UserError):
    """Not one sequence fits in GPU memory, even with activation checkpointing: the same on every retry (exit 2)."""


def fit_with_checkpointing(choose: Callable[[], dict], enable: Callable[[], None], *, seq_len: int,
                           plan: Callable[[], str] = lambda: "") -> dict:
    """The fit (`choose`), again with activation checkpointing turned on (`enable`) when not one sequence fits.

    A GPU fit that fails with checkpointing on as well is a MemoryFitError with the numbers, never
    retried: a run that does not fit does not fit on the next attempt either. A CPU fit is an
    estimate, so it only warns (the host may swap rather than fail).
    """
    fit = choose()
    if not fit["fits"] and not fit["activation_checkpointing"]:
        needed = fit["fixed_gib"] + fit["per_row_gib"]
        enable()
        fit = {**choose(), "activation_checkpointing_reason":
               f"one sequence needs {needed:.2f} GiB without it, the budget is {fit['budget_gib']:.2f} GiB"}
    if not fit["fits"] and fit["source"] == "measured":
        raise MemoryFitError(
            f"--seq-len {seq_len}: one sequence does not fit in GPU memory even with activation checkpointing "
            f"({fit['fixed_gib'] + fit['per_row_gib']:.2f} GiB measured or more, {fit['budget_gib']:.2f} GiB free "
            f"for it){plan()}; lower --seq-len, add GPUs to shard the model further, or plan the run first: "
            f"python -m trainer plan")
    return fit


def planned(cfg: TrainConfig, model: torch.nn.Module, env: WorkerEnv, micro_batch: int = 1,
            checkpointed: bool = True) -> dict | None:
    """What the memory plan (trainer.model.footprint) predicts for this rank: recorded beside the measured peak."""
    try:
        ranks = env.local_world_size if env.collectives.replicated else env.world_size
        f = footprint.footprint(footprint.census(model.config), cfg.method, ranks, seq_len=cfg.seq_len,
                                micro_batch=micro_batch, activation_checkpointing=checkpointed,
                                lora_rank=cfg.lora_rank, targets=cfg.lora_targets, offload=cfg.offload == "cpu")
    except Exception:  # noqa: BLE001 - an architecture the plan cannot read: the measured numbers alone
        return None
    return {"gib_per_gpu": round(f.peak_bytes / footprint.GIB, 3), "states_gib": round(f.states_bytes / footprint.GIB, 3),
            "activation_checkpointing": checkpointed, "micro_batch_size": micro_batch, "ranks": ranks}


def plan_note(cfg: TrainConfig, model: torch.nn.Module, env: WorkerEnv) -> str:
    """The plan's prediction, for the error that one sequence did not fit."""
    p = planned(cfg, model, env)
    if p is None:
        return ""
    return (f"; the plan predicts {p['gib_per_gpu']:.2f} GiB per GPU with checkpointing "
            f"({p['states_gib']:.2f} GiB of parameters, gradients and optimizer states)")


def resolve_micro_batch(cfg: TrainConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        env: WorkerEnv) -> dict:
    """The micro-batch this run uses and how it was found (recorded in the start/resume event).

    `auto`: the largest divisor of this rank's rows per step that fits, measured on a GPU and
    estimated on a CPU from the host memory shared by this host's ranks; every rank calls it
    (the probes and the minimum across ranks are collectives). When not even one sequence
    fits, activation checkpointing is turned on (memory forces it) and the fit found again.
    """
    if not cfg.micro_batch_auto:
        fit = {"micro_batch_size": int(cfg.micro_batch_size), "source": "configured"}
        if env.device.type == "cuda":  # the start event keeps the plan's prediction beside the measured peaks
            fit["plan"] = planned(cfg, model, env, fit["micro_batch_size"],
                                  bool(getattr(model, "is_gradient_checkpointing", False)))
        return fit

    def choose() -> dict:
        fit = choose_micro_batch(model, optimizer, rows=cfg.global_batch_size // env.world_size,
                                 seq_len=cfg.seq_len, device=env.device, collectives=env.collectives,
                                 ranks_per_host=env.local_world_size)
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in fit.items()}

    fit = fit_with_checkpointing(choose, lambda: enable_activation_checkpointing(model), seq_len=cfg.seq_len,
                                 plan=lambda: plan_note(cfg, model, env))
    if env.device.type == "cuda":  # the start event keeps the plan's prediction beside the measured peaks
        fit["plan"] = planned(cfg, model, env, fit["micro_batch_size"], fit["activation_checkpointing"])
    if fit.get("activation_checkpointing_reason") and env.rank == 0:
        log.warning("activation checkpointing turned on: %s", fit["activation_checkpointing_reason"])
    if env.rank == 0:
        log.info("micro-batch: %d sequences (auto, %s: %.4f GiB per sequence + %.4f GiB fixed, budget %.2f GiB "
                 "per rank, %d rank(s) on this host)", fit["micro_batch_size"], fit["source"], fit["per_row_gib"],
                 fit["fixed_gib"], fit["budget_gib"], fit["ranks_per_host"])
        if not fit["fits"]:
            log.warning("one sequence of %d tokens may not fit even with activation checkpointing (%.2f GiB "
                        "needed, %.2f GiB budget): lower --seq-len, or add workers to shard the model further",
                        cfg.seq_len, fit["fixed_gib"] + fit["per_row_gib"], fit["budget_gib"])
    return fit
