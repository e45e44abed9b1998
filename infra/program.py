"""The whole stack, top-down. Nothing is declared at import time: tests run main() under mocks."""
from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra import aws_provider, iam, preflight
from infra import config as stack_config
from infra.autoscaling import ClusterAutoscalerRole
from infra.cluster import EksCluster
from infra.cost import cost_warnings, hourly_cost
from infra.network import Network
from infra.node_groups import GpuNodeGroup, SystemNodeGroup
from infra.storage import CheckpointStore
from infra.preflight import PlacementError  # noqa: F401 - raised by main(), kept importable from here
from workloads import image as dlc_image
from workloads.stack import RayWorkloads


def main(*, offline: bool = False) -> dict[str, pulumi.Output]:
    """The whole stack. `offline` (the mocks of infra.offline) lets placeholder values plan; nothing reaches AWS."""
    cfg = stack_config.from_pulumi()
    provider_args = aws_provider.provider_args(cfg.aws_settings, region=cfg.region, tags=cfg.resource_tags)
    # Lookups first, through a provider of their own: a stack the account cannot host stops here,
    # before the image is pinned and before any resource is registered.
    lookups = aws.Provider("aws-preflight", **provider_args)
    site = preflight.survey(cfg, pulumi.InvokeOptions(provider=lookups), reaches_aws=not offline)
    for warning in () if offline else cost_warnings(cfg):  # the offline plan prints them itself
        pulumi.log.warn(warning)
    # Pinned next, and every AWS resource waits on it (through the provider): a tag that cannot be
    # resolved stops `pulumi up` before anything billable exists.
    image, pinning = dlc_image.pin(cfg.dlc_image)
    provider = aws.Provider("aws", **provider_args, opts=pulumi.ResourceOptions(depends_on=pinning))
    with_provider = pulumi.ResourceOptions(providers={"aws": provider})

    gpu_az = site.gpu_zone.name
    network = Network("net", azs=[z.name for z in site.zones],
                      control_plane_azs=[z.name for z in site.control_plane_zones], cluster_name=cfg.cluster_name,
                      s3_endpoint_policy=iam.s3_endpoint_policy(cfg.region, preflight.principal(site.caller_arn)[0]),
                      region=cfg.region, tags=cfg.resource_tags, opts=with_provider)

    eks = EksCluster("cluster", cfg, subnet_ids=network.control_plane_subnet_ids, network_ready=network.egress,
                     opts=with_provider)
    node_opts = pulumi.ResourceOptions(providers={"aws": provider},
                                       depends_on=[*eks.early_addons, *eks.node_role_attachments])
    system = SystemNodeGroup("system", cfg, cluster_name=eks.cluster.name, node_role_arn=eks.node_role.arn,
                             subnet_ids=network.private_subnet_ids, opts=node_opts)
    gpu = GpuNodeGroup("gpu", cfg, cluster_name=eks.cluster.name, node_role_arn=eks.node_role.arn,
                       vpc_id=network.vpc.id, subnet_id=network.private_subnets[gpu_az].id,
                       cluster_security_group_id=eks.security_group_id, availability_zone=gpu_az, opts=node_opts)
    late_addons = eks.late_addons(depends_on=[system.node_group])
    store = CheckpointStore("checkpoints", cfg, oidc_provider_arn=eks.oidc_provider.arn,
                            oidc_issuer_url=eks.oidc_issuer, opts=with_provider)
    autoscaler = (ClusterAutoscalerRole("cluster-autoscaler", cfg, oidc_provider_arn=eks.oidc_provider.arn,
                                        oidc_issuer_url=eks.oidc_issuer, opts=with_provider)
                  if cfg.scale_to_zero else None)
    RayWorkloads("ray", cfg, image=image, kubeconfig=eks.kubeconfig, irsa_role_arn=store.role.arn,
                 checkpoint_uri=store.uri, cluster_dependencies=[system, gpu, *late_addons],
                 autoscaler_role_arn=autoscaler.role.arn if autoscaler else None,
                 autoscaler_dependencies=[autoscaler] if autoscaler else ())

    outputs = {
        "clusterName": eks.cluster.name,
        "region": pulumi.Output.from_input(cfg.region),
        "gpuAvailabilityZone": pulumi.Output.from_input(gpu_az),
        "gpuAvailabilityZoneId": pulumi.Output.from_input(site.gpu_zone.zone_id),
        "kubeconfig": eks.kubeconfig,
        "checkpointBucketUri": store.uri,
        "rayIrsaRoleArn": store.role.arn,
        "rayNamespace": pulumi.Output.from_input(cfg.ray_namespace),
        "rayHeadService": pulumi.Output.from_input(cfg.ray_head_service),
        "rayClusterName": pulumi.Output.from_input(cfg.ray_cluster_name),
        "gpuNodeType": pulumi.Output.from_input(cfg.gpu_node_type),
        "gpuNodeCount": pulumi.Output.from_input(cfg.gpu_node_count),
        "dashboardPortForward": pulumi.Output.from_input(
            f"kubectl -n {cfg.ray_namespace} port-forward svc/{cfg.ray_head_service} 8265:8265"),
        "estimatedCostPerHour": pulumi.Output.from_input(hourly_cost(cfg)),
        "dlcImage": image,
    }
    if autoscaler:
        outputs["clusterAutoscalerRoleArn"] = autoscaler.role.arn
    for name, value in outputs.items():
        pulumi.export(name, value)
    return outputs
