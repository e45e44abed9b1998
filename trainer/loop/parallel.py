"""Parallelism across the workers: the sharding plan, the device mesh, the communication estimate, the EFA check.

Full sharding is a 1-D mesh over every rank; hybrid sharding a 2-D (replicate, shard) mesh,
sharded inside a node and replicated across nodes, nodes told apart by the ranks' hostnames.
`--sharding auto` weighs the communication estimate (bytes per collective over the instance
type's network, from facts.catalog) and takes whichever communicates less. The loop builds a
WorkerEnv once (`setup_parallel`) and hands it to the model (its mesh), the memory fit and the step
(its Collectives: what they reduce over, and whether gradients also cross replicas). FSDP2's groups of
the model are in trainer.model.sharding.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainer import efa
from trainer.config.flags import ConfigError, TrainConfig
from trainer.model import footprint
from trainer.model.flops import parameter_count
from trainer.model.sources import read_model_config

log = logging.getLogger("trainer")


def instance_network(instance_type: str) -> dict[str, Any]:
    """Network facts of a GPU instance type, from the instance catalog (facts.catalog, shipped with every job)."""
    from facts.catalog import GPU_TYPES

    if instance_type not in GPU_TYPES:
        raise ValueError(f"instance type {instance_type!r}: unknown; use one of {', '.join(sorted(GPU_TYPES))}")
    row = GPU_TYPES[instance_type]
    return {"instance_type": instance_type, "gpus_per_node": row.gpus, "network_gbps": row.network_gbps,
            "gpudirect_rdma": row.gpudirect_rdma, "nvlink": row.nvlink,
            "intra_node_gbytes_per_s": row.intra_node_gbytes_per_s}


def comm_estimate(params: int, *, nodes: int, gpus_per_node: int, network_gbps: float,
                  intra_node_gbytes_per_s: float, micro_batches: int, param_bytes: float = 2,
                  grad_bytes: float = 4) -> dict[str, dict[str, float]]:
    """Seconds of communication per optimizer step for full and hybrid sharding (ring model).

    Every micro-batch all-gathers the parameters twice (forward, backward) and
    reduce-scatters the gradients. A ring collective over N ranks moves (N-1)/N of the
    tensor over its slowest link; across nodes that link is the node's network, shared by
    its GPUs. Full sharding runs all of it over all N = nodes x GPUs. Hybrid sharding runs
    it inside each node and, once per step, all-reduces the gradient shards across nodes:
    2 (n-1)/n of the gradient bytes through each node's network. Lower bounds at line rate,
    without overlap with compute.
    """
    n_ranks = nodes * gpus_per_node
    net = network_gbps / 8 * 1e9
    intra = intra_node_gbytes_per_s * 1e9
    gather = params * param_bytes
    reduce = params * grad_bytes
    per_mb = 2 * gather + reduce
    link_full = net if nodes > 1 else intra
    full = micro_batches * per_mb * (n_ranks - 1) / n_ranks / link_full
    hybrid_intra = micro_batches * per_mb * (gpus_per_node - 1) / gpus_per_node / intra
    hybrid_inter = 2 * (nodes - 1) / nodes * reduce / net
    return {
        "full": {"seconds": full, "all_gather_bytes": gather, "reduce_scatter_bytes": reduce,
                 "bytes_over_network": micro_batches * per_mb * (n_ranks - 1) / n_ranks if nodes > 1 else 0.0},
        "hybrid": {"seconds": hybrid_intra + hybrid_inter, "all_gather_bytes": gather,
                   "reduce_scatter_bytes": reduce, "all_reduce_bytes": reduce,
                   "bytes_over_network": 2 * (nodes - 1) / nodes * reduce},
    }


def choose_sharding(estimate: dict[str, dict[str, float]], nodes: int) -> str:
    """`full` on one node (hybrid would be the same mesh); else whichever communicates less."""
    if nodes <= 1:
        return "full"
    return "hybrid" if estimate["hybrid"]["seconds"] <= estimate["full"]["seconds"] else "full"


def format_estimate(estimate: dict[str, dict[str, float]], *, nodes: int, gpus_per_node: int,
                    instance_type: str | None, network_gbps: float, chosen: str) -> str:
    gib = 2 ** 30
    f, h = estimate["full"], estimate["hybrid"]
    where = f"{nodes} node(s) x {gpus_per_node} GPU(s)" + (f" of {instance_type}" if instance_type else "")
    return (f"communication per step on {where}, {network_gbps:g} Gbps between nodes: "
            f"full sharding {f['seconds']:.2f} s ({f['bytes_over_network'] / gib:.1f} GiB over the network), "
            f"hybrid {h['seconds']:.2f} s ({h['bytes_over_network'] / gib:.1f} GiB); "
            f"all-gather {f['all_gather_bytes'] / gib:.2f} GiB, reduce-scatter {f['reduce_scatter_bytes'] / gib:.2f} GiB "
            f"per collective; using {chosen}")


@dataclass(frozen=True)
class ShardingPlan:
    """How the ranks shard the model: mesh shape and why."""

    kind: str                 # "full" or "hybrid"
    replicate: int            # model replicas (nodes, for hybrid)
    shard: int                # ranks each replica is sharded over
    nodes: int
    ranks_per_node: int
    reason: str

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return (self.replicate, self.shard) if self.kind == "hybrid" else (self.shard,)

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        return ("replicate", "shard") if self.kind == "hybrid" else ("fsdp",)


def plan_sharding(sharding: str, world_size: int, hosts: list[str], *, shard_size: int = 0,
                  instance_type: str | None = None, micro_batches: int = 1, params: int | None = None,
                  param_bytes: float = 2, grad_bytes: float = 4, node_fits: str | None = None) -> ShardingPlan:
    """Full sharding over every rank, or hybrid: shard inside a node, replicate across nodes.

    `hosts` is every rank's hostname (node count and ranks per node); `shard_size`
    overrides the ranks per shard group. `auto` takes hybrid only when the model, its
    gradients, optimizer state and activations fit in one shard group (`node_fits`: None when
    they do or nothing is known, else why not, from trainer.model.footprint) and then when the
    communication estimate for the instance type favours it, or on several nodes of an unknown
    type (only the gradient all-reduce then crosses the slower network).
    """
    if sharding not in ("auto", "full", "hybrid"):
        raise ValueError(f"sharding {sharding!r}: use auto, full or hybrid")
    per_host = Counter(hosts)
    nodes = len(per_host)
    even = len(set(per_host.values())) == 1
    ranks_per_node = world_size // nodes if even else 0
    group = _shard_group(sharding, world_size, per_host, shard_size, ranks_per_node if even else None)
    if sharding == "auto" and node_fits and nodes > 1 and not shard_size:
        kind, reason = "full", f"hybrid sharding would not fit: {node_fits}"
    elif sharding == "auto":
        kind, reason = _auto_sharding(nodes, group, shard_size=shard_size, instance_type=instance_type,
                                      micro_batches=micro_batches, params=params, param_bytes=param_bytes,
                                      grad_bytes=grad_bytes)
    else:
        kind, reason = sharding, f"--sharding {sharding}"
    if kind == "hybrid" and world_size // group == 1:
        kind, reason = "full", reason + "; one replica, so full sharding"
    if kind == "full":
        return ShardingPlan("full", 1, world_size, nodes, ranks_per_node, reason)
    return ShardingPlan("hybrid", world_size // group, group, nodes, ranks_per_node, reason)


def _shard_group(sharding: str, world_size: int, per_host: Counter, shard_size: int,
                 ranks_per_node: int | None) -> int:
    """Ranks per shard group: --shard-size, else a node's ranks (None: nodes differ), else every rank."""
    if shard_size:
        if world_size % shard_size:
            raise ValueError(f"shard size {shard_size} does not divide the {world_size} workers; "
                             f"use a divisor of {world_size}")
        return shard_size
    if ranks_per_node is not None:
        return ranks_per_node
    if sharding == "hybrid":
        raise ValueError(f"hybrid sharding needs the same number of workers on every node, got "
                         f"{dict(per_host)}; pass --shard-size or use --sharding full")
    return world_size


