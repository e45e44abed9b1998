"""Apply the workloads to the cluster: one Kubernetes provider, namespaces, the IRSA service account,
three Helm releases (four with scaleToZero: the Cluster Autoscaler) and the RayCluster.

Every object here depends on the node groups (and CoreDNS) it is given, so `pulumi
destroy` removes everything inside the cluster before any node group goes, and the
RayCluster depends on the operator and the device plugins, so it is deleted while the
operator still runs to clean up its pods and Services.
"""
from __future__ import annotations

from typing import Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra.config import StackConfig
from workloads import charts, raycluster

IRSA_ANNOTATION = charts.IRSA_ANNOTATION
# Pod Security Admission: refuses privileged, hostNetwork and hostPath pods in the Ray namespace.
RAY_NAMESPACE_LABELS = {"pod-security.kubernetes.io/enforce": "baseline"}
HELM_TIMEOUT_S = 900


class RayWorkloads(pulumi.ComponentResource):
    """Device plugins, KubeRay operator and the digest-pinned RayCluster on an existing EKS cluster."""

    def __init__(self, name: str, cfg: StackConfig, *, image: pulumi.Input[str], kubeconfig: pulumi.Input[str],
                 irsa_role_arn: pulumi.Input[str], checkpoint_uri: pulumi.Input[str],
                 cluster_dependencies: Sequence[pulumi.Resource],
                 autoscaler_role_arn: pulumi.Input[str] | None = None,
                 autoscaler_dependencies: Sequence[pulumi.Resource] = (),
                 opts: pulumi.ResourceOptions | None = None):
        if cfg.scale_to_zero and autoscaler_role_arn is None:
            raise ValueError("raytrain-eks:scaleToZero: the Cluster Autoscaler needs its IRSA role; "
                             "pass autoscaler_role_arn (infra.autoscaling.ClusterAutoscalerRole)")
        super().__init__("raytrain:workloads:RayWorkloads", name, None, opts)
        self.provider = k8s.Provider(f"{name}-k8s", kubeconfig=kubeconfig, opts=pulumi.ResourceOptions(parent=self))
        after = list(cluster_dependencies)

        def in_cluster(*also: pulumi.Resource) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, provider=self.provider, depends_on=[*after, *also])

        self.namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=cfg.ray_namespace, labels=RAY_NAMESPACE_LABELS),
            opts=in_cluster())
        operator_namespace = k8s.core.v1.Namespace(
            f"{name}-operator-namespace", metadata=k8s.meta.v1.ObjectMetaArgs(name=charts.OPERATOR_NAMESPACE),
            opts=in_cluster())
        self.service_account = k8s.core.v1.ServiceAccount(
            f"{name}-service-account",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=cfg.ray_service_account, namespace=self.namespace.metadata.name,
                annotations={IRSA_ANNOTATION: irsa_role_arn}),
            automount_service_account_token=False,
            opts=in_cluster())

        self.releases: dict[str, k8s.helm.v3.Release] = {}

        def release(chart: charts.ChartRelease, values: pulumi.Input[dict], *also: pulumi.Resource) -> None:
            self.releases[chart.release] = k8s.helm.v3.Release(
                f"{name}-{chart.release}",
                name=chart.release,
                chart=chart.chart,
                version=chart.version,
                repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=chart.repository),
                namespace=chart.namespace,
                values=values,
                atomic=True,
                cleanup_on_fail=True,
                timeout=HELM_TIMEOUT_S,
                opts=in_cluster(*also))

        for chart in charts.releases(cfg):
            release(chart, chart.values, *([operator_namespace] if chart.namespace == charts.OPERATOR_NAMESPACE else []))
        if cfg.scale_to_zero:
            # After the node groups and their ASG tags, like everything in the cluster, so it goes before
            # any node group on destroy; after its role's policy, so it starts able to act.
            release(charts.cluster_autoscaler(cfg, role_arn=""),
                    pulumi.Output.from_input(autoscaler_role_arn).apply(
                        lambda arn: charts.cluster_autoscaler(cfg, role_arn=arn).values),
                    *autoscaler_dependencies)

        self.ray_cluster = k8s.apiextensions.CustomResource(
            f"{name}-raycluster",
            api_version=raycluster.API_VERSION,
            kind=raycluster.KIND,
            metadata=raycluster.metadata(cfg),
            spec=pulumi.Output.all(image, checkpoint_uri).apply(
                lambda a: raycluster.spec(cfg, image=a[0], checkpoint_uri=a[1])),
            opts=in_cluster(self.namespace, self.service_account, *self.releases.values()))
        self.register_outputs({})
