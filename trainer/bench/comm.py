"""`python -m trainer.bench comm`: the communication estimate per step of full against hybrid sharding."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from trainer.bench.setups import emit
from trainer.bench.shapes import BenchError, model_config
from trainer.loop import parallel
from trainer.model import flops as flops_lib


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.bench comm",
                                description="Communication per step of full vs hybrid sharding for a topology.")
    p.add_argument("--instance-type", default="g6.12xlarge")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--model-shape", default="qwen2.5-1.5b")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per rank per optimizer step")
    args = p.parse_args(list(argv))
    if args.nodes < 1 or args.micro_batches < 1:
        raise BenchError("--nodes and --micro-batches must be at least 1")
    try:
        net = parallel.instance_network(args.instance_type)
    except ValueError as e:
        raise BenchError(f"--instance-type: {e}") from None
    config = model_config(args.model_shape)
    params = flops_lib.parameter_count(config)
    est = parallel.comm_estimate(params, nodes=args.nodes, gpus_per_node=net["gpus_per_node"],
                                  network_gbps=net["network_gbps"],
                                  intra_node_gbytes_per_s=net["intra_node_gbytes_per_s"],
                                  micro_batches=args.micro_batches)
    chosen = parallel.choose_sharding(est, args.nodes)
    emit({"setup": "comm_estimate", **net, "nodes": args.nodes, "params": params, "micro_batches": args.micro_batches,
          "full_s_per_step": round(est["full"]["seconds"], 3), "hybrid_s_per_step": round(est["hybrid"]["seconds"], 3),
          "all_gather_gib": round(est["full"]["all_gather_bytes"] / 2**30, 3),
          "reduce_scatter_gib": round(est["full"]["reduce_scatter_bytes"] / 2**30, 3),
          "full_network_gib_per_step": round(est["full"]["bytes_over_network"] / 2**30, 2),
          "hybrid_network_gib_per_step": round(est["hybrid"]["bytes_over_network"] / 2**30, 2),
          "default_sharding": chosen})
    print(parallel.format_estimate(est, nodes=args.nodes, gpus_per_node=net["gpus_per_node"],
                                    instance_type=args.instance_type, network_gbps=net["network_gbps"],
                                    chosen=chosen), file=sys.stderr)
    return 0

