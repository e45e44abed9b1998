"""Components take explicit arguments, never the stack configuration: any of them can be instantiated twice."""
from __future__ import annotations

from deploy import offline
from facts import nodes
from facts.catalog import CPU_TYPES, GPU_TYPES
from infra.irsa import IrsaRole
from infra.node_group import EfaFabric, NodeGroup
from infra.node_pools import NodePool
from infra.storage import CheckpointStore
from workloads.settings import WorkerGroup, Workloads
from workloads.stack import RayWorkloads

IMAGE = "public.ecr.aws/deep-learning-containers/ray@sha256:" + "ab" * 32


def pool(name: str, instance_type: str, size: int, **extra) -> NodePool:
    return NodePool(name=name, instance_type=instance_type, min_size=size, max_size=size, desired_size=size,
                    labels={"role": f"{name}-worker"}, **extra)


def workloads(namespace: str, group: str) -> Workloads:
    return Workloads(project="p", region="us-east-1", cluster_name="c", namespace=namespace, ray_version="2.58.0",
                     kuberay_version="1.7.0", nvidia_device_plugin_version="0.20.0", efa_device_plugin_version="v0.5.32",
                     nccl_debug="INFO", head_instance=CPU_TYPES["m7i.xlarge"], system_node_selector={"role": "system"},
                     gpu_node_selector={"nvidia.com/gpu.present": "true"}, gpu_tolerations=(nodes.GPU_TAINT,),
                     worker_groups=(WorkerGroup(group, GPU_TYPES["g6.12xlarge"], 1, 1, {"role": group},
                                                (nodes.GPU_TAINT,), efa=True),),
                     ray_cluster_name=f"ray-{namespace}")


def test_every_component_can_be_instantiated_twice():
    def program():
        fabrics = [EfaFabric(name, vpc_id="vpc-1", tags={"t": name}) for name in ("a", "b")]
        groups = [NodeGroup(pool(name, kind, 2, efa=True), cluster_name="c", cluster_name_tag="c", node_role_arn="arn:r",
                            subnet_ids=["subnet-1"], availability_zone="us-east-1a",
                            security_group_ids=[fabric.security_group.id], tags={})
                  for name, kind, fabric in (("l4", "g6.12xlarge", fabrics[0]), ("h100", "p5.48xlarge", fabrics[1]))]
        stores = [CheckpointStore(name, bucket=None, bucket_prefix=f"{name}-", retain=False,
                                  noncurrent_version_expiration_days=1, tags={}) for name in ("one", "two")]
        roles = [IrsaRole(name, oidc_provider_arn="arn:oidc", oidc_issuer_url="https://oidc", namespace=name,
                          service_account="sa", policies={"s3": "{}"}, description=name, tags={}) for name in ("x", "y")]
        clusters = [RayWorkloads(name, workloads(name, f"{name}-workers"), image=IMAGE, kubeconfig="{}",
                                 irsa_role_arn=roles[0].role.arn, checkpoint_uri=stores[0].uri, cluster_dependencies=groups)
                    for name in ("team-a", "team-b")]
        return {"uri": stores[1].uri, "clusters": len(clusters)}

    result = offline.run({"aws:region": "us-east-1"}, program=program)
    templates = {r.name: r.inputs for r in result.of_type("aws:ec2/launchTemplate:LaunchTemplate")}
    assert len(templates["l4-lt"]["networkInterfaces"]) == 1 and len(templates["h100-lt"]["networkInterfaces"]) == 32
    assert {r.name for r in result.of_type("aws:ec2/securityGroup:SecurityGroup")} == {"a-efa", "b-efa"}
    assert {r.inputs["bucketPrefix"] for r in result.of_type("aws:s3/bucket:Bucket")} == {"one-", "two-"}
    assert {r.name for r in result.of_type("aws:iam/role:Role")} == {"x-irsa", "y-irsa"}
    ray = {r.inputs["metadata"]["namespace"]: r.inputs for r in result.of_type("kubernetes:ray.io/v1:RayCluster")}
    assert set(ray) == {"team-a", "team-b"}
    assert ray["team-b"]["spec"]["workerGroupSpecs"][0]["groupName"] == "team-b-workers"
