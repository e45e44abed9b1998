"""The memory plan before the GPU hour: what each method needs per GPU on a target, and what it costs.

`python -m trainer plan` (trainer.submit.cli's plan_main, which also resolves --stack) and the pre-flight of
`train`, `local` and `submit` run the same pure function: the model's config (built on the meta
device, no weights read) and the instance catalog (facts.catalog: GPU memory, bf16 FLOP/s, network,
price) in; per method the bytes on the fullest GPU (trainer.model.footprint), whether they fit
BUDGET of its memory, the sharding `--sharding auto` would choose (trainer.loop.parallel, the
workers' own rule), and the step time: the larger of the compute at ASSUMED_MFU of the catalog's
peak and the communication estimate at line rate (FSDP2 overlaps the two), hence tokens/s and the
price per million trained tokens. With --offload cpu (FSDP2's CPUOffloadPolicy) the states are host memory:
a node's ranks together must fit HOST_BUDGET of the Ray worker pod's memory limit
(facts.resources.worker_memory_gib, what workloads.raycluster gives the worker group).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import dataclass
from typing import Any, Sequence

from facts.catalog import GPU_TYPES
from facts.errors import EXIT_OK, UserError
from facts.resources import GPU_ROOT_VOLUME_GIB, worker_cpus, worker_memory_gib
from trainer.data import sizing
from trainer.loop.parallel import comm_estimate, instance_network, plan_sharding
from trainer.model import footprint as fp
from trainer.model.flops import model_shape

BUDGET = fp.BUDGET   # of a GPU's memory: what the micro-batch probe allows itself too (trainer.loop.memory)
HOST_BUDGET = fp.HOST_BUDGET  # of the worker pod's memory limit for offloaded states
ASSUMED_MFU = 0.4    # of the catalog's dense bf16 peak; the H200 measured 46-58 % for the full fine-tune
GIB = fp.GIB
log = logging.getLogger("trainer")

# Shapes of the models the reference cluster is sized for, from their published config.json files.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-3.1-8b": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                   max_position_embeddings=131072, tie_word_embeddings=False, rope_theta=500000.0)),
    "qwen2.5-14b": ("qwen2", dict(vocab_size=152064, hidden_size=5120, intermediate_size=13824,
                                  num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8,
                                  max_position_embeddings=131072, tie_word_embeddings=False, rope_theta=1e6)),
    "qwen2.5-32b": ("qwen2", dict(vocab_size=152064, hidden_size=5120, intermediate_size=27648,
                                  num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
                                  max_position_embeddings=131072, tie_word_embeddings=False, rope_theta=1e6)),
    "llama-3.1-70b": ("llama", dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                                    num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                                    max_position_embeddings=131072, tie_word_embeddings=False, rope_theta=500000.0)),
}


class PlanError(UserError):
    """A target or model the plan cannot be made for, or a run that cannot fit (exit 2)."""


def shape_config(name: str):
    """A transformers config of a named shape (SHAPES)."""
    from transformers import AutoConfig

    if name not in SHAPES:
        raise PlanError(f"--model-shape {name!r}: unknown; use one of {', '.join(SHAPES)}")
    model_type, values = SHAPES[name]
    return AutoConfig.for_model(model_type, **values)


@dataclass(frozen=True)
class Target:
    instance_type: str
    nodes: int
    workers: int | None = None  # one per GPU; None: every GPU of the nodes
    disk_gib: int | None = None  # each node's root volume (the stack's pool); None: the default
    pool: str = "gpu"

    @property
    def row(self):
        return GPU_TYPES[self.instance_type]

    @property
    def gpus(self) -> int:
        return self.workers or self.nodes * self.row.gpus

    @property
    def hosts(self) -> list[str]:
        """Each worker's node, filled node by node (as Ray's placement packs them)."""
        return [f"node{i // self.row.gpus}" for i in range(self.gpus)]

    @property
    def budget_bytes(self) -> float:
        return fp.budget_bytes(self.row.gpu_memory_mib)

    @property
    def host_budget_bytes(self) -> float:
        """What offloaded states may fill of one node's worker pod (its memory limit, facts.resources)."""
        return fp.host_budget_bytes(worker_memory_gib(self.row))

    @property
    def cpus(self) -> int:
        """What the data preparation runs on: the Ray worker pods' CPUs (the head offers none)."""
        return self.nodes * worker_cpus(self.row)

    @property
    def ranks_per_node(self) -> int:
        return min(self.gpus, self.row.gpus)

    def check(self) -> None:
        if self.instance_type not in GPU_TYPES:
            raise PlanError(f"--instance-type {self.instance_type!r}: not in the instance catalog; use one of "
                            f"{', '.join(GPU_TYPES)}")
        if self.nodes < 1:
            raise PlanError(f"--nodes {self.nodes}: must be at least 1")


