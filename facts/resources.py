"""Kubernetes extended-resource names, and the huge pages an EFA node sets aside.

What a node advertises (device plugins), what a Ray worker that claims the whole node requests,
and what the Cluster Autoscaler's node template promises for a node group at zero are one set of
names and quantities, computed here from the instance catalog.
"""
from __future__ import annotations

import math
from typing import Any

GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"
HUGEPAGES_2MI = "hugepages-2Mi"

# The EFA driver pre-allocates 5128 x 2 MiB huge pages at boot; pods that use EFA request 5120Mi
# (EKS user guide, node-efa). The kubelet does not count them as allocatable memory.
EFA_PREALLOCATED_HUGEPAGES = 5128
EFA_HUGEPAGES_REQUEST = "5120Mi"
EFA_PREALLOCATED_HUGEPAGES_GIB = math.ceil(EFA_PREALLOCATED_HUGEPAGES * 2 / 1024)

# Left on a worker node for the OS, kubelet, eviction threshold and the daemon sets (VPC CNI, kube-proxy, both
# device plugins on GPU nodes): 10 %, at least 2 cores and 8 GiB.
NODE_RESERVE_FRACTION = 0.1
NODE_RESERVE_MIN_CPU = 2
NODE_RESERVE_MIN_MEMORY_GIB = 8

# A node's root volume (gp3) unless its pool's diskSize says otherwise (infra.node_pools launches it).
GPU_ROOT_VOLUME_GIB = 200
CPU_ROOT_VOLUME_GIB = 50


def worker_cpus(instance: Any) -> int:
    """The CPU request and limit of the Ray worker pod on one node of `instance` (workloads.raycluster's worker
    group): the node's vCPUs less the reserve. What the data preparation can run on."""
    return instance.vcpus - max(NODE_RESERVE_MIN_CPU, math.ceil(instance.vcpus * NODE_RESERVE_FRACTION))


def worker_memory_gib(instance: Any, *, efa: bool = True) -> int:
    """The memory request and limit of the Ray worker pod on one node of `instance` (workloads.raycluster's worker
    group; the memory plan's host check for --offload cpu): the node less the reserve and, on nodes with EFA,
    the pre-allocated huge pages."""
    reserve = max(NODE_RESERVE_MIN_MEMORY_GIB, math.ceil(instance.memory_gib * NODE_RESERVE_FRACTION))
    hugepages = EFA_PREALLOCATED_HUGEPAGES_GIB if efa and instance.efa_interfaces else 0
    return instance.memory_gib - reserve - hugepages


def extended(instance: Any, *, efa: bool = True) -> dict[str, str]:
    """GPUs, EFA devices and EFA huge pages of one node of `instance` (a facts.catalog row); none on a CPU type.

    `efa` False: the node was launched without its EFA interfaces, so it has no EFA device.
    """
    found: dict[str, str] = {}
    if instance.gpus:
        found[GPU] = str(instance.gpus)
    if efa and instance.efa_interfaces:
        found[EFA] = str(instance.efa_interfaces)
        found[HUGEPAGES_2MI] = EFA_HUGEPAGES_REQUEST
    return found
