"""Cost model: training FLOPs per token, MFU, the measured matmul peak, communication per step.

FLOPs per token = 6 x (decoder-block matmul parameters + vocab x hidden for the lm_head
matmul, counted even when the embedding is tied) + 12 x layers x hidden x seq_len for
attention scores and values. For Qwen2.5-1.5B at seq 2048 that is 10.32 GFLOP/token;
torchtitan's formula drops the tied lm_head and comes out 14% low.

The communication estimate (bytes per collective over the instance type's network)
decides between full and hybrid sharding. Imports only torch, and that lazily.
"""

from __future__ import annotations

from typing import Any

# Dense bf16 tensor-core peak per device, TFLOP/s (vendor datasheets, no sparsity).
PEAK_TFLOPS_BF16: dict[str, float] = {
    "H200": 989.0,
    "H100": 989.0,
    "H800": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "A10G": 125.0,
    "L40S": 362.0,
    "L4": 121.0,
}


def _get(config: Any, name: str, default: Any = None) -> Any:
    return getattr(config, name, default) if not isinstance(config, dict) else config.get(name, default)


def matmul_params(config: Any) -> int:
    """Matmul weights a token passes through: attention and MLP projections of every layer plus lm_head."""
    d = int(_get(config, "hidden_size"))
    n_layers = int(_get(config, "num_hidden_layers"))
    n_heads = int(_get(config, "num_attention_heads"))
    n_kv = int(_get(config, "num_key_value_heads") or n_heads)
    head_dim = int(_get(config, "head_dim") or d // n_heads)
    ff = int(_get(config, "intermediate_size"))
    vocab = int(_get(config, "vocab_size"))
    attn = d * n_heads * head_dim * 2 + d * n_kv * head_dim * 2  # q, o and k, v
    mlp = 3 * d * ff  # gate, up, down
    return n_layers * (attn + mlp) + vocab * d


def flops_per_token(config: Any, seq_len: int) -> float:
    """Training (forward + backward) FLOPs per token at this sequence length."""
    d = int(_get(config, "hidden_size"))
    n_layers = int(_get(config, "num_hidden_layers"))
    return 6.0 * matmul_params(config) + 12.0 * n_layers * d * seq_len


def peak_flops_per_device(device_name: str | None, override_tflops: float | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of one device, or None when unknown (CPU): MFU is then not reported."""
    if override_tflops:
        return override_tflops * 1e12
    if not device_name:
        return None
    upper = device_name.upper()
    for key in sorted(PEAK_TFLOPS_BF16, key=len, reverse=True):
        if key in upper:
            return PEAK_TFLOPS_BF16[key] * 1e12
    return None


def device_peak_flops(override_tflops: float | None = None) -> float | None:
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return peak_flops_per_device(name, override_tflops)


def mfu(tokens_per_s: float, flops_per_tok: float, peak_flops: float | None, num_devices: int = 1) -> float | None:
    """Achieved over peak FLOP/s, all devices together; None when the peak is unknown."""
    if not peak_flops:
        return None
    return tokens_per_s * flops_per_tok / (peak_flops * num_devices)


def parameter_count(config: Any) -> int:
    """All parameters (embedding once when tied, QKV biases, norms): what FSDP gathers and reduces."""
    d = int(_get(config, "hidden_size"))
    n_layers = int(_get(config, "num_hidden_layers"))
    n_heads = int(_get(config, "num_attention_heads"))
    n_kv = int(_get(config, "num_key_value_heads") or n_heads)
    head_dim = int(_get(config, "head_dim") or d // n_heads)
    vocab = int(_get(config, "vocab_size"))
    tied = bool(_get(config, "tie_word_embeddings", False))
    biases = (n_heads + 2 * n_kv) * head_dim if _get(config, "model_type") == "qwen2" else 0
    per_layer = (matmul_params(config) - vocab * d) // n_layers + biases + 2 * d
    return n_layers * per_layer + vocab * d * (1 if tied else 2) + d


def measure_matmul_peak(device: Any = None, *, size: int | None = None, iters: int | None = None) -> dict[str, Any]:
    """Dense matmul FLOP/s measured on this device: bf16 on a GPU, fp32 on a CPU.

    The datasheet peak is rarely reached (the H200 here measured 790 of 989 TFLOP/s), so
    MFU is reported against both.
    """
    import time

    import torch

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    n = size or (8192 if gpu else 2048)  # a CPU reaches its matmul peak only from ~2048 (1024: -20% here)
    reps = iters or (50 if gpu else 4)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def sync():
        if gpu:
            torch.cuda.synchronize(device)

    for _ in range(3):
        a @ b
    sync()
    best = float("inf")
    for _ in range(3):  # best of three: other processes on the machine only ever slow it down
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return {"flops": 2.0 * n ** 3 * reps / best, "dtype": str(dtype).replace("torch.", ""), "size": n}


# ---------------------------------------------------------------- communication per step

# Per-GPU bandwidth inside a node, GB/s in one direction (not in infra.catalog).
INTRA_NODE_GBYTES = {"nvlink": {"A100": 300.0, "H100": 450.0, "H200": 450.0, "B200": 900.0},
                     "pcie": 25.0}  # PCIe Gen4 x16 (L4, L40S, A10G): 32 GB/s raw, ~25 usable
_CATALOG_FALLBACK = {  # name: (gpus, gpu model, network Gbps, GPUDirect RDMA, NVLink); checked against infra.catalog
    "g6.12xlarge": (4, "NVIDIA L4", 40, False, False),
    "g6.48xlarge": (8, "NVIDIA L4", 100, False, False),
    "g6e.12xlarge": (4, "NVIDIA L40S", 100, False, False),
    "g6e.48xlarge": (8, "NVIDIA L40S", 400, False, False),
    "p4d.24xlarge": (8, "NVIDIA A100", 400, True, True),
    "p5.48xlarge": (8, "NVIDIA H100", 3200, True, True),
    "p5e.48xlarge": (8, "NVIDIA H200", 3200, True, True),
}


def instance_network(instance_type: str) -> dict[str, Any]:
    """Network facts of a GPU instance type: infra.catalog when importable, else the same figures.

    In a Ray job the working directory holds only the trainer package, so the catalog may
    not be importable there; a test keeps the fallback equal to the catalog.
    """
    try:
        from infra.catalog import GPU_TYPES

        rows = {name: (t.gpus, t.gpu_model, t.network_gbps, t.gpudirect_rdma, t.nvlink) for name, t in GPU_TYPES.items()}
    except ImportError:
        rows = _CATALOG_FALLBACK
    if instance_type not in rows:
        raise ValueError(f"instance type {instance_type!r}: unknown; use one of {', '.join(sorted(rows))}")
    gpus, model, gbps, rdma, nvlink = rows[instance_type]
    short = model.split()[-1]
    intra = INTRA_NODE_GBYTES["nvlink"].get(short, 300.0) if nvlink else INTRA_NODE_GBYTES["pcie"]
    return {"instance_type": instance_type, "gpus_per_node": gpus, "network_gbps": gbps, "gpudirect_rdma": rdma,
            "nvlink": nvlink, "intra_node_gbytes_per_s": intra}


def comm_estimate(params: int, *, nodes: int, gpus_per_node: int, network_gbps: float,
                  intra_node_gbytes_per_s: float, micro_batches: int, param_bytes: int = 2,
                  grad_bytes: int = 4) -> dict[str, dict[str, float]]:
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