def _auto_sharding(nodes: int, group: int, *, shard_size: int, instance_type: str | None, micro_batches: int,
                   params: int | None, param_bytes: float, grad_bytes: float) -> tuple[str, str]:
    """What `auto` picks, and why: the communication estimate decides on several nodes of a known type."""
    if shard_size:
        return "hybrid", f"--shard-size {shard_size}"
    if nodes <= 1:
        return "full", "one node"
    if not instance_type:
        return "hybrid", f"{nodes} nodes of unknown instance type: only gradients cross nodes"
    net = instance_network(instance_type)
    est = comm_estimate(params or 10**9, nodes=nodes, gpus_per_node=group, network_gbps=net["network_gbps"],
                        intra_node_gbytes_per_s=net["intra_node_gbytes_per_s"],
                        micro_batches=micro_batches, param_bytes=param_bytes, grad_bytes=grad_bytes)
    kind = choose_sharding(est, nodes)
    reason = format_estimate(est, nodes=nodes, gpus_per_node=group, instance_type=instance_type,
                             network_gbps=net["network_gbps"], chosen=kind)
    return kind, reason + (" (seconds per 1B parameters)" if params is None else "")


@dataclass(frozen=True)
class Collectives:
    """The ranks the step and the memory fit reduce over (every rank of the job: the default process group).

    `replicated`: hybrid sharding, whose replicas also all-reduce gradients; the step defers that
    all-reduce to its last micro-batch. One process (ONE_PROCESS) runs no collective at all.
    """

    world_size: int = 1
    rank: int = 0
    replicated: bool = False

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over every rank, in place."""
        if self.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def min(self, values: list[int], device: torch.device) -> list[int]:
        """Each value's minimum over every rank: what all ranks agree on."""
        if self.world_size == 1:
            return values
        t = torch.tensor(values, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return [int(v) for v in t.tolist()]


ONE_PROCESS = Collectives()


@dataclass(frozen=True)
class WorkerEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: Any
    local_world_size: int = 1  # ranks on this rank's host (they share its memory)
    collectives: Collectives = ONE_PROCESS


def node_memory_problem(cfg: TrainConfig, model_config: Any, world_size: int, hosts: list) -> str | None:
    """Why one node's GPUs cannot hold a replica of this GPU run (trainer.model.footprint), or None.

    The run as configured: its sequence length and micro-batch (1 with auto, which also turns
    activation checkpointing on where needed, so it is counted on then); with --offload cpu the node's
    worker pod must hold its ranks' states too."""
    from facts.catalog import GPU_TYPES
    from facts.resources import worker_memory_gib

    nodes = len(set(hosts))
    if not cfg.use_gpu or cfg.instance_type not in GPU_TYPES or nodes < 2 or world_size % nodes:
        return None
    auto = cfg.micro_batch_auto
    row = GPU_TYPES[cfg.instance_type]
    return footprint.node_problem(footprint.census(model_config), cfg.method, world_size // nodes,
                                  row.gpu_memory_mib, worker_memory_gib(row), seq_len=cfg.seq_len,
                                  micro_batch=1 if auto else int(cfg.micro_batch_size),
                                  activation_checkpointing=auto or cfg.activation_checkpointing,
                                  lora_rank=cfg.lora_rank, targets=cfg.lora_targets, offload=cfg.offload == "cpu")


def setup_parallel(cfg: TrainConfig, rank: int, world_size: int, local_rank: int,
                   device: torch.device | None = None) -> WorkerEnv:
    """Device and FSDP mesh over the process group Ray Train created (NCCL on GPU, gloo on CPU).

    Full sharding: a 1-D mesh over every rank. Hybrid sharding: a 2-D (replicate, shard)
    mesh, sharded inside a node and replicated across nodes, nodes told apart by the
    ranks' hostnames (plan_sharding; --sharding auto weighs the estimate).
    """
    import socket

    from torch.distributed.device_mesh import init_device_mesh

    if cfg.use_gpu:
        device = device or torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    hosts: list = [None] * world_size
    if dist.is_initialized() and world_size > 1:
        dist.all_gather_object(hosts, socket.gethostname())
    else:
        hosts = [socket.gethostname()] * world_size
    params = node_fits = None
    if cfg.instance_type:  # only the communication estimate and the memory of a node's shard group need the model
        try:
            model_config = read_model_config(cfg.model, revision=cfg.model_revision)
            params = parameter_count(model_config)
            node_fits = node_memory_problem(cfg, model_config, world_size, hosts)
        except Exception:  # noqa: BLE001 - the estimate is then per 1B parameters
            pass
    # With --micro-batch-size auto the micro-batch is chosen only after the model is sharded, so the
    # estimate counts 1 micro-batch per step: the fewest, i.e. the least full-sharding traffic (hybrid
    # is then taken only where it wins even so).
    micro_batches = 1 if cfg.micro_batch_auto else cfg.grad_accum_steps
    try:
        plan = plan_sharding(cfg.sharding, world_size, hosts, shard_size=cfg.shard_size,
                             instance_type=cfg.instance_type, micro_batches=micro_batches, params=params,
                             param_bytes=2 if cfg.use_gpu else 4, node_fits=node_fits)
    except ValueError as e:  # the workers' placement does not fit the sharding asked for: a user error
        raise ConfigError([f"--sharding {cfg.sharding} / --shard-size {cfg.shard_size}: {e}"]) from None
    mesh = init_device_mesh(device.type, plan.mesh_shape, mesh_dim_names=plan.mesh_dim_names)
    if rank == 0:
        log.info("sharding: %s, mesh %s over %d node(s) (%s)", plan.kind,
                 " x ".join(f"{n}={k}" for n, k in zip(plan.mesh_dim_names, plan.mesh_shape, strict=True)), plan.nodes,
                 plan.reason)
    return WorkerEnv(rank, world_size, local_rank, device, mesh, local_world_size=hosts.count(hosts[rank]),
                     collectives=Collectives(world_size, rank, replicated=plan.kind == "hybrid"))


def transport_check(cfg: TrainConfig, env: WorkerEnv) -> None:
    """Hook after the first collectives: verifies the inter-node transport (NCCL over EFA).

    No-op on CPU/gloo. On GPUs every rank reads its own NCCL_DEBUG_FILE (set by
    `trainer submit`), the verdicts are gathered, rank 0 logs one line per node, and with
    EFA required (TRAINER_REQUIRE_EFA, by default when the job spans nodes) every rank
    raises if any rank fell back to TCP sockets, so the job fails in its first step.
    """
    if not cfg.use_gpu:
        return

    def gather(obj):
        everyone = [None] * env.world_size
        dist.all_gather_object(everyone, obj)
        return everyone

    report, required = efa.gather_report(gather)
    if env.rank == 0:
        for line in efa.verdict_lines(report) or ["EFA check: no NCCL transport lines (NCCL_DEBUG_FILE not set?)"]:
            log.info(line)
    efa.enforce_efa(report.ranks, required, missing=report.missing)
