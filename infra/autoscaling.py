"""Scale-to-zero on the AWS side: the Auto Scaling Group tags from which the Cluster Autoscaler learns a pool.

With a pool's `scaleToZero` the KubeRay autoscaler adds a Ray worker pod when a job asks for
its resources and removes it after `gpuIdleTimeoutMinutes` idle; the Cluster Autoscaler (CA)
adds a node for a Pending pod and removes a node that stays empty for a few minutes
(workloads.charts). So an idle stack bills no node of such a pool.

A node group at zero has no node CA could copy, so CA imagines one: instance type, CPU and memory
from the launch template, labels and taints from eks:DescribeNodegroup, and everything else from
node-template tags on the Auto Scaling Group (infra.node_pools.node_template). Extended resources
(GPUs, EFA devices, huge pages) exist only there, and EKS does not copy node-group tags to its
ASG, so they are set on the ASG itself (aws.autoscaling.Tag). Without them CA never scales a GPU
group up from zero.
"""
from __future__ import annotations

import re

from facts.autoscaler import discovery_tags
from facts.nodes import AUTOSCALER_PREFIX
from infra import node_pools
from infra.node_pools import NodePool


def asg_tags(pool: NodePool, cluster_name: str) -> dict[str, str]:
    """Tags for a pool's Auto Scaling Group; none unless it scales to zero."""
    if not pool.scale_to_zero:
        return {}
    return {**discovery_tags(cluster_name), **node_pools.node_template(pool)}


def tag_resource_name(key: str) -> str:
    """k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu -> node-template-resources-nvidia-com-gpu"""
    return re.sub(r"[^A-Za-z0-9]+", "-", key.removeprefix(f"{AUTOSCALER_PREFIX}/")).strip("-").lower()
