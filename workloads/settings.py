"""What the workloads are made of, as their own typed input: the composition root fills it from the stack.

The workloads know nothing of the stack configuration or of the AWS side: a Workloads value says
which versions to install, where the Ray head and the operator run, and which Ray worker groups
exist on which nodes, so the RayCluster, the Helm releases and the NetworkPolicies are pure
functions of it and a second set of workloads is a second value.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from facts import ray as ray_facts
from facts.catalog import CpuInstanceType, InstanceType
from facts.nodes import Taint


@dataclass(frozen=True)
class WorkerGroup:
    """One Ray worker group: one worker pod per node of its pool, claiming the whole node."""

    name: str
    instance: InstanceType
    min_replicas: int
    max_replicas: int
    node_selector: Mapping[str, str]
    tolerations: tuple[Taint, ...] = ()
    efa: bool = False  # the nodes have their EFA interfaces
    autoscaled: bool = False  # KubeRay's autoscaler owns its replicas (the pool scales to zero)
    ray_labels: Mapping[str, str] = field(default_factory=dict)  # Ray node labels: what label selectors pick

    @property
    def gpus(self) -> int:
        return self.instance.gpus


@dataclass(frozen=True)
class Workloads:
    project: str
    region: str
    cluster_name: str  # the EKS cluster's: what the Cluster Autoscaler discovers
    namespace: str
    ray_version: str
    kuberay_version: str
    nvidia_device_plugin_version: str
    efa_device_plugin_version: str
    nccl_debug: str
    head_instance: CpuInstanceType
    system_node_selector: Mapping[str, str]  # the Ray head, the operator and the Cluster Autoscaler
    gpu_node_selector: Mapping[str, str]  # the device plugins: labels every GPU node has
    gpu_tolerations: tuple[Taint, ...]  # and the taints of every GPU pool
    worker_groups: tuple[WorkerGroup, ...] = ()
    cluster_autoscaler: bool = False  # a node pool scales to zero
    idle_timeout_minutes: int = 10
    cluster_autoscaler_version: str = ""
    cluster_autoscaler_image_tag: str = ""
    ray_cluster_name: str = ray_facts.CLUSTER_NAME
    service_account: str = ray_facts.SERVICE_ACCOUNT

    @property
    def autoscaled(self) -> bool:
        """KubeRay's autoscaler runs when a worker group scales."""
        return any(g.autoscaled for g in self.worker_groups)
