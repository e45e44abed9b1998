"""All-reduce bandwidth across every Ray Train worker, reported the way nccl-tests does.

Runs inside a Ray job (``python -m trainer nccl-bench`` submits it): one worker per
GPU with NCCL, or CPU workers with gloo for a local check. For each message size
it times out-of-place all-reduces and prints algorithm bandwidth (bytes / time)
and bus bandwidth (algbw x 2(n-1)/n, the per-link figure comparable across world
sizes), then compares the large-message bus bandwidth with what the instance
type's network should give.
"""
from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from facts import ray as ray_facts

MIN_BYTES = 8
MAX_BYTES = 1 << 30
LARGE_MESSAGE = 64 << 20  # sizes from here on are bandwidth-bound
DTYPE_BYTES = 4  # float32, as nccl-tests' default
RESULTS = "nccl_bench.json"


@dataclass(frozen=True)
class Row:
    size_bytes: int
    count: int
    time_us: float
    algbw_gbs: float
    busbw_gbs: float


def message_sizes(min_bytes: int = MIN_BYTES, max_bytes: int = MAX_BYTES) -> list[int]:
    """Powers of two from min to max bytes, as `all_reduce_perf -b 8 -e 1G -f 2`."""
    if min_bytes < DTYPE_BYTES or max_bytes < min_bytes:
        raise ValueError(f"message sizes: need {DTYPE_BYTES} <= min ({min_bytes}) <= max ({max_bytes})")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """An all-reduce moves 2(n-1)/n of the buffer over each rank's link."""
    return algbw * 2 * (world_size - 1) / world_size if world_size > 1 else 0.0


def row(size_bytes: int, seconds: float, world_size: int) -> Row:
    algbw = size_bytes / seconds / 1e9
    return Row(size_bytes, size_bytes // DTYPE_BYTES, seconds * 1e6, algbw, bus_bandwidth(algbw, world_size))


def expected_busbw_gbs(network_gbps: float) -> float:
    """Across nodes an all-reduce is bounded by each node's network: Gbit/s -> GB/s."""
    return network_gbps / 8


def measure(sizes: list[int], *, warmup: int, iters: int, device) -> list[Row]:
    """Time all-reduces in the current process group; each size's time is the slowest rank's."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for size in sizes:
        send = torch.ones(size // DTYPE_BYTES, dtype=torch.float32, device=device)
        recv = torch.empty_like(send)
        for _ in range(warmup):
            recv.copy_(send)
            dist.all_reduce(recv)
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            recv.copy_(send)
            dist.all_reduce(recv)
        sync()
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if recv[0].item() != world:
            raise RuntimeError(f"all-reduce of {size} bytes gave {recv[0].item()}, expected {world}: the collective is broken")
        rows.append(row(size, elapsed.item(), world))
    return rows


def format_table(rows: list[Row], *, world_size: int, nodes: int, backend: str,
                 network_gbps: float | None = None, instance_type: str | None = None) -> str:
    lines = [f"# all_reduce, float32, out-of-place: {world_size} ranks on {nodes} node(s), backend {backend}",
             f"# {'size (B)':>12} {'count':>12} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}"]
    lines += [f"  {r.size_bytes:>12} {r.count:>12} {r.time_us:>12.1f} {r.algbw_gbs:>13.3f} {r.busbw_gbs:>13.3f}"
              for r in rows]
    lines.append(verdict(rows, nodes=nodes, network_gbps=network_gbps, instance_type=instance_type))
    return "\n".join(lines)


def verdict(rows: list[Row], *, nodes: int, network_gbps: float | None, instance_type: str | None) -> str:
    large = [r.busbw_gbs for r in rows if r.size_bytes >= LARGE_MESSAGE] or [r.busbw_gbs for r in rows]
    peak = max(large) if large else 0.0
    if nodes < 2 or not network_gbps:
        return f"# peak bus bandwidth {peak:.3f} GB/s (single node or no network figure: nothing to compare)"
    expected = expected_busbw_gbs(network_gbps)
    return (f"# peak bus bandwidth {peak:.3f} GB/s = {100 * peak / expected:.0f}% of the {expected:.1f} GB/s "
            f"that {instance_type or 'the instance'}'s {network_gbps:g} Gbps network allows")


def _worker(config: dict) -> None:
    """Ray Train worker: the process group is already up (NCCL on GPU, gloo on CPU)."""
    import ray.train
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() and config["gpu"] \
        else torch.device("cpu")
    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    rows = measure(config["sizes"], warmup=config["warmup"], iters=config["iters"], device=device)
    summary = {"rows": [asdict(r) for r in rows], "nodes": len(set(hosts)), "world_size": dist.get_world_size(),
               "backend": dist.get_backend()}
    if dist.get_rank() != 0:
        ray.train.report({}, checkpoint=None)
        return
    print(format_table(rows, world_size=summary["world_size"], nodes=summary["nodes"], backend=summary["backend"],
                       network_gbps=config.get("network_gbps"), instance_type=config.get("instance_type")), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / RESULTS).write_text(json.dumps(summary))
        ray.train.report({}, checkpoint=ray.train.Checkpoint.from_directory(folder))


def run(*, workers: int, gpu: bool, sizes: list[int], warmup: int = 5, iters: int = 20,
        network_gbps: float | None = None, instance_type: str | None = None, storage_path: str | None = None,
        pool: str | None = None) -> dict:
    """Start one worker per GPU (or CPU process) through Ray Train, on `pool`'s nodes only when given, and return
    rank 0's results."""
    storage_path = storage_path or tempfile.mkdtemp(prefix="nccl-bench-")
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        _worker,
        train_loop_config={"sizes": sizes, "warmup": warmup, "iters": iters, "gpu": gpu,
                           "network_gbps": network_gbps, "instance_type": instance_type},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpu,
                                     label_selector=ray_facts.pool_labels(pool) if pool else None),
        run_config=RunConfig(name=f"nccl-bench-{int(time.time())}", storage_path=storage_path),
    )
    with trainer.fit().checkpoint.as_directory() as folder:
        return json.loads((Path(folder) / RESULTS).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer nccl-bench-job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="ranks: one per GPU, or CPU processes")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES)
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--network-gbps", type=float, help="expected network bandwidth per node (from the catalog)")
    parser.add_argument("--instance-type", help="instance type the bandwidth figure belongs to")
    parser.add_argument("--storage-path", help="Ray Train storage path (multi-node: shared storage, e.g. s3://)")
    parser.add_argument("--pool", help="run only on this node pool's nodes (their Ray label raytrain.io/pool)")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    args = parser.parse_args(argv)
    try:
        sizes = message_sizes(args.min_bytes, args.max_bytes)
    except ValueError as err:
        parser.error(str(err))
    if args.workers < 1 or args.iters < 1 or args.warmup < 0:
        parser.error("--workers and --iters must be at least 1, --warmup at least 0")
    results = run(workers=args.workers, gpu=args.device == "gpu", sizes=sizes, warmup=args.warmup, iters=args.iters,
                  network_gbps=args.network_gbps, instance_type=args.instance_type, storage_path=args.storage_path,
                  pool=args.pool)
    if args.json:
        print(json.dumps(results))
    return 0

