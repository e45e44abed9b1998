"""Cost model: training FLOPs per token, MFU, the measured matmul peak (communication: trainer.loop.parallel).

FLOPs per token = 6 x (the matmul weights a token goes through + vocab x hidden for the
lm_head matmul, counted even when the embedding is tied) + 12 x (heads x head_dim) x the
context each layer attends to (seq_len, or its sliding window) for attention scores and
values. For Qwen2.5-1.5B at seq 2048 that is 10.32 GFLOP/token; torchtitan's formula
drops the tied lm_head and comes out 14% low.

The shape is the model's own: transformers builds it on the meta device (no memory) and
the weights of its decoder layers are counted, so fused or split projections, MLP form
(gated or not) and biases are whatever the architecture has. Mixture-of-experts layers
count each token's active experts only (num_experts_per_tok of the stacked experts),
their router and shared experts in full; `parameter_count` (for trainer.loop.parallel's
communication estimate) counts every parameter, experts included (all of them are
gathered and reduced). Imports only torch, and that lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.model.parts import model_parts

# Dense bf16 tensor-core peak, TFLOP/s (vendor datasheets, no sparsity), of the chips the instance
# catalog does not list; the catalog's rows carry their own (facts.catalog, gpu_bf16_tflops).
OTHER_PEAK_TFLOPS_BF16: dict[str, float] = {"H800": 989.0, "B200": 2250.0, "A10G": 125.0}


def peak_tflops_by_chip() -> dict[str, float]:
    """Dense bf16 peak per chip name (the last word of the catalog's GPU model, e.g. "L4")."""
    from facts.catalog import GPU_TYPES

    return {**OTHER_PEAK_TFLOPS_BF16, **{row.gpu_model.split()[-1]: row.gpu_bf16_tflops for row in GPU_TYPES.values()}}


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of an architecture, read off the model itself."""

    params: int                # every parameter once (a tied embedding once)
    matmul_params: int         # matmul weights one token goes through, the lm_head included
    attention: tuple[tuple[int, int | None], ...]  # per layer: query width (heads x head_dim), sliding window
    experts: tuple[int, int] | None = None         # (active, total) experts per token in the MoE layers


_TOP_K = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "num_selected_experts")
_SHAPES: dict[str, ModelShape] = {}


def _as_config(config: Any):
    if isinstance(config, dict):
        from transformers import AutoConfig

        if "model_type" not in config:
            raise ValueError("a model config as a dict needs its model_type (as in config.json)")
        d = dict(config)
        return AutoConfig.for_model(d.pop("model_type"), **d)
    return config


def _top_k(config: Any, layer) -> int | None:
    for name in _TOP_K:
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    return next((m.top_k for m in layer.modules() if isinstance(getattr(m, "top_k", None), int)), None)


def model_shape(config: Any) -> ModelShape:
    """The model's parameter counts and attention shape, from a meta-device build (cached per config)."""
    config = _as_config(config)
    key = config.to_json_string(use_diff=False)
    if key not in _SHAPES:
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        parts = model_parts(model)
        matmul, experts = 0, None
        for layer in parts.layers:
            top_k = _top_k(config, layer)
            for module in layer.modules():
                stacked = "Expert" in type(module).__name__
                for p in module.parameters(recurse=False):
                    if p.ndim < 2:
                        continue  # biases and norms: no matmul
                    if p.ndim == 3 and stacked and top_k:  # [experts, out, in]: a token uses top_k of them
                        matmul += p.numel() * top_k // p.shape[0]
                        experts = (top_k, p.shape[0])
                    else:
                        matmul += p.numel()
        matmul += parts.head.weight.numel()
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = int(text.num_attention_heads)
        width = heads * int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        window = getattr(text, "sliding_window", None)
        kinds = getattr(text, "layer_types", None) or (
            ["sliding_attention" if window else "full_attention"] * len(parts.layers))
        attention = tuple((width, window if kind == "sliding_attention" and window else None) for kind in kinds)
        _SHAPES[key] = ModelShape(sum(p.numel() for p in model.parameters()), matmul, attention, experts)
    return _SHAPES[key]


def matmul_params(config: Any) -> int:
    """Matmul weights a token passes through: its layers' projections (active experts only) plus the lm_head."""
    return model_shape(config).matmul_params


def flops_per_token(config: Any, seq_len: int) -> float:
    """Training (forward + backward) FLOPs per token at this sequence length."""
    shape = model_shape(config)
    attention = sum(width * min(seq_len, window or seq_len) for width, window in shape.attention)
    return 6.0 * shape.matmul_params + 12.0 * attention


def peak_flops_per_device(device_name: str | None, override_tflops: float | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of one device, or None when unknown (CPU): MFU is then not reported."""
    if override_tflops:
        return override_tflops * 1e12
    if not device_name:
        return None
    upper, peaks = device_name.upper(), peak_tflops_by_chip()
    for key in sorted(peaks, key=len, reverse=True):  # "L40S" before "L4"
        if key.upper() in upper:
            return peaks[key] * 1e12
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
    """All parameters (embedding once when tied, biases, norms, every expert): what FSDP gathers and reduces."""
    return model_shape(config).params


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
