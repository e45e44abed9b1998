"""The whole stack, top-down: the configuration turned into components. Nothing is declared at import time."""
from __future__ import annotations

import pulumi
import pulumi_aws as aws

from deploy import aws_requests
from deploy import config as stack_config
from deploy.config import StackConfig
from facts import autoscaler as autoscaler_facts
from facts import outputs as names
from facts import ray as ray_facts
from infra import aws_provider, aws_rules, iam, legacy, preflight
from infra.cluster import EksCluster
from infra.cost import cost_warnings, hourly_cost
from infra.irsa import IrsaRole
from infra.monitoring import CloudWatchObservability
from infra.network import Network
from infra.node_group import EfaFabric, NodeGroup
from infra.node_pools import NodePool
from infra.storage import CheckpointStore
from workloads import image as dlc_image
from workloads.settings import WorkerGroup, Workloads
from workloads.stack import RayWorkloads, prioritized_manifest


def workloads(cfg: StackConfig) -> Workloads:
    """What runs in the cluster, from the configuration: one Ray worker group per pool that carries one."""
    gpu_pools = cfg.gpu_pools
    shared = set.intersection(*(set(p.labels.items()) for p in gpu_pools)) if gpu_pools else set()
    taints = list(dict.fromkeys(t for p in gpu_pools for t in p.taints))
    return Workloads(
        project=cfg.project, region=cfg.region, cluster_name=cfg.cluster_name, namespace=cfg.ray_namespace,
        ray_version=cfg.ray_version, kuberay_version=cfg.kuberay_version,
        nvidia_device_plugin_version=cfg.nvidia_device_plugin_version,
        efa_device_plugin_version=cfg.efa_device_plugin_version, nccl_debug=cfg.nccl_debug,
        head_instance=cfg.system_pool.instance, system_node_selector=dict(cfg.system_pool.labels),
        gpu_node_selector={k: v for k, v in (gpu_pools[0].labels.items() if gpu_pools else ()) if (k, v) in shared},
        gpu_tolerations=tuple(taints),
        worker_groups=tuple(worker_group(p) for p in cfg.node_pools if p.ray_worker_group),
        cluster_autoscaler=cfg.scale_to_zero, idle_timeout_minutes=cfg.gpu_idle_timeout_minutes,
        cluster_autoscaler_version=cfg.cluster_autoscaler_version,
        cluster_autoscaler_image_tag=cfg.cluster_autoscaler_image_tag,
        ray_cluster_name=cfg.ray_cluster_name, service_account=cfg.ray_service_account)


def worker_group(pool: NodePool) -> WorkerGroup:
    """The pool's Ray workers; they carry the pool's Ray label, which `trainer submit --pool` selects."""
    return WorkerGroup(name=pool.ray_worker_group, instance=pool.instance, min_replicas=pool.min_size,
                       max_replicas=pool.max_size, node_selector=dict(pool.labels),
                       tolerations=pool.taints, efa=pool.efa,
                       autoscaled=pool.scale_to_zero, ray_labels=ray_facts.pool_labels(pool.name))


def pool_outputs(cfg: StackConfig) -> dict[str, dict]:
    """Every pool, as `trainer submit --stack` reads it (facts.outputs names the keys it relies on)."""
    return {p.name: {names.POOL_INSTANCE_TYPE: p.instance_type, "minSize": p.min_size, names.POOL_MAX_SIZE: p.max_size,
                     names.POOL_GPUS_PER_NODE: p.gpus, "scaleToZero": p.scale_to_zero,
                     names.POOL_DISK_SIZE_GIB: p.disk_size_gib,
                     names.POOL_RAY_WORKER_GROUP: p.ray_worker_group,
                     names.POOL_RAY_LABELS: ray_facts.pool_labels(p.name) if p.ray_worker_group else {}}
            for p in cfg.node_pools}


