"""Estimated hourly cost of a stack, from the instance catalog, and the warnings a large one deserves."""
from __future__ import annotations

from facts import catalog
from infra import nodes
from infra.config import StackConfig

PARTS = ("gpuNodes", "gpuRootVolumes", "systemNodes", "systemRootVolumes", "controlPlane", "natGateway",
         "natPublicIpv4")
# Parts that go away when the GPU node group is at zero.
GPU_PARTS = ("gpuNodes", "gpuRootVolumes")
# EC2 Service Quotas (service code ec2): running vCPUs per instance family and purchase option.
VCPU_QUOTAS = {
    ("G", "ON_DEMAND"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("P", "ON_DEMAND"): ("L-417A185B", "Running On-Demand P instances"),
    ("G", "SPOT"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("P", "SPOT"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("standard", "ON_DEMAND"): ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
}
USAGE_BASED = (
    f"NAT gateway data processing ${catalog.NAT_GATEWAY_PER_GB}/GB (S3 bypasses it through the gateway endpoint)",
    f"control-plane logs ${catalog.LOG_INGESTION_PER_GB:.2f}/GB ingested + ${catalog.LOG_STORAGE_PER_GB_MONTH:.2f}/GB-month "
    "stored",
    "data transfer out of AWS",
)


def _volume_per_hour(gib: int) -> float:
    return gib * catalog.GP3_PER_GB_MONTH / catalog.HOURS_PER_MONTH


def hourly_cost(cfg: StackConfig) -> dict[str, float | str]:
    """List prices in us-east-1 (other regions differ); usage-based charges are not included.

    `total` is the stack with every GPU node up. With scaleToZero that is the price while training,
    and `idleTotal` what the stack costs between jobs, with the GPU node group at zero; without it
    the GPU nodes bill whether they train or not. `pricing` says what the GPU price is.
    """
    parts: dict[str, float | str] = {
        "gpuNodes": cfg.gpu_node_count * cfg.gpu.price_per_hour,
        "gpuRootVolumes": cfg.gpu_node_count * _volume_per_hour(nodes.GPU_ROOT_VOLUME_GIB),
        "systemNodes": cfg.system_node_count * cfg.system.price_per_hour,
        "systemRootVolumes": cfg.system_node_count * _volume_per_hour(nodes.SYSTEM_ROOT_VOLUME_GIB),
        "controlPlane": catalog.EKS_CONTROL_PLANE_PER_HOUR,
        "natGateway": catalog.NAT_GATEWAY_PER_HOUR,
        "natPublicIpv4": catalog.PUBLIC_IPV4_PER_HOUR,
    }
    parts = {k: round(v, 4) for k, v in parts.items()}
    parts["total"] = round(sum(parts.values()), 4)
    if cfg.scale_to_zero:
        parts["idleTotal"] = round(sum(v for k, v in parts.items() if k in PARTS and k not in GPU_PARTS), 4)
        parts["mode"] = "scale-to-zero"
    parts["pricing"] = gpu_pricing(cfg)
    return parts


def gpu_pricing(cfg: StackConfig) -> str:
    if cfg.capacity_type == "SPOT":
        return ("SPOT priced at the On-Demand list price, an upper bound: Spot prices vary by zone and hour "
                f"(`aws ec2 describe-spot-price-history --instance-types {cfg.gpu_node_type}`)")
    if cfg.capacity_type == "CAPACITY_BLOCK":
        return ("CAPACITY_BLOCK priced at the On-Demand list price: a Capacity Block is paid up front at its own "
                "price, for its whole duration, whether nodes run or not")
    return cfg.gpu.price_note or "On-Demand list price"


def vcpus_needed(cfg: StackConfig) -> dict[tuple[str, str], int]:
    """vCPUs the stack runs at most, per Service Quotas family and purchase option."""
    family = catalog.quota_family(cfg.gpu_node_type)
    purchase = "SPOT" if cfg.capacity_type == "SPOT" else "ON_DEMAND"
    needed = {("standard", "ON_DEMAND"): cfg.system_node_count * cfg.system.vcpus}
    if cfg.capacity_type != "CAPACITY_BLOCK":  # instances in a Capacity Block do not count against these quotas
        needed[(family, purchase)] = cfg.gpu_node_count * cfg.gpu.vcpus
    return needed


def cost_warnings(cfg: StackConfig) -> list[str]:
    """What the plan and `pulumi preview` print about money before anything is created."""
    cost = hourly_cost(cfg)
    warnings = []
    per_day = float(cost["total"]) * 24
    if per_day > cfg.cost_warning_per_day:
        quotas = "; ".join(f'{vcpus} vCPUs of "{VCPU_QUOTAS[f][1]}" ({VCPU_QUOTAS[f][0]})'
                           for f, vcpus in vcpus_needed(cfg).items() if f[0] != "standard")
        warnings.append(
            f"this stack costs about ${per_day:,.0f} per day (${float(cost['total']):,.2f}/hour) while it is up, above "
            f"raytrain-eks:costWarningPerDay (${cfg.cost_warning_per_day:,.0f}): {cfg.gpu_node_count} x "
            f"{cfg.gpu_node_type}. " + (f"It needs {quotas} of EC2 quota. " if quotas else "")
            + "Check gpuNodeCount and gpuNodeType; scaleToZero or `pulumi destroy` stops the GPU bill")
    if cost["pricing"] != "On-Demand list price":
        warnings.append(f"cost estimate: {cost['pricing']}")
    return warnings
