"""Node pools as data: what one EKS managed node group is, and its launch template, as pure functions.

A NodePool is one entry of the stack's `nodePools` map (or of the two pools the shorthand keys
gpuNodeType, gpuNodeCount, systemNodeType and systemNodeCount describe). Everything a node
group needs follows from it and the instance catalog: the AMI, the EFA interfaces, the root
volume, the scaling and, for a pool that scales to zero, what the Cluster Autoscaler must be told.
Kept apart from the Pulumi resources so tests and the policy pack read plain dicts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from facts import catalog, resources
from facts import nodes as node_facts
from facts.nodes import Taint

ROOT_DEVICE = "/dev/xvda"
GPU_ROOT_VOLUME_GIB = resources.GPU_ROOT_VOLUME_GIB
CPU_ROOT_VOLUME_GIB = resources.CPU_ROOT_VOLUME_GIB
CAPACITY_TYPES = ("ON_DEMAND", "SPOT", "CAPACITY_BLOCK")
SYSTEM_POOL = "system"  # runs the Ray head, the KubeRay operator, CoreDNS and the Cluster Autoscaler
NAME = re.compile(r"^[a-z][a-z0-9-]{0,19}$")
# A scaled pool's desired size belongs to the Cluster Autoscaler once it runs; Pulumi sets it only at
# creation. The engine wants the schema (camelCase) path: "scaling_config.desired_size" is silently
# ignored (pulumi/pulumi#7081).
SCALED_IGNORE_CHANGES = ("scalingConfig.desiredSize",)


@dataclass(frozen=True)
class NodePool:
    name: str
    instance_type: str
    min_size: int
    max_size: int
    desired_size: int
    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()
    capacity_type: str = "ON_DEMAND"
    capacity_reservation_id: str | None = None
    efa: bool = False
    placement_group: bool = False
    scale_to_zero: bool = False
    ray_worker_group: str | None = None
    disk_size_gib: int = CPU_ROOT_VOLUME_GIB
    availability_zone: str | None = None  # None: the stack's GPU zone with EFA, every private subnet without
    keys: Mapping[str, str] = field(default_factory=dict)  # field -> the stack key that set it, for messages

    @property
    def instance(self) -> catalog.InstanceType:
        return catalog.instance_type(self.instance_type)

    @property
    def gpus(self) -> int:
        return self.instance.gpus

    @property
    def single_zone(self) -> bool:
        """EFA traffic does not cross AZs: an EFA pool lives in one zone, as does one pinned to a zone."""
        return self.efa or self.availability_zone is not None

    def key(self, name: str) -> str:
        """The stack key a user wrote for this field, for messages (nodePools.gpu.maxSize or gpuNodeCount)."""
        return self.keys.get(name, f"raytrain-eks:nodePools.{self.name}.{name}")


def default_labels(name: str, instance_type: str, ray_worker_group: str | None) -> dict[str, str]:
    """role: <pool>-worker for a pool with Ray workers, <pool> otherwise; GPU nodes also say so (NVIDIA's chart)."""
    labels = {node_facts.ROLE: f"{name}-worker" if ray_worker_group else name}
    if catalog.is_gpu_type(instance_type):
        labels[node_facts.GPU_PRESENT] = "true"
    return labels


def node_labels(pool: NodePool) -> dict[str, str]:
    """The pool's labels; a scaled GPU pool also carries the accelerator label the Cluster Autoscaler reads."""
    labels = dict(pool.labels)
    if pool.scale_to_zero and pool.gpus:
        labels[node_facts.ACCELERATOR_LABEL] = node_facts.accelerator(pool.instance.gpu_model)
    return labels


def ami_type(pool: NodePool) -> str:
    return "AL2023_x86_64_NVIDIA" if pool.gpus else "AL2023_x86_64_STANDARD"


def scaling(pool: NodePool) -> dict[str, int]:
    return {"min_size": pool.min_size, "max_size": pool.max_size, "desired_size": pool.desired_size}


def ignore_changes(pool: NodePool) -> list[str] | None:
    return list(SCALED_IGNORE_CHANGES) if pool.scale_to_zero else None


def metadata_options() -> dict:
    """IMDSv2 only, hop limit 1: pods cannot reach the node's credentials; they use IRSA."""
    return {"http_endpoint": "enabled", "http_tokens": "required", "http_put_response_hop_limit": 1}


def root_volume(size_gib: int) -> list[dict]:
    return [{"device_name": ROOT_DEVICE, "ebs": {
        "volume_size": size_gib, "volume_type": "gp3", "encrypted": "true", "delete_on_termination": "true"}}]


def efa_interfaces(instance: catalog.InstanceType, security_group_ids: list) -> list[dict]:
    """One interface per network card: card 0 carries IP traffic too, the others are EFA-only."""
    return [{
        "network_card_index": card,
        "device_index": 0 if card == 0 else 1,
        "interface_type": "efa" if card == 0 else "efa-only",
        "security_groups": security_group_ids,
        "associate_public_ip_address": "false",
        "delete_on_termination": "true",
    } for card in range(instance.efa_interfaces)]


def launch_template(pool: NodePool, *, security_group_ids: list, placement_group: str | None,
                    tags: dict[str, str]) -> dict:
    """With a Capacity Block, EKS wants the market type and the instance type in the launch template itself."""
    tagged = ("instance", "volume", "network-interface") if pool.efa else ("instance", "volume")
    args: dict = {}
    if pool.efa:
        args["network_interfaces"] = efa_interfaces(pool.instance, security_group_ids)
    args.update({
        "metadata_options": metadata_options(),
        "block_device_mappings": root_volume(pool.disk_size_gib),
        "tag_specifications": [{"resource_type": kind, "tags": tags} for kind in tagged],
        "tags": tags,
    })
    if placement_group is not None:
        args["placement"] = {"group_name": placement_group}
    if pool.capacity_reservation_id:
        args["capacity_reservation_specification"] = {
            "capacity_reservation_target": {"capacity_reservation_id": pool.capacity_reservation_id}}
    if pool.capacity_type == "CAPACITY_BLOCK":
        args["instance_market_options"] = {"market_type": "capacity-block"}
        args["instance_type"] = pool.instance_type
    return args


def node_template(pool: NodePool) -> dict[str, str]:
    """What one node of a scaled pool offers, as the Cluster Autoscaler reads it from ASG tags at zero."""
    return node_facts.template_tags(resources.extended(pool.instance, efa=pool.efa), node_labels(pool), pool.taints)


def gpu_pools(pools: tuple[NodePool, ...]) -> tuple[NodePool, ...]:
    return tuple(p for p in pools if p.gpus)
