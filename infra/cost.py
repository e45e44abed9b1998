"""Estimated hourly cost of a stack, from the instance catalog."""
from __future__ import annotations

from infra import catalog
from infra.config import StackConfig


def hourly_cost(cfg: StackConfig) -> dict[str, float]:
    """On-demand list prices in us-east-1 (Spot and other regions differ); data transfer not included."""
    parts = {
        "gpuNodes": cfg.gpu_node_count * cfg.gpu.price_per_hour,
        "systemNodes": cfg.system_node_count * cfg.system.price_per_hour,
        "controlPlane": catalog.EKS_CONTROL_PLANE_PER_HOUR,
        "natGateway": catalog.NAT_GATEWAY_PER_HOUR,
    }
    parts = {k: round(v, 4) for k, v in parts.items()}
    parts["total"] = round(sum(parts.values()), 4)
    return parts
