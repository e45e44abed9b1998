"""Estimated hourly cost of a stack, from the instance catalog."""
from __future__ import annotations

from infra import catalog
from infra.config import StackConfig

PARTS = ("gpuNodes", "systemNodes", "controlPlane", "natGateway")


def hourly_cost(cfg: StackConfig) -> dict[str, float | str]:
    """On-demand list prices in us-east-1 (Spot and other regions differ); data transfer not included.

    `total` is the stack with every GPU node up. With scaleToZero that is the price while training,
    and `idleTotal` what the stack costs between jobs, with the GPU node group at zero; without it
    the GPU nodes bill whether they train or not, and the dictionary is as it always was.
    """
    parts: dict[str, float | str] = {
        "gpuNodes": cfg.gpu_node_count * cfg.gpu.price_per_hour,
        "systemNodes": cfg.system_node_count * cfg.system.price_per_hour,
        "controlPlane": catalog.EKS_CONTROL_PLANE_PER_HOUR,
        "natGateway": catalog.NAT_GATEWAY_PER_HOUR,
    }
    parts = {k: round(v, 4) for k, v in parts.items()}
    parts["total"] = round(sum(parts.values()), 4)
    if cfg.scale_to_zero:
        parts["idleTotal"] = round(sum(v for k, v in parts.items() if k in PARTS and k != "gpuNodes"), 4)
        parts["mode"] = "scale-to-zero"
    return parts
