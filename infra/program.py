"""The whole stack, top-down. Nothing is declared at import time: tests run main() under mocks."""
from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra import config as stack_config
from infra.autoscaling import ClusterAutoscalerRole
from infra.cluster import EksCluster
from infra.config import StackConfig
from infra.cost import hourly_cost
from infra.network import Network, choose_azs
from infra.node_groups import GpuNodeGroup, SystemNodeGroup
from infra.storage import CheckpointStore
from workloads import image as dlc_image
from workloads.stack import RayWorkloads


class PlacementError(ValueError):
    """The region cannot host the configured GPU type where asked."""


def gpu_availability_zone(cfg: StackConfig, offered: list[str]) -> str:
    """The configured AZ if it offers the GPU type, else the first AZ that does."""
    if not offered:
        raise PlacementError(
            f"raytrain-eks:gpuNodeType: {cfg.gpu_node_type} is not offered in any availability zone of "
            f"{cfg.region}; pick another region (aws:region) or GPU type")
    if cfg.availability_zone is None:
        return sorted(offered)[0]
    if cfg.availability_zone not in offered:
        raise PlacementError(
            f"raytrain-eks:availabilityZone: {cfg.availability_zone} does not offer {cfg.gpu_node_type}; "
            f"use one of {', '.join(sorted(offered))} or unset it")
    return cfg.availability_zone


def offered_zones(instance_type: str, opts: pulumi.InvokeOptions) -> list[str]:
    result = aws.ec2.get_instance_type_offerings(
        location_type="availability-zone",
        filters=[aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=[instance_type])],
        opts=opts)
    return list(result.locations)


def main() -> dict[str, pulumi.Output]:
    cfg = stack_config.from_pulumi()
    # Pinned first, and every AWS resource waits on it (through the provider): a tag that cannot be
    # resolved stops `pulumi up` before anything billable exists.
    image, pinning = dlc_image.pin(cfg.dlc_image)
    provider = aws.Provider("aws", region=cfg.region, default_tags=aws.ProviderDefaultTagsArgs(tags=cfg.resource_tags),
                            opts=pulumi.ResourceOptions(depends_on=pinning))
    with_provider = pulumi.ResourceOptions(providers={"aws": provider})
    invoke = pulumi.InvokeOptions(provider=provider)

    region_azs = list(aws.get_availability_zones(state="available", opts=invoke).names)
    gpu_az = gpu_availability_zone(cfg, offered_zones(cfg.gpu_node_type, invoke))
    network = Network("net", azs=choose_azs(region_azs, gpu_az), cluster_name=cfg.cluster_name,
                      tags=cfg.resource_tags, opts=with_provider)

    eks = EksCluster("cluster", cfg, subnet_ids=network.private_subnet_ids, network_ready=network.egress,
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
