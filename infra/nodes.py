"""Launch-template data for both node groups, as pure functions of the configuration.

Kept apart from the Pulumi resources so the EFA interface layout, IMDS settings and
volumes are plain dicts that tests and the policy pack can read directly.
"""
from __future__ import annotations

from facts.catalog import GpuInstanceType

ROOT_DEVICE = "/dev/xvda"
GPU_ROOT_VOLUME_GIB = 200
SYSTEM_ROOT_VOLUME_GIB = 50


def metadata_options() -> dict:
    """IMDSv2 only, hop limit 1: pods cannot reach the node's credentials; they use IRSA."""
    return {"http_endpoint": "enabled", "http_tokens": "required", "http_put_response_hop_limit": 1}


def root_volume(size_gib: int) -> list[dict]:
    return [{"device_name": ROOT_DEVICE, "ebs": {
        "volume_size": size_gib, "volume_type": "gp3", "encrypted": "true", "delete_on_termination": "true"}}]


def efa_interfaces(gpu: GpuInstanceType, security_group_ids: list) -> list[dict]:
    """One interface per network card: card 0 carries IP traffic too, the others are EFA-only."""
    return [{
        "network_card_index": card,
        "device_index": 0 if card == 0 else 1,
        "interface_type": "efa" if card == 0 else "efa-only",
        "security_groups": security_group_ids,
        "associate_public_ip_address": "false",
        "delete_on_termination": "true",
    } for card in range(gpu.efa_interfaces)]


def gpu_launch_template(gpu: GpuInstanceType, *, security_group_ids: list, placement_group: str | None,
                        capacity_reservation_id: str | None, tags: dict[str, str],
                        capacity_block: bool = False) -> dict:
    """With a Capacity Block, EKS wants the market type and the instance type in the launch template itself."""
    args = {
        "network_interfaces": efa_interfaces(gpu, security_group_ids),
        "metadata_options": metadata_options(),
        "block_device_mappings": root_volume(GPU_ROOT_VOLUME_GIB),
        "tag_specifications": [{"resource_type": kind, "tags": tags} for kind in ("instance", "volume", "network-interface")],
        "tags": tags,
    }
    if placement_group is not None:
        args["placement"] = {"group_name": placement_group}
    if capacity_reservation_id:
        args["capacity_reservation_specification"] = {
            "capacity_reservation_target": {"capacity_reservation_id": capacity_reservation_id}}
    if capacity_block:
        args["instance_market_options"] = {"market_type": "capacity-block"}
        args["instance_type"] = gpu.name
    return args


def system_launch_template(tags: dict[str, str]) -> dict:
    return {
        "metadata_options": metadata_options(),
        "block_device_mappings": root_volume(SYSTEM_ROOT_VOLUME_GIB),
        "tag_specifications": [{"resource_type": kind, "tags": tags} for kind in ("instance", "volume")],
        "tags": tags,
    }