def main(*, offline: bool = False) -> dict[str, pulumi.Output]:
    """The whole stack. `offline` (the mocks of deploy.offline) lets placeholder values plan; nothing reaches AWS."""
    cfg = stack_config.from_pulumi()
    if not offline:  # the offline plan checks every request itself (deploy.plan), with the mocks' values
        pulumi.runtime.register_resource_transform(aws_requests.preview_transform())
    tags = cfg.resource_tags
    provider_args = aws_provider.provider_args(cfg.aws_settings, region=cfg.region, tags=tags)
    # Lookups first, through a provider of their own: a stack the account cannot host stops here,
    # before the image is pinned and before any resource is registered.
    lookups = aws.Provider("aws-preflight", **provider_args)
    site = preflight.survey(cfg.node_pools, region=cfg.region, gpu_zone=cfg.availability_zone,
                            admin_role_arns=cfg.admin_role_arns, placeholders=() if offline else cfg.placeholders,
                            invoke=pulumi.InvokeOptions(provider=lookups), cluster_name=cfg.cluster_name,
                            kubernetes_version=cfg.kubernetes_version)
    for warning in () if offline else cost_warnings(cfg.node_pools, cfg.cost_warning_per_day):
        pulumi.log.warn(warning)  # the offline plan prints them itself
    # Pinned next, and every AWS resource waits on it (through the provider): a tag that cannot be
    # resolved stops `pulumi up` before anything billable exists.
    image, pinning = dlc_image.pin(cfg.dlc_image)
    provider = aws.Provider("aws", **provider_args, opts=pulumi.ResourceOptions(depends_on=pinning))
    with_provider = pulumi.ResourceOptions(providers={"aws": provider})

    network = Network("net", azs=[z.name for z in site.zones],
                      control_plane_azs=[z.name for z in site.control_plane_zones], cluster_name=cfg.cluster_name,
                      s3_endpoint_policy=iam.s3_endpoint_policy(cfg.region, preflight.principal(site.caller_arn)[0],
                                                                aws_rules.partition(cfg.region)),
                      region=cfg.region, tags=tags, opts=with_provider)
    eks = EksCluster("cluster", cluster_name=cfg.cluster_name, kubernetes_version=cfg.kubernetes_version,
                     region=cfg.region, api_access_cidrs=cfg.api_access_cidrs, admin_role_arns=cfg.admin_role_arns,
                     log_retention_days=cfg.control_plane_log_retention_days,
                     subnet_ids=network.control_plane_subnet_ids, network_ready=network.egress, tags=tags,
                     opts=with_provider)

    node_opts = pulumi.ResourceOptions(providers={"aws": provider},
                                       depends_on=[*eks.early_addons, *eks.node_role_attachments])
    # One EFA fabric per zone with EFA pools, named after the first of them.
    fabrics: dict[str, EfaFabric] = {}
    for pool in (p for p in cfg.node_pools if p.efa):
        zone = site.pool_zones[pool.name].name
        if zone not in fabrics:
            fabrics[zone] = EfaFabric(pool.name, vpc_id=network.vpc.id, tags=tags, opts=node_opts)
    groups: dict[str, NodeGroup] = {}
    for pool in cfg.node_pools:
        zone = site.pool_zones.get(pool.name)
        subnets = [network.private_subnets[zone.name].id] if zone else network.private_subnet_ids
        fabric = [fabrics[zone.name].security_group.id] if pool.efa else []
        groups[pool.name] = NodeGroup(
            pool, cluster_name=eks.cluster.name, cluster_name_tag=cfg.cluster_name, node_role_arn=eks.node_role.arn,
            subnet_ids=subnets, availability_zone=zone.name if zone else None,
            security_group_ids=[eks.security_group_id, *fabric], tags=tags,
            kubernetes_version=cfg.kubernetes_version, opts=node_opts)
    late_addons = eks.late_addons(depends_on=[groups[cfg.system_pool.name].node_group])

    store = CheckpointStore("checkpoints", bucket=cfg.checkpoint_bucket,
                            bucket_prefix=aws_rules.bucket_prefix(cfg.cluster_name),
                            retain=cfg.retain_checkpoints_on_destroy,
                            noncurrent_version_expiration_days=cfg.noncurrent_version_expiration_days, tags=tags,
                            opts=with_provider)
    ray_role = IrsaRole("checkpoints", oidc_provider_arn=eks.oidc_provider.arn, oidc_issuer_url=eks.oidc_issuer,
                        namespace=cfg.ray_namespace, service_account=cfg.ray_service_account,
                        policies={"s3": store.bucket.arn.apply(iam.bucket_read_write)},
                        description=f"Ray pods of {cfg.cluster_name}: read and write the checkpoint bucket",
                        tags=tags, moved_from=legacy.CHECKPOINT_STORE, opts=with_provider)
    autoscaler = (IrsaRole("cluster-autoscaler", oidc_provider_arn=eks.oidc_provider.arn,
                           oidc_issuer_url=eks.oidc_issuer, namespace=autoscaler_facts.NAMESPACE,
                           service_account=autoscaler_facts.SERVICE_ACCOUNT,
                           policies={"scaling": iam.cluster_autoscaler_policy(
                               cfg.cluster_name, aws_rules.partition(cfg.region))},
                           description=f"Cluster Autoscaler of {cfg.cluster_name}: resize its own node groups",
                           tags=tags, opts=pulumi.ResourceOptions.merge(
                               with_provider, legacy.renamed(legacy.CLUSTER_AUTOSCALER_ROLE)))
                  if cfg.scale_to_zero else None)
    if cfg.monitoring == "cloudwatch":
        CloudWatchObservability("cloudwatch", cluster_name=eks.cluster.name, oidc_provider_arn=eks.oidc_provider.arn,
                                oidc_issuer_url=eks.oidc_issuer, tags=tags,
                                depends_on=[*groups.values(), *late_addons], opts=with_provider)
    RayWorkloads("ray", workloads(cfg), image=image, kubeconfig=eks.kubeconfig, irsa_role_arn=ray_role.role.arn,
                 checkpoint_uri=store.uri, cluster_dependencies=[*fabrics.values(), *groups.values(), *late_addons],
                 autoscaler_role_arn=autoscaler.role.arn if autoscaler else None,
                 autoscaler_dependencies=[autoscaler] if autoscaler else (), crd_digests=offline)

    gpu = cfg.gpu_pools[0] if cfg.gpu_pools else None
    outputs = {
        names.CLUSTER_NAME: eks.cluster.name,
        names.REGION: pulumi.Output.from_input(cfg.region),
        names.GPU_AVAILABILITY_ZONE: pulumi.Output.from_input(site.gpu_zone.name),
        names.GPU_AVAILABILITY_ZONE_ID: pulumi.Output.from_input(site.gpu_zone.zone_id),
        names.KUBECONFIG: eks.kubeconfig,
        names.CHECKPOINT_BUCKET_URI: store.uri,
        names.RAY_IRSA_ROLE_ARN: ray_role.role.arn,
        names.RAY_NAMESPACE: pulumi.Output.from_input(cfg.ray_namespace),
        names.RAY_HEAD_SERVICE: pulumi.Output.from_input(cfg.ray_head_service),
        names.RAY_CLUSTER_NAME: pulumi.Output.from_input(cfg.ray_cluster_name),
        names.NODE_POOLS: pulumi.Output.from_input(pool_outputs(cfg)),
        names.DASHBOARD_PORT_FORWARD: pulumi.Output.from_input(
            f"kubectl -n {cfg.ray_namespace} port-forward svc/{cfg.ray_head_service} "
            f"{ray_facts.DASHBOARD_PORT}:{ray_facts.DASHBOARD_PORT}"),
        names.ESTIMATED_COST_PER_HOUR: pulumi.Output.from_input(hourly_cost(cfg.node_pools)),
        names.DLC_IMAGE: image,
        names.RAY_JOB_CLUSTER_SPEC: pulumi.Output.all(image, store.uri).apply(
            lambda a: prioritized_manifest(workloads(cfg), image=a[0], checkpoint_uri=a[1])["spec"]),
    }
    if gpu:
        outputs[names.GPU_NODE_TYPE] = pulumi.Output.from_input(gpu.instance_type)
        outputs[names.GPU_NODE_COUNT] = pulumi.Output.from_input(gpu.max_size)
    if autoscaler:
        outputs[names.CLUSTER_AUTOSCALER_ROLE_ARN] = autoscaler.role.arn
    for name, value in outputs.items():
        pulumi.export(name, value)
    return outputs
