"""Where resources lived before node pools, so `pulumi up` on an existing stack replaces none of them.

Until node pools, the GPU and system node groups were components of their own types, the EFA
security group was a child of the GPU node group, and the two IRSA roles were children of the
checkpoint store and of a ClusterAutoscalerRole component. A resource whose URN changes is, to
Pulumi, a new resource plus a deleted one; these aliases tell the engine the old URN, so the
update moves each resource in the state instead of recreating node groups, security groups and
roles. A pool that never existed under the old layout has aliases that match nothing, which
Pulumi ignores.
"""
from __future__ import annotations

import pulumi
from pulumi.runtime.resource import create_urn

GPU_NODE_GROUP = "raytrain:infra:GpuNodeGroup"
SYSTEM_NODE_GROUP = "raytrain:infra:SystemNodeGroup"
CHECKPOINT_STORE = ("raytrain:infra:CheckpointStore", "checkpoints")
CLUSTER_AUTOSCALER_ROLE = "raytrain:infra:ClusterAutoscalerRole"


def node_group(has_gpus: bool) -> list[pulumi.Alias]:
    """The node-group component of a pool was a GpuNodeGroup or a SystemNodeGroup of the same name."""
    return [pulumi.Alias(type_=GPU_NODE_GROUP if has_gpus else SYSTEM_NODE_GROUP)]


def renamed(component_type: str) -> pulumi.ResourceOptions:
    """A component (and so its children) that had another type."""
    return pulumi.ResourceOptions(aliases=[pulumi.Alias(type_=component_type)])


def children_of(component_type: str, name: str) -> list[pulumi.Alias]:
    """For a resource that was a child of the component `name` of `component_type`, at the stack's root."""
    return [pulumi.Alias(parent=create_urn(name, component_type))]
