"""The Helm releases, as data: chart, pinned version, repository, namespace and values.

Device plugins run only on GPU nodes (their labels) and tolerate the GPU taint; the
KubeRay operator and, with scaleToZero, the Cluster Autoscaler run on the system node.
Versions come from the stack configuration, so an upgrade is a reviewed configuration
change, never a floating `latest`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from facts import nodes
from infra import autoscaling
from infra.config import StackConfig

NVIDIA_REPOSITORY = "https://nvidia.github.io/k8s-device-plugin"
EKS_CHARTS_REPOSITORY = "https://aws.github.io/eks-charts"
KUBERAY_REPOSITORY = "https://ray-project.github.io/kuberay-helm/"
AUTOSCALER_REPOSITORY = "https://kubernetes.github.io/autoscaler"
AUTOSCALER_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"

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


def _on_gpu_nodes() -> dict[str, Any]:
    return {"nodeSelector": dict(nodes.GPU_LABELS), "tolerations": [nodes.GPU_TAINT.toleration()]}


def nvidia_device_plugin(cfg: StackConfig) -> ChartRelease:
    """Advertises nvidia.com/gpu; its default affinity (nvidia.com/gpu.present=true) matches the GPU node labels."""
    return ChartRelease("nvidia-device-plugin", "nvidia-device-plugin", cfg.nvidia_device_plugin_version,
                        NVIDIA_REPOSITORY, DEVICE_PLUGIN_NAMESPACE, "gpu", _on_gpu_nodes())


def efa_device_plugin(cfg: StackConfig) -> ChartRelease:
    """Advertises vpc.amazonaws.com/efa; the chart's own toleration is only CriticalAddonsOnly."""
    return ChartRelease("aws-efa-k8s-device-plugin", "aws-efa-k8s-device-plugin", cfg.efa_device_plugin_version,
                        EKS_CHARTS_REPOSITORY, DEVICE_PLUGIN_NAMESPACE, "gpu", _on_gpu_nodes())


def kuberay_operator(cfg: StackConfig) -> ChartRelease:
    """Watches every namespace; its metrics Service stays ClusterIP."""
    return ChartRelease("kuberay-operator", "kuberay-operator", cfg.kuberay_version, KUBERAY_REPOSITORY,
                        OPERATOR_NAMESPACE, "system",
                        {"nodeSelector": dict(nodes.SYSTEM_LABELS), "service": {"type": "ClusterIP"}})


def releases(cfg: StackConfig) -> list[ChartRelease]:
    return [nvidia_device_plugin(cfg), efa_device_plugin(cfg), kuberay_operator(cfg)]


def chart_image(cfg: StackConfig, release: str) -> tuple[str, str]:
    """(repository, tag) the release runs; a tag may already carry its @sha256 digest (clusterAutoscalerImageTag)."""
    return {
        "nvidia-device-plugin": (NVIDIA_PLUGIN_IMAGE, f"v{cfg.nvidia_device_plugin_version.lstrip('v')}"),
        "aws-efa-k8s-device-plugin": EFA_PLUGIN_IMAGE,
        "kuberay-operator": (KUBERAY_OPERATOR_IMAGE, f"v{cfg.kuberay_version.lstrip('v')}"),
        "cluster-autoscaler": (AUTOSCALER_IMAGE, cfg.cluster_autoscaler_image_tag),
    }[release]


def image_to_pin(cfg: StackConfig, release: str) -> str:
    """What workloads.image.pin resolves: repository:tag, or repository@sha256 when the tag already has one."""
    repository, tag = chart_image(cfg, release)
    tag, _, digest = tag.partition("@")
    return f"{repository}@{digest}" if digest else f"{repository}:{tag}"


def with_pinned_image(chart: ChartRelease, cfg: StackConfig, reference: str) -> dict[str, Any]:
    """The release's values with its image pinned: `reference` is repository@sha256:<64 hex>."""
    repository, tag = chart_image(cfg, chart.release)
    digest = reference.rpartition("@")[2]
    image = {**chart.values.get("image", {}), "repository": repository, "tag": f"{tag.partition('@')[0]}@{digest}"}
    return {**chart.values, "image": image}


def autoscaler_args() -> dict[str, str]:
    """Empty GPU nodes go within minutes; Ray's /tmp/ray emptyDir must not pin a node."""
    return {
        "scale-down-unneeded-time": f"{autoscaling.SCALE_DOWN_UNNEEDED_MINUTES}m",
        "scale-down-delay-after-add": f"{autoscaling.SCALE_DOWN_DELAY_AFTER_ADD_MINUTES}m",
        "skip-nodes-with-local-storage": "false",
        "balance-similar-node-groups": "true",
        "expander": "least-waste",
    }


def cluster_autoscaler(cfg: StackConfig, *, role_arn: str) -> ChartRelease:
    """Resizes the node groups tagged for this cluster, through its own IRSA role.

    The image tag follows the Kubernetes minor (the chart's default image lags behind it); it is a
    tag, or tag@sha256:... when clusterAutoscalerImageTag carries a digest.
    """
    return ChartRelease(
        "cluster-autoscaler", "cluster-autoscaler", cfg.cluster_autoscaler_version, AUTOSCALER_REPOSITORY,
        autoscaling.CA_NAMESPACE, "system", {
            "fullnameOverride": "cluster-autoscaler",
            "cloudProvider": "aws",
            "awsRegion": cfg.region,
            "autoDiscovery": {"clusterName": cfg.cluster_name,
                              "tags": list(autoscaling.discovery_tags(cfg.cluster_name))},
            "image": {"repository": AUTOSCALER_IMAGE, "tag": cfg.cluster_autoscaler_image_tag},
            "rbac": {"serviceAccount": {"create": True, "name": autoscaling.CA_SERVICE_ACCOUNT,
                                        "annotations": {IRSA_ANNOTATION: role_arn}}},
            "extraArgs": autoscaler_args(),
            "nodeSelector": dict(nodes.SYSTEM_LABELS),
            "resources": {"requests": {"cpu": "100m", "memory": "300Mi"}, "limits": {"memory": "300Mi"}},
            "service": {"type": "ClusterIP"},
        })
