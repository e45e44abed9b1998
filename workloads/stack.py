"""Apply the workloads to the cluster: one Kubernetes provider, namespaces, the IRSA service account,
the Ray namespace's NetworkPolicies, the KubeRay chart version's CRDs (workloads.crds, through a
second provider that adopts the CRDs an earlier Helm install made), three Helm releases (four with
the Cluster Autoscaler, when a node pool scales to zero) and the RayCluster.

The RayCluster is declared whole on every stack and carries KubeRay's `upgradeStrategy: Recreate`
(raycluster.UPGRADE_STRATEGY): a change of its spec recreates every Ray pod from the new spec; with a
pool that scales to zero, an unchanged spec is never applied, so the autoscaler's replicas stay.

Every object here depends on the node groups (and CoreDNS) it is given, so `pulumi
destroy` removes everything inside the cluster before any node group goes, and the
RayCluster depends on the operator and the device plugins, so it is deleted while the
operator still runs to clean up its pods and Services.
"""
from __future__ import annotations

from typing import Sequence

import pulumi
import pulumi_kubernetes as k8s

from workloads import charts, crds, disruption, network_policy, raycluster
from workloads import image as dlc_image
from workloads.settings import Workloads

IRSA_ANNOTATION = charts.IRSA_ANNOTATION
# Pod Security Admission: refuses privileged, hostNetwork and hostPath pods in the Ray namespace.
RAY_NAMESPACE_LABELS = {"pod-security.kubernetes.io/enforce": "baseline"}
HELM_TIMEOUT_S = 900
CHARTS_WITH_CRDS = ("kuberay-operator",)  # their crds/ folders: declared here, skipped by Helm (workloads.crds)
CRD_SOURCE = "kuberayVersion"  # the setting that picks the KubeRay chart, named when its archive is missing