def step_flops(config: Any, method: str, seq_len: int, trainable: int, checkpointed: bool) -> float:
    """FLOPs per token of one training step: forward 2 per matmul weight (+ attention), backward twice that for
    a full fine-tune; a frozen base skips its weight gradients (the adapters' own are counted); activation
    checkpointing runs the forward once more."""
    shape = model_shape(config)
    attention = sum(width * min(seq_len, window or seq_len) for width, window in shape.attention)
    forward = 2.0 * shape.matmul_params + 4.0 * attention
    if method == "full":
        backward = 4.0 * shape.matmul_params + 8.0 * attention
    else:
        backward = 2.0 * shape.matmul_params + 8.0 * attention + 4.0 * trainable
        forward += 2.0 * trainable
    return forward + backward + (forward if checkpointed else 0.0)


def _entry(config: Any, census: fp.Census, method: str, target: Target, *, seq_len: int, global_batch: int,
           micro_batch: int, lora_rank: int, targets: tuple[str, ...] | None, checkpointing: bool | None,
           sharding: str, offload: bool = False) -> dict[str, Any]:
    """One method's row: bytes at full sharding with and without activation checkpointing, the choice, the time."""
    row, gpus = target.row, target.gpus
    kw = dict(seq_len=seq_len, micro_batch=micro_batch, lora_rank=lora_rank, targets=targets, offload=offload)

    def at(ranks: int, ac: bool) -> fp.Footprint:
        return fp.footprint(census, method, ranks, activation_checkpointing=ac, **kw)

    plain, ckpt = at(gpus, False), at(gpus, True)
    budget = target.budget_bytes
    ac = checkpointing if checkpointing is not None else plain.peak_bytes > budget
    chosen = ckpt if ac else plain
    node = at(row.gpus, ac)
    node_fits = fp.node_problem(census, method, row.gpus, row.gpu_memory_mib, worker_memory_gib(row),
                                activation_checkpointing=ac, **kw)
    base = census.total
    micro_batches = max(global_batch // (gpus * micro_batch), 1)
    gather_bytes = (sum(fp.stored_bytes(p, method, None) for p in census.params) / base) if base else 2
    shard = plan_sharding(sharding, gpus, target.hosts, instance_type=target.instance_type, micro_batches=micro_batches,
                          params=base, param_bytes=gather_bytes, grad_bytes=4.0 * chosen.trainable / base,
                          node_fits=node_fits)
    if shard.kind == "hybrid":
        chosen = node
    net = instance_network(target.instance_type)
    comm = comm_estimate(base, nodes=target.nodes, gpus_per_node=row.gpus, network_gbps=net["network_gbps"],
                         intra_node_gbytes_per_s=net["intra_node_gbytes_per_s"], micro_batches=micro_batches,
                         param_bytes=gather_bytes, grad_bytes=4.0 * chosen.trainable / base)[shard.kind]["seconds"]
    tokens = global_batch * seq_len
    compute = tokens * step_flops(config, method, seq_len, chosen.trainable, ac) / (
        gpus * row.gpu_bf16_tflops * 1e12 * ASSUMED_MFU)
    step = max(compute, comm)
    per_s = tokens / step
    host = chosen.host_bytes * target.ranks_per_node
    host_fits = host <= target.host_budget_bytes
    return {
        "method": method, "fits": chosen.peak_bytes <= budget and host_fits,
        "gib_per_gpu": round(chosen.peak_bytes / GIB, 2), "offload": "cpu" if offload else "none",
        "host_gib_per_node": round(host / GIB, 2), "host_budget_gib": round(target.host_budget_bytes / GIB, 2),
        "host_bytes_per_node": int(host), "host_budget_bytes": int(target.host_budget_bytes),
        "host_fits": host_fits,
        "budget_gib": round(budget / GIB, 2), "sharding": shard.kind, "sharding_reason": shard.reason,
        "activation_checkpointing": ac, "trainable_params": chosen.trainable,
        "params_gib": round(chosen.params_bytes / GIB, 3), "grads_gib": round(chosen.grads_bytes / GIB, 3),
        "optimizer_gib": round(chosen.optimizer_bytes / GIB, 3),
        "activations_gib": round(plain.activations_bytes / GIB, 3),
        "activations_checkpointed_gib": round(ckpt.activations_bytes / GIB, 3),
        "transient_gib": round(chosen.transient_bytes / GIB, 3),
        "gib_per_gpu_without_checkpointing": round(plain.peak_bytes / GIB, 2),
        "gib_per_gpu_with_checkpointing": round(ckpt.peak_bytes / GIB, 2),
        "compute_seconds": round(compute, 3), "communication_seconds": round(comm, 3),
        "step_seconds": round(step, 3), "tokens_per_s": round(per_s),
        "usd_per_million_tokens": round(target.nodes * row.price_per_hour / 3600 / per_s * 1e6, 2),
    }


def make_plan(config: Any, target: Target, *, seq_len: int = 2048, global_batch: int = 64, micro_batch: int = 1,
              lora_rank: int = fp.DEFAULT_LORA_RANK, targets: tuple[str, ...] | None = None,
              methods: Sequence[str] = fp.METHODS, checkpointing: bool | None = None,
              sharding: str = "auto", offload: bool = False) -> dict[str, Any]:
    """The plan as one JSON-ready object: the target, the model, and a `methods` list (trainer.model.footprint).

    `checkpointing` None: activation checkpointing only where the run would not fit without it (what
    `--micro-batch-size auto` does); True/False: as the run is configured. `offload`: FSDP2's CPU offload, the
    states in host memory (qlora, whose NF4 base cannot be offloaded, is left out).
    """
    target.check()
    census = fp.census(config)
    entries = [_entry(config, census, m, target, seq_len=seq_len, global_batch=global_batch, micro_batch=micro_batch,
                      lora_rank=lora_rank, targets=targets, checkpointing=checkpointing, sharding=sharding,
                      offload=offload)
               for m in methods if not (offload and m == "qlora")]
    row = target.row
    return {"instance_type": target.instance_type, "nodes": target.nodes, "gpus": target.gpus,
            "gpu": row.gpu_model, "gpu_memory_gib": row.gpu_memory_gib, "budget_fraction": BUDGET,
            "model_type": getattr(config, "model_type", "?"), "parameters": census.total, "seq_len": seq_len,
            "micro_batch": micro_batch, "global_batch": global_batch, "lora_rank": lora_rank,
            "assumed_mfu": ASSUMED_MFU, "price_per_hour": round(target.nodes * row.price_per_hour, 4),
            "offload": "cpu" if offload else "none", "worker_pod_memory_gib": worker_memory_gib(row),
            "ranks_per_node": target.ranks_per_node,
            "methods": entries}


def markdown(plan: dict[str, Any]) -> str:
    """The plan as a Markdown table (docs/larger-models.md holds these for the reference targets)."""
    rows = ["| method | fits | GiB per GPU (usable) | sharding | act. ckpt | params / grads / optimizer GiB | "
            "activations GiB (no ckpt / ckpt) | step s | tokens/s | $ per M tokens |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    host = plan.get("offload") == "cpu"
    if host:  # --offload cpu: where the states went
        rows = [rows[0] + " host GiB per node (usable) |", rows[1] + "---|"]
    for e in plan["methods"]:
        rows.append(f"| {e['method']} | {'yes' if e['fits'] else '**no**'} | {e['gib_per_gpu']:.2f} "
                    f"({e['budget_gib']:.2f}) | {e['sharding']} | {'on' if e['activation_checkpointing'] else 'off'} | "
                    f"{e['params_gib']:.2f} / {e['grads_gib']:.2f} / {e['optimizer_gib']:.2f} | "
                    f"{e['activations_gib']:.2f} / {e['activations_checkpointed_gib']:.2f} | {e['step_seconds']:.2f} | "
                    f"{e['tokens_per_s']:,} | {e['usd_per_million_tokens']:.2f} |"
                    + (f" {e['host_gib_per_node']:.2f} ({e['host_budget_gib']:.2f}) |" if host else ""))
    return "\n".join(rows)


def headline(plan: dict[str, Any]) -> str:
    return (f"{plan['model_type']}, {plan['parameters'] / 1e9:.2f}B parameters, on {plan['nodes']} x "
            f"{plan['instance_type']} ({plan['gpus']} x {plan['gpu']}, {plan['gpu_memory_gib']:.2f} GiB each, "
            f"{plan['budget_fraction']:.0%} usable), --seq-len {plan['seq_len']}, micro-batch {plan['micro_batch']}, "
            f"global batch {plan['global_batch']}; step time at {plan['assumed_mfu']:.0%} MFU or the communication "
            f"estimate, whichever is longer; ${plan['price_per_hour']:.2f}/h"
            + (f"; --offload cpu: parameters, gradients and optimizer states in host memory (the worker pod's "
               f"{plan['worker_pod_memory_gib']} GiB, {HOST_BUDGET:.0%} usable; the host-device copies and the CPU "
               f"optimizer step are not in the step time)" if plan.get("offload") == "cpu" else ""))


def refusal(plan: dict[str, Any], method: str) -> str | None:
    """Why `method` cannot run on the plan's target, with the numbers and what would fit; None when it fits."""
    entry = next(e for e in plan["methods"] if e["method"] == method)
    if entry["fits"]:
        return None
    if not entry["host_fits"]:
        return (f"a {method} fine-tune with --offload cpu pins {entry['host_bytes_per_node']:,} bytes "
                f"({entry['host_gib_per_node']:.2f} GiB: parameters, gradients and optimizer states of "
                f"{plan['ranks_per_node']} ranks) in host memory on one {plan['instance_type']} node, above the "
                f"{entry['host_budget_bytes']:,} bytes ({entry['host_budget_gib']:.2f} GiB, {HOST_BUDGET:.0%} of the Ray "
                f"worker pod's {plan['worker_pod_memory_gib']} GiB memory limit) it may fill; add nodes (more workers shard the "
                f"states further), or use --method lora or qlora without --offload")
    others = [e for e in plan["methods"] if e["method"] != method]
    trained = {"full": "--method full", "lora": "--method lora", "qlora": "--method qlora"}
    fitting = [f"{trained[e['method']]} {e['gib_per_gpu']:.2f} GiB" for e in others if e["fits"]]
    gpus_needed = _gpus_to_fit(entry, plan)
    acts = entry["activations_checkpointed_gib" if entry["activation_checkpointing"] else "activations_gib"]
    if not entry["activation_checkpointing"] and entry["gib_per_gpu_with_checkpointing"] <= entry["budget_gib"]:
        fitting.insert(0, f"this {method} fine-tune with --activation-checkpointing (or --micro-batch-size auto, "
                          f"which turns it on) {entry['gib_per_gpu_with_checkpointing']:.2f} GiB")
    return (f"a {method} fine-tune needs {entry['gib_per_gpu']:.2f} GiB per GPU on {plan['gpus']} x {plan['gpu']} "
            f"(parameters {entry['params_gib']:.2f}, gradients {entry['grads_gib']:.2f}, optimizer "
            f"{entry['optimizer_gib']:.2f}, activations {acts:.2f}, "
            f"buffers {entry['transient_gib']:.2f} GiB; activation checkpointing "
            f"{'on' if entry['activation_checkpointing'] else 'off'}), above the {entry['budget_gib']:.2f} GiB usable; "
            + (f"what fits there: {', '.join(fitting)} (python -m trainer plan prints the table)" if fitting else
               "no method fits there")
            + (f"; about {gpus_needed} GPUs would hold its states" if gpus_needed else ""))


def _gpus_to_fit(entry: dict[str, Any], plan: dict[str, Any]) -> int | None:
    """GPUs that would hold the sharded states (parameters, gradients, optimizer) in the budget with the rest as now."""
    states = entry["params_gib"] + entry["grads_gib"] + entry["optimizer_gib"]
    room = entry["budget_gib"] - (entry["gib_per_gpu"] - states)
    if room <= 0:
        return None
    return math.ceil(states * plan["gpus"] / room)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="model folder, hub id or s3:// prefix (only config.json is read)")
    which.add_argument("--model-shape", help=f"a named shape: {', '.join(SHAPES)}")
    parser.add_argument("--instance-type", help=f"GPU instance type ({', '.join(GPU_TYPES)})")
    parser.add_argument("--nodes", type=int, help="nodes of that type")
    parser.add_argument("--seq-len", type=int, default=2048, help="sequence length (default 2048)")
    parser.add_argument("--global-batch-size", type=int, default=64, help="sequences per step (default 64)")
    parser.add_argument("--lora-rank", type=int, default=fp.DEFAULT_LORA_RANK,
                        help=f"LoRA rank of lora and qlora (default {fp.DEFAULT_LORA_RANK})")
    parser.add_argument("--offload", choices=("none", "cpu"), default="none",
                        help="cpu: FSDP2's CPU offload, the states in host memory (full and lora; checks the worker "
                             "pod's memory limit)")
    parser.add_argument("--dataset", help="also size its prepared data (disk per node, preparation time) from its "
                                          "first records and its size")
    parser.add_argument("--dataset-split", default="train", help="the split of --dataset (default train)")
    parser.add_argument("--dataset-config", help="the config (subset) of a hub --dataset")
    parser.add_argument("--tokenizer", help="tokenizer for --dataset (default: --model's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (a `methods` list) for scripts")


def run(args: argparse.Namespace, target: Target, storage_fs: Any = None) -> int:
    """Print the plan for the parsed arguments on `target`."""
    from trainer.model.build import check_architecture
    from trainer.model.errors import ModelSourceError
    from trainer.model.sources import read_model_config

    for name in ("seq_len", "global_batch_size", "lora_rank"):
        if getattr(args, name) < 1:
            raise PlanError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    if args.model_shape:
        config = shape_config(args.model_shape)
    else:
        try:
            config = read_model_config(args.model, storage_fs=storage_fs)
        except ModelSourceError as e:
            raise PlanError(f"--model: {e}") from None
    try:
        check_architecture(config)  # on the meta device: the layers the plan shards
    except ModelSourceError as e:
        raise PlanError(f"--model: {e}") from None
    limit = getattr(config, "max_position_embeddings", None)
    if limit and args.seq_len > limit:
        raise PlanError(f"--seq-len {args.seq_len} exceeds the model's max_position_embeddings {limit}; use {limit} "
                        f"or less")
    plan = make_plan(config, target, seq_len=args.seq_len, global_batch=args.global_batch_size,
                     lora_rank=args.lora_rank, offload=args.offload == "cpu")
    if getattr(args, "dataset", None):
        plan["data"] = plan_data(args, target, plan, storage_fs)
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        print(headline(plan))
        print(markdown(plan))
        if "data" in plan:
            print("\n".join(data_lines(plan["data"])))
    return EXIT_OK


def model_bytes(plan: dict[str, Any]) -> int:
    """The model's weights as a node caches them: bf16, two bytes a parameter."""
    return int(plan["parameters"]) * 2


def plan_data(args: argparse.Namespace, target: Target, plan: dict[str, Any], storage_fs: Any = None) -> dict[str, Any]:
    """The prepared data of --dataset on the target: its size per node, the time on the target's CPUs, whether it
    fits each node's disk."""
    from trainer.data import sources
    from trainer.data.formats import DataError
    from trainer.model.sources import tokenizer_only

    spec = args.tokenizer or args.model
    if not spec:
        raise PlanError("--dataset with --model-shape: pass --tokenizer (a folder or hub id) to count its tokens")
    try:
        tokenizer = tokenizer_only(spec, None, storage_fs=storage_fs)
        found = sources.sample(args.dataset, args.dataset_split, config=args.dataset_config, storage_fs=storage_fs)
        lengths = sizing.sample_lengths(found.records, tokenizer, args.dataset)
    except DataError as e:
        raise PlanError(f"--dataset: {e}") from None
    except Exception as e:  # noqa: BLE001 - a tokenizer that cannot be loaded: named with its flag
        raise PlanError(f"--{'tokenizer' if args.tokenizer else 'model'} {spec}: cannot load its tokenizer "
                        f"({type(e).__name__}: {e})") from None
    return data_entry(found.size, lengths, args.dataset, seq_len=plan["seq_len"], cpus=target.cpus,
                      disk_gib=target.disk_gib, pool=target.pool, weights=model_bytes(plan))


def data_entry(size, lengths: list[int], dataset: str, *, seq_len: int, cpus: int | None, disk_gib: int | None,
               pool: str, weights: int, one_per_row: bool = False, overlong: str = "truncate") -> dict[str, Any]:
    """The plan's `data` object: the estimate (trainer.data.sizing) on `cpus` (None: unknown, no time), the room on
    one node, the refusal or None."""
    if size.count is None:
        return {"dataset": dataset, "size": size.describe(), "estimate": None, "fits": None, "refusal": None}
    est = sizing.estimate(lengths, size.count, seq_len, cpus=cpus or 1, exact=size.records is not None,
                          overlong=overlong, one_per_row=one_per_row)
    room = node_room(disk_gib, weights, pool)
    why = sizing.refusal(est, room, dataset)
    summary = sizing.describe(est)
    return {"dataset": dataset, "size": size.describe(), "estimate": est.__dict__, "node_free_bytes": room.free_bytes,
            "node_room": room.explained, "fits": why is None, "refusal": why,
            "summary": summary if cpus else summary.rsplit("; preparation", 1)[0]}


def node_room(disk_gib: int | None, weights: int, pool: str) -> sizing.DiskRoom:
    return sizing.node_room(disk_gib or GPU_ROOT_VOLUME_GIB, weights,
                            f"raytrain-eks:nodePools.{pool}.diskSize in the stack config", assumed=not disk_gib)


def data_lines(data: dict[str, Any]) -> list[str]:
    """The plan's lines about the prepared data."""
    if data["estimate"] is None:
        return [f"prepared data of {data['dataset']}: not sized, {data['size']}"]
    lines = [f"prepared data: {data['summary']}", f"dataset size: {data['size']}"]
    lines.append(f"fits each node's disk ({sizing.size(data['node_free_bytes'])} free of it: {data['node_room']})"
                 if data["fits"] else f"does not fit: {data['refusal']}")
    return lines



def run_refusal(cfg: Any, config: Any) -> tuple[str | None, dict[str, Any] | None]:
    """The pre-flight's plan (trainer.jobs.launch): why this GPU run of `cfg` cannot fit, and the plan.

    Only a GPU run of a known instance type (--instance-type; `submit --stack` sets it) is planned:
    the run's own workers, sequence length, micro-batch (1 with auto), activation checkpointing (on
    where needed with auto, as the micro-batch probe does) and sharding.
    """
    if not (cfg.use_gpu and cfg.instance_type in GPU_TYPES):
        return None, None
    row = GPU_TYPES[cfg.instance_type]
    target = Target(cfg.instance_type, math.ceil(cfg.num_workers / row.gpus), cfg.num_workers)
    auto = cfg.micro_batch_auto
    try:
        plan = make_plan(config, target, seq_len=cfg.seq_len, global_batch=cfg.global_batch_size,
                         micro_batch=1 if auto else int(cfg.micro_batch_size), lora_rank=cfg.lora_rank,
                         targets=cfg.lora_targets,
                         checkpointing=True if cfg.activation_checkpointing else (None if auto else False),
                         sharding=cfg.sharding, offload=cfg.offload == "cpu")
    except Exception as e:  # noqa: BLE001 - a shape the arithmetic cannot read: the micro-batch probe still measures
        log.warning("no memory plan for this model (%s: %s); the GPU probe measures it at the start", type(e).__name__, e)
        return None, None
    return refusal(plan, cfg.method), plan


def run_prediction(cfg: Any, config: Any, plan: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What the plan predicts for this run's own method and sharding, for run.json beside the measured peak.

    With the pre-flight's plan (a GPU run of a known instance type): its entry for --method, as the
    refusal judged it. Otherwise the footprint of the run as configured: every worker in one shard group
    (or --shard-size), micro-batch 1 with auto, activation checkpointing as set (auto may still turn it on).
    """
    if plan is not None:
        e = next(e for e in plan["methods"] if e["method"] == cfg.method)
        acts = e["activations_checkpointed_gib" if e["activation_checkpointing"] else "activations_gib"]
        return {"method": cfg.method, "sharding": e["sharding"], "gpus": plan["gpus"],
                "instance_type": plan["instance_type"], "activation_checkpointing": e["activation_checkpointing"],
                "params_gib": e["params_gib"], "grads_gib": e["grads_gib"], "optimizer_gib": e["optimizer_gib"],
                "activations_gib": acts, "buffers_gib": e["transient_gib"], "gib_per_gpu": e["gib_per_gpu"],
                "fits": e["fits"], "budget_gib": e["budget_gib"], "offload": e["offload"],
                "host_gib_per_node": e["host_gib_per_node"], "source": "pre-flight plan"}
    ranks = cfg.shard_size or cfg.num_workers
    try:
        f = fp.footprint(fp.census(config), cfg.method, ranks, seq_len=cfg.seq_len,
                         micro_batch=1 if cfg.micro_batch_auto else int(cfg.micro_batch_size),
                         activation_checkpointing=bool(cfg.activation_checkpointing), lora_rank=cfg.lora_rank,
                         targets=cfg.lora_targets, offload=cfg.offload == "cpu")
    except Exception as e:  # noqa: BLE001 - a shape the arithmetic cannot read: run.json holds the measured peak alone
        log.warning("no memory plan for run.json (%s: %s)", type(e).__name__, e)
        return None
    return {"method": cfg.method, "sharding": "full" if ranks == cfg.num_workers else "hybrid", "gpus": cfg.num_workers,
            "instance_type": cfg.instance_type, "activation_checkpointing": f.activation_checkpointing,
            "params_gib": round(f.params_bytes / GIB, 3), "grads_gib": round(f.grads_bytes / GIB, 3),
            "optimizer_gib": round(f.optimizer_bytes / GIB, 3), "activations_gib": round(f.activations_bytes / GIB, 3),
            "buffers_gib": round(f.transient_bytes / GIB, 3), "gib_per_gpu": round(f.peak_bytes / GIB, 3),
            "fits": None, "budget_gib": None, "offload": cfg.offload,
            "host_gib_per_node": round(f.host_bytes * min(ranks, cfg.num_workers) / GIB, 3),
            "source": "footprint of the configured run"}


def data_refusal(cfg: Any, tokenizer, found, info: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """The pre-flight's size check of the prepared data (trainer.jobs.launch): why its rows cannot fit a node's
    disk (--node-disk-gib; `submit --stack` sets it from the pool), and the plan's `data` object.

    `found` is the dataset's sample (trainer.data.sources.sample); nothing is refused without a record count
    (a hub dataset) or a known disk: the estimate is then a note. The model's weights are the plan's
    parameter count at two bytes (0 without a plan).
    """
    if tokenizer is None or found.size.count is None:
        return None, None
    behaviour = info.get("behaviour")
    lengths = sizing.sample_lengths(found.records, tokenizer, cfg.dataset, train_on=cfg.train_on,
                                    text_field=cfg.dataset_text_field)
    planned = info.get("plan")
    cpus = None
    if cfg.use_gpu and cfg.instance_type in GPU_TYPES:
        cpus = math.ceil(cfg.num_workers / GPU_TYPES[cfg.instance_type].gpus) * worker_cpus(GPU_TYPES[cfg.instance_type])
    entry = data_entry(found.size, lengths, cfg.dataset, seq_len=cfg.seq_len, cpus=cpus, disk_gib=cfg.node_disk_gib,
                       pool=cfg.pool or "gpu", weights=model_bytes(planned) if planned else 0,
                       one_per_row=bool(behaviour is not None and behaviour.one_per_row), overlong=cfg.overlong)
    return (entry["refusal"] if cfg.node_disk_gib else None), entry
