"""Training FLOPs per token and model FLOPs utilisation (MFU).

FLOPs per token = 6 x (decoder-block matmul parameters + vocab x hidden for the lm_head
matmul, counted even when the embedding is tied) + 12 x layers x hidden x seq_len for
attention scores and values. For Qwen2.5-1.5B at seq 2048 that is 10.32 GFLOP/token;
torchtitan's formula drops the tied lm_head and comes out 14% low. Imports only torch.
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