class RayWorkloads(pulumi.ComponentResource):
    """Device plugins, KubeRay operator and the digest-pinned RayCluster on an existing EKS cluster."""

    def __init__(self, name: str, settings: Workloads, *, image: pulumi.Input[str], kubeconfig: pulumi.Input[str],
                 irsa_role_arn: pulumi.Input[str], checkpoint_uri: pulumi.Input[str],
                 cluster_dependencies: Sequence[pulumi.Resource],
                 autoscaler_role_arn: pulumi.Input[str] | None = None,
                 autoscaler_dependencies: Sequence[pulumi.Resource] = (),
                 crd_digests: bool = False,
                 opts: pulumi.ResourceOptions | None = None):
        """`irsa_role_arn`: the Ray pods' role; `autoscaler_role_arn`: the Cluster Autoscaler's, when it runs.

        `crd_digests` (offline plans only, never applied): each CRD's spec declared as its digest
        (crds.digest): the update diff needs only whether it changed, and KubeRay's 4 MB of schemas
        made every offline plan ten times slower."""
        if settings.cluster_autoscaler and autoscaler_role_arn is None:
            raise ValueError("the Cluster Autoscaler needs its IRSA role: pass autoscaler_role_arn")
        super().__init__("raytrain:workloads:RayWorkloads", name, None, opts)
        self.provider = k8s.Provider(f"{name}-k8s", kubeconfig=kubeconfig, opts=pulumi.ResourceOptions(parent=self))
        after = list(cluster_dependencies)

        def in_cluster(*also: pulumi.Resource) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, provider=self.provider, depends_on=[*after, *also])

        self.namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=settings.namespace, labels=RAY_NAMESPACE_LABELS),
            opts=in_cluster())
        operator_namespace = k8s.core.v1.Namespace(
            f"{name}-operator-namespace", metadata=k8s.meta.v1.ObjectMetaArgs(name=charts.OPERATOR_NAMESPACE),
            opts=in_cluster())
        self.service_account = k8s.core.v1.ServiceAccount(
            f"{name}-service-account",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=settings.service_account, namespace=self.namespace.metadata.name,
                annotations={IRSA_ANNOTATION: irsa_role_arn}),
            automount_service_account_token=False,
            opts=in_cluster())

        self.crds = self._declare_crds(name, settings, kubeconfig, after, digests=crd_digests)
        self.releases: dict[str, k8s.helm.v3.Release] = {}

        def release(chart: charts.ChartRelease, values: pulumi.Input[dict], *also: pulumi.Resource) -> None:
            own_crds = chart.chart in CHARTS_WITH_CRDS
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
                skip_crds=own_crds or None,
                opts=in_cluster(*also, *(self.crds if own_crds else ())))

        self.image_pins: dict[str, list[pulumi.Resource]] = {}

        def pinned(chart_name: str) -> pulumi.Output[str]:
            """The chart's image pinned by digest, resolved at preview and kept in state like the DLC image."""
            reference, pins = dlc_image.pin(
                charts.image_to_pin(settings, chart_name), name=f"{name}-{chart_name}-image",
                subject=f"the {chart_name} chart's image ({charts.IMAGE_SOURCE})",
                opts=pulumi.ResourceOptions(parent=self))
            self.image_pins[chart_name] = pins
            return reference

        for chart in charts.releases(settings):
            values = pinned(chart.release).apply(lambda ref, c=chart: charts.with_pinned_image(c, settings, ref))
            release(chart, values, *([operator_namespace] if chart.namespace == charts.OPERATOR_NAMESPACE else []))
        if settings.cluster_autoscaler:
            # After the node groups and their ASG tags, like everything in the cluster, so it goes before
            # any node group on destroy; after its role's policy, so it starts able to act.
            release(charts.cluster_autoscaler(settings, role_arn=""),
                    pulumi.Output.all(autoscaler_role_arn, pinned("cluster-autoscaler")).apply(
                        lambda a: charts.with_pinned_image(charts.cluster_autoscaler(settings, role_arn=a[0]), settings, a[1])),
                    *autoscaler_dependencies)

        self.network_policies = [
            k8s.networking.v1.NetworkPolicy(
                f"{name}-netpol-{policy['metadata']['name']}",
                metadata=policy["metadata"], spec=policy["spec"], opts=in_cluster(self.namespace))
            for policy in network_policy.policies(settings)
        ]

        self.priority_class = k8s.scheduling.v1.PriorityClass(
            f"{name}-priority-class", **_fields(disruption.priority_class(settings)), opts=in_cluster())
        self.disruption_budgets = [
            k8s.policy.v1.PodDisruptionBudget(
                f"{name}-pdb-{pdb['metadata']['name']}", metadata=pdb["metadata"], spec=pdb["spec"],
                opts=in_cluster(self.namespace))
            for pdb in disruption.budgets(settings)
        ]

        manifest = pulumi.Output.all(image, checkpoint_uri).apply(
            lambda a: prioritized_manifest(settings, image=a[0], checkpoint_uri=a[1]))
        cluster_opts = in_cluster(self.namespace, self.service_account, *self.network_policies,
                                  *self.releases.values(), self.priority_class, *self.disruption_budgets)
        self.ray_cluster = k8s.apiextensions.CustomResource(
            f"{name}-raycluster",
            api_version=raycluster.API_VERSION,
            kind=raycluster.KIND,
            metadata=manifest.apply(lambda m: m["metadata"]),
            spec=manifest.apply(lambda m: m["spec"]),
            opts=cluster_opts)
        self.register_outputs({})

    def _declare_crds(self, name: str, settings: Workloads, kubeconfig: pulumi.Input[str],
                      after: list[pulumi.Resource], *,
                      digests: bool) -> list[k8s.apiextensions.v1.CustomResourceDefinition]:
        """The KubeRay chart version's own CRDs, applied on every version change (Helm applies them only once).

        Their provider upserts (a stack Helm installed already has them: pulumi-kubernetes >= 4.29 would
        answer AlreadyExists) and forces the fields Helm's field manager holds. They are retained on
        destroy and never replaced: deleting a CRD deletes every RayCluster and RayJob of it.
        """
        provider = k8s.Provider(f"{name}-crd-k8s", kubeconfig=kubeconfig, upsert_existing_objects=True,
                                enable_patch_force=True, opts=pulumi.ResourceOptions(parent=self))
        chart = charts.kuberay_operator(settings)
        return [
            k8s.apiextensions.v1.CustomResourceDefinition(
                f"{name}-crd-{crd['metadata']['name']}", metadata=crd["metadata"],
                spec=crds.digest(crd["spec"]) if digests else crd["spec"],
                opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=after, retain_on_delete=True))
            for crd in crds.of_release(chart, where=f"raytrain-eks:{CRD_SOURCE} {chart.version}")
        ]


def _fields(obj: dict) -> dict:
    """A PriorityClass's fields as the resource's keyword arguments."""
    return {"metadata": obj["metadata"], "value": obj["value"], "global_default": obj["globalDefault"],
            "preemption_policy": obj["preemptionPolicy"], "description": obj["description"]}


def prioritized_manifest(settings: Workloads, *, image: str, checkpoint_uri: str) -> dict:
    """The RayCluster whose pods carry the PriorityClass (workloads.disruption); KubeRay recreates
    the pods when it changes (upgradeStrategy Recreate)."""
    plain = raycluster.manifest(settings, image=image, checkpoint_uri=checkpoint_uri)
    return {**plain, "spec": disruption.prioritized(plain["spec"])}
