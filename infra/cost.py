"""Estimated hourly cost of a stack, from the instance catalog and its node pools, and the warnings a large one deserves."""
from __future__ import annotations

from typing import Iterable

from facts import catalog
from infra.node_pools import NodePool

NOT_PARTS = ("total", "idleTotal", "mode", "pricing")
ON_DEMAND_LIST_PRICE = "On-Demand list price"
# EC2 Service Quotas (service code ec2): running vCPUs per instance family and purchase option.
VCPU_QUOTAS = {
    ("G", "ON_DEMAND"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("P", "ON_DEMAND"): ("L-417A185B", "Running On-Demand P instances"),
    ("G", "SPOT"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("P", "SPOT"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("standard", "ON_DEMAND"): ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    ("standard", "SPOT"): ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}
USAGE_BASED = (
    f"NAT gateway data processing ${catalog.NAT_GATEWAY_PER_GB}/GB (S3 bypasses it through the gateway endpoint)",
    f"control-plane logs ${catalog.LOG_INGESTION_PER_GB:.2f}/GB ingested + ${catalog.LOG_STORAGE_PER_GB_MONTH:.2f}/GB-month "
    "stored",
    "data transfer out of AWS",
)


# The `monitoring` key's options that bill by use (AWS's CloudWatch pricing: Container Insights with enhanced
# observability is charged per observation, its logs per GB ingested); `none` adds nothing.
MONITORING_USAGE = {
    "cloudwatch": "CloudWatch Container Insights (monitoring: cloudwatch) per observation, and its logs "
                  f"${catalog.LOG_INGESTION_PER_GB:.2f}/GB ingested",
}


def _volume_per_hour(gib: int) -> float:
    return gib * catalog.GP3_PER_GB_MONTH / catalog.HOURS_PER_MONTH


def part_names(pool: NodePool) -> tuple[str, str]:
    """gpu -> (gpuNodes, gpuRootVolumes); data-cpu -> (dataCpuNodes, dataCpuRootVolumes)."""
    head, *rest = pool.name.split("-")
    stem = head + "".join(word.capitalize() for word in rest)
    return f"{stem}Nodes", f"{stem}RootVolumes"


def parts(cost: dict) -> list[str]:
    """The priced parts of a cost estimate, in order."""
    return [name for name in cost if name not in NOT_PARTS]


def hourly_cost(pools: Iterable[NodePool]) -> dict[str, float | str]:
    """List prices in us-east-1 (other regions differ); usage-based charges are not included.

    `total` is the stack with every node of every pool up. With a pool that scales to zero that
    is the price while training, and `idleTotal` what the stack costs between jobs, with those
    pools at zero; a fixed pool bills whether it works or not. `pricing` says what the prices are.
    """
    pools = tuple(pools)
    cost: dict[str, float | str] = {}
    idle: dict[str, float] = {}
    for pool in sorted(pools, key=lambda p: not p.gpus):  # the GPU pools, which are most of the bill, first
        nodes, volumes = part_names(pool)
        cost[nodes] = round(pool.max_size * pool.instance.price_per_hour, 4)
        cost[volumes] = round(pool.max_size * _volume_per_hour(pool.disk_size_gib), 4)
        if not pool.scale_to_zero:
            idle.update({nodes: cost[nodes], volumes: cost[volumes]})
    fixed = {"controlPlane": catalog.EKS_CONTROL_PLANE_PER_HOUR, "natGateway": catalog.NAT_GATEWAY_PER_HOUR,
             "natPublicIpv4": catalog.PUBLIC_IPV4_PER_HOUR}
    cost.update({k: round(v, 4) for k, v in fixed.items()})
    idle.update(fixed)
    cost["total"] = round(sum(cost[k] for k in parts(cost)), 4)
    if any(p.scale_to_zero for p in pools):
        cost["idleTotal"] = round(sum(idle.values()), 4)
        cost["mode"] = "scale-to-zero"
    cost["pricing"] = pricing(pools)
    return cost


def _pool_pricing(pool: NodePool) -> str:
    if pool.capacity_type == "SPOT":
        return ("SPOT priced at the On-Demand list price, an upper bound: Spot prices vary by zone and hour "
                f"(`aws ec2 describe-spot-price-history --instance-types {pool.instance_type}`)")
    if pool.capacity_type == "CAPACITY_BLOCK":
        return ("CAPACITY_BLOCK priced at the On-Demand list price: a Capacity Block is paid up front at its own "
                "price, for its whole duration, whether nodes run or not")
    return pool.instance.price_note or ON_DEMAND_LIST_PRICE


def pricing(pools: Iterable[NodePool]) -> str:
    """What the node prices are: the On-Demand list price, or what each pool's differs by."""
    notes = list(dict.fromkeys(n for n in map(_pool_pricing, pools) if n != ON_DEMAND_LIST_PRICE))
    return "; ".join(notes) or ON_DEMAND_LIST_PRICE


def vcpus_needed(pools: Iterable[NodePool]) -> dict[tuple[str, str], tuple[int, NodePool]]:
    """vCPUs the stack runs at most per Service Quotas family and purchase option, and the largest pool in it."""
    needed: dict[tuple[str, str], tuple[int, NodePool]] = {}
    for pool in pools:
        if pool.capacity_type == "CAPACITY_BLOCK":  # instances in a Capacity Block count against no vCPU quota
            continue
        family = (catalog.quota_family(pool.instance_type), "SPOT" if pool.capacity_type == "SPOT" else "ON_DEMAND")
        vcpus = pool.max_size * pool.instance.vcpus
        total, largest = needed.get(family, (0, pool))
        needed[family] = (total + vcpus, pool if vcpus > largest.max_size * largest.instance.vcpus else largest)
    return needed


def cost_warnings(pools: Iterable[NodePool], limit_per_day: float) -> list[str]:
    """What the plan and `pulumi preview` print about money before anything is created."""
    pools = tuple(pools)
    cost = hourly_cost(pools)
    warnings = []
    per_day = float(cost["total"]) * 24
    if per_day > limit_per_day:
        quotas = "; ".join(f'{vcpus} vCPUs of "{VCPU_QUOTAS[f][1]}" ({VCPU_QUOTAS[f][0]})'
                           for f, (vcpus, _) in vcpus_needed(pools).items() if f[0] != "standard")
        big = [p for p in pools if p.gpus] or list(pools)
        sizes = ", ".join(f"{p.max_size} x {p.instance_type}" for p in big)
        keys = " and ".join(dict.fromkeys(k for p in big for k in (p.key("maxSize"), p.key("instanceType"))))
        warnings.append(
            f"this stack costs about ${per_day:,.0f} per day (${float(cost['total']):,.2f}/hour) while it is up, above "
            f"raytrain-eks:costWarningPerDay (${limit_per_day:,.0f}): {sizes}. "
            + (f"It needs {quotas} of EC2 quota. " if quotas else "")
            + f"Check {keys}; scaleToZero or `pulumi destroy` stops the GPU bill")
    if cost["pricing"] != ON_DEMAND_LIST_PRICE:
        warnings.append(f"cost estimate: {cost['pricing']}")
    return warnings
