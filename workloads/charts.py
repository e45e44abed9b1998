"""The Helm releases, as data: chart, pinned version, repository, namespace and values.

Device plugins run on every GPU node (the labels all GPU pools share) and tolerate the GPU
pools' taints; the KubeRay operator and, when a pool scales to zero, the Cluster Autoscaler
run on the system node. Versions come from the stack configuration, so an upgrade is a
reviewed configuration change, never a floating `latest`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from facts import autoscaler
from workloads.settings import Workloads

NVIDIA_REPOSITORY = "https://nvidia.github.io/k8s-device-plugin"
EKS_CHARTS_REPOSITORY = "https://aws.github.io/eks-charts"
KUBERAY_REPOSITORY = "https://ray-project.github.io/kuberay-helm/"
AUTOSCALER_REPOSITORY = "https://kubernetes.github.io/autoscaler"
AUTOSCALER_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"
# Empty nodes go within minutes (CA's defaults are 10): also no scale-down for that long after a scale-up.
SCALE_DOWN_UNNEEDED_MINUTES = 5
SCALE_DOWN_DELAY_AFTER_ADD_MINUTES = 5

DEVICE_PLUGIN_NAMESPACE = "kube-system"
OPERATOR_NAMESPACE = "kuberay-system"


# What each chart runs, as registry/repository and tag before pinning: the chart's own image for its
# version (its appVersion), pinned by digest at deploy time (workloads.image.pin, kept in state) and
# handed to the chart as `image.tag: <tag>@sha256:...`, which every one of these charts renders as
# repository:tag@digest. The EFA plugin comes from AWS's public mirror, which resolves anonymously
# (the chart's default is a private ECR account in us-west-2); its tag is the appVersion of chart
# v0.5.30, the newest published archive.
EFA_PLUGIN_IMAGE = ("public.ecr.aws/eks/aws-efa-k8s-device-plugin", "v0.5.20")
NVIDIA_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin"
KUBERAY_OPERATOR_IMAGE = "quay.io/kuberay/operator"
IMAGE_SOURCE = "chart_image() in workloads/charts.py"


@dataclass(frozen=True)
class ChartRelease:
    release: str
    chart: str
    version: str
    repository: str
    namespace: str
    runs_on: str  # "gpu" or "system": which node group its pods land on
    values: dict[str, Any] = field(default_factory=dict)


def _on_gpu_nodes(settings: Workloads) -> dict[str, Any]:
    return {"nodeSelector": dict(settings.gpu_node_selector),
            "tolerations": [t.toleration() for t in settings.gpu_tolerations]}


def nvidia_device_plugin(settings: Workloads) -> ChartRelease:
    """Advertises nvidia.com/gpu; its default affinity (nvidia.com/gpu.present=true) matches the GPU node labels."""
    return ChartRelease("nvidia-device-plugin", "nvidia-device-plugin", settings.nvidia_device_plugin_version,
                        NVIDIA_REPOSITORY, DEVICE_PLUGIN_NAMESPACE, "gpu", _on_gpu_nodes(settings))


def efa_device_plugin(settings: Workloads) -> ChartRelease:
    """Advertises vpc.amazonaws.com/efa; the chart's own toleration is only CriticalAddonsOnly."""
    return ChartRelease("aws-efa-k8s-device-plugin", "aws-efa-k8s-device-plugin", settings.efa_device_plugin_version,
                        EKS_CHARTS_REPOSITORY, DEVICE_PLUGIN_NAMESPACE, "gpu", _on_gpu_nodes(settings))


def kuberay_operator(settings: Workloads) -> ChartRelease:
    """Watches every namespace; its metrics Service stays ClusterIP."""
    return ChartRelease("kuberay-operator", "kuberay-operator", settings.kuberay_version, KUBERAY_REPOSITORY,
                        OPERATOR_NAMESPACE, "system",
                        {"nodeSelector": dict(settings.system_node_selector), "service": {"type": "ClusterIP"}})


def releases(settings: Workloads) -> list[ChartRelease]:
    return [nvidia_device_plugin(settings), efa_device_plugin(settings), kuberay_operator(settings)]


def chart_image(settings: Workloads, release: str) -> tuple[str, str]:
    """(repository, tag) the release runs; a tag may already carry its @sha256 digest (clusterAutoscalerImageTag)."""
    return {
        "nvidia-device-plugin": (NVIDIA_PLUGIN_IMAGE, f"v{settings.nvidia_device_plugin_version.lstrip('v')}"),
        "aws-efa-k8s-device-plugin": EFA_PLUGIN_IMAGE,
        "kuberay-operator": (KUBERAY_OPERATOR_IMAGE, f"v{settings.kuberay_version.lstrip('v')}"),
        "cluster-autoscaler": (AUTOSCALER_IMAGE, settings.cluster_autoscaler_image_tag),
    }[release]


def image_to_pin(settings: Workloads, release: str) -> str:
    """What workloads.image.pin resolves: repository:tag, or repository@sha256 when the tag already has one."""
    repository, tag = chart_image(settings, release)
    tag, _, digest = tag.partition("@")
    return f"{repository}@{digest}" if digest else f"{repository}:{tag}"


def with_pinned_image(chart: ChartRelease, settings: Workloads, reference: str) -> dict[str, Any]:
    """The release's values with its image pinned: `reference` is repository@sha256:<64 hex>."""
    repository, tag = chart_image(settings, chart.release)
    digest = reference.rpartition("@")[2]
    image = {**chart.values.get("image", {}), "repository": repository, "tag": f"{tag.partition('@')[0]}@{digest}"}
    return {**chart.values, "image": image}


def autoscaler_args() -> dict[str, str]:
    """Empty GPU nodes go within minutes; Ray's /tmp/ray emptyDir must not pin a node."""
    return {
        "scale-down-unneeded-time": f"{SCALE_DOWN_UNNEEDED_MINUTES}m",
        "scale-down-delay-after-add": f"{SCALE_DOWN_DELAY_AFTER_ADD_MINUTES}m",
        "skip-nodes-with-local-storage": "false",
        "balance-similar-node-groups": "true",
        "expander": "least-waste",
    }


def cluster_autoscaler(settings: Workloads, *, role_arn: str) -> ChartRelease:
    """Resizes the node groups tagged for this cluster, through its own IRSA role.

    The image tag follows the Kubernetes minor (the chart's default image lags behind it); it is a
    tag, or tag@sha256:... when clusterAutoscalerImageTag carries a digest.
    """
    return ChartRelease(
        "cluster-autoscaler", "cluster-autoscaler", settings.cluster_autoscaler_version, AUTOSCALER_REPOSITORY,
        autoscaler.NAMESPACE, "system", {
            "fullnameOverride": "cluster-autoscaler",
            "cloudProvider": "aws",
            "awsRegion": settings.region,
            "autoDiscovery": {"clusterName": settings.cluster_name,
                              "tags": list(autoscaler.discovery_tags(settings.cluster_name))},
            "image": {"repository": AUTOSCALER_IMAGE, "tag": settings.cluster_autoscaler_image_tag},
            "rbac": {"serviceAccount": {"create": True, "name": autoscaler.SERVICE_ACCOUNT,
                                        "annotations": {IRSA_ANNOTATION: role_arn}}},
            "extraArgs": autoscaler_args(),
            "nodeSelector": dict(settings.system_node_selector),
            "resources": {"requests": {"cpu": "100m", "memory": "300Mi"}, "limits": {"memory": "300Mi"}},
            "service": {"type": "ClusterIP"},
        })
