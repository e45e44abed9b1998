"""scaleToZero: the configuration, the GPU node group and its ASG tags, the Cluster Autoscaler's release
and IRSA role, the destroy order, the cost, and that without it nothing changes."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
import yaml

from deploy import offline, plan, program
from deploy.config import CLUSTER_AUTOSCALER_IMAGE_TAGS, SUPPORTED_KUBERNETES_VERSIONS, load
from facts import catalog, nodes
from infra import autoscaling, iam, node_pools
from infra.cost import hourly_cost, parts
from tests.guards import nonempty
from workloads import charts, raycluster
from workloads.stack import prioritized_manifest

from .conftest import BASE

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ASG_TAG = "aws:autoscaling/tag:Tag"
RELEASE = "kubernetes:helm.sh/v3:Release"
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
PINNED = re.compile(r"@sha256:[0-9a-f]{64}$")
STACKS = {"dev": {}, "p5": {"gpuNodeType": "p5.48xlarge"}}
EXPECTED_DEVICES = {"dev": ("4", "1"), "p5": ("8", "32")}  # GPUs, EFA devices per node


# --- running the program, with what the engine is told about each resource ------------------------

@dataclass
class Run:
    """A program run and its dependency graph (offline.PlanResult records both)."""

    result: offline.PlanResult

    def __getattr__(self, name):
        return getattr(self.result, name)

    @property
    def registrations(self) -> list:
        return list(self.result.registrations.values())


def run(stack: str = "dev", **overrides) -> Run:
    """The program under mocks, with each registration's dependencies and ignoreChanges."""
    raw = dict(BASE)
    for key, value in {**STACKS[stack], **overrides}.items():
        raw[f"raytrain-eks:{key}"] = value
    return Run(offline.run(raw, stack=stack))


def config(stack: str = "dev", **overrides):
    raw = dict(BASE)
    for key, value in {**STACKS[stack], **overrides}.items():
        raw[f"raytrain-eks:{key}"] = value
    return load(raw, stack=stack)


def gpu_pool(stack: str = "dev", **overrides):
    return config(stack, **overrides).pool("gpu")


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    return {stack: run(stack, scaleToZero=True) for stack in STACKS}


@pytest.fixture(scope="module")
def fixed_dev() -> Run:
    return run("dev")


@pytest.fixture(params=list(STACKS))
def stack(request) -> str:
    return request.param


def as_ints(value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_ints(v) for v in value]
    return value


def effect(taint_effect: str) -> str:
    return "".join(part.capitalize() for part in taint_effect.split("_"))


# --- configuration ---------------------------------------------------------------------------------

def test_off_by_default_with_defaults_for_when_it_is_on():
    cfg = config()
    assert cfg.scale_to_zero is False
    assert cfg.gpu_idle_timeout_minutes == 10
    assert cfg.cluster_autoscaler_version == "9.59.0"
    assert cfg.cluster_autoscaler_image_tag == "v1.36.1"
    on = config(scaleToZero=True)
    assert on.scale_to_zero is True and on.gpu_idle_timeout_minutes == 10


def test_engine_strings_and_yaml_values_parse_the_same():
    native = config(scaleToZero=True, gpuIdleTimeoutMinutes=3)
    strings = config(scaleToZero="true", gpuIdleTimeoutMinutes="3")
    assert native == strings and strings.gpu_idle_timeout_minutes == 3


@pytest.mark.parametrize("kubernetes", SUPPORTED_KUBERNETES_VERSIONS)
def test_the_autoscaler_image_follows_the_kubernetes_minor(kubernetes):
    tag = config(scaleToZero=True, kubernetesVersion=kubernetes).cluster_autoscaler_image_tag
    assert tag == CLUSTER_AUTOSCALER_IMAGE_TAGS[kubernetes]
    assert tag.startswith(f"v{kubernetes}.")


def test_an_image_tag_with_a_digest_is_kept_as_given():
    pinned = "v1.36.1@sha256:" + "0f" * 32
    cfg = config(scaleToZero=True, clusterAutoscalerImageTag=pinned, clusterAutoscalerVersion="9.54.0")
    assert cfg.cluster_autoscaler_image_tag == pinned and cfg.cluster_autoscaler_version == "9.54.0"
    assert charts.cluster_autoscaler(program.workloads(cfg), role_arn="arn:x").values["image"]["tag"] == pinned


# --- pure data: scaling, tags, the node template ------------------------------------------------------

def test_gpu_scaling_is_fixed_or_zero_to_gpu_node_count():
    assert node_pools.scaling(gpu_pool(gpuNodeCount=3)) == {"min_size": 3, "max_size": 3, "desired_size": 3}
    assert node_pools.scaling(gpu_pool(gpuNodeCount=3, scaleToZero=True)) == {
        "min_size": 0, "max_size": 3, "desired_size": 0}
    assert node_pools.ignore_changes(gpu_pool()) is None
    assert node_pools.ignore_changes(gpu_pool(scaleToZero=True)) == ["scalingConfig.desiredSize"]


def test_node_template_advertises_what_one_gpu_node_has(stack):
    pool = gpu_pool(stack, scaleToZero=True)
    tags = node_pools.node_template(pool)
    gpus, efa = EXPECTED_DEVICES[stack]
    prefix = "k8s.io/cluster-autoscaler/node-template"
    assert tags[f"{prefix}/resources/nvidia.com/gpu"] == gpus == str(pool.gpus)
    assert tags[f"{prefix}/resources/vpc.amazonaws.com/efa"] == efa == str(pool.instance.efa_interfaces)
    assert tags[f"{prefix}/resources/hugepages-2Mi"] == pool.instance.hugepages_2mi == "5120Mi"
    assert tags[f"{prefix}/taint/nvidia.com/gpu"] == "true:NoSchedule"
    labels = {k.removeprefix(f"{prefix}/label/"): v for k, v in tags.items() if k.startswith(f"{prefix}/label/")}
    assert labels == node_pools.node_labels(pool)
    assert labels["role"] == "gpu-worker" and labels[nodes.ACCELERATOR_LABEL] == {
        "dev": "nvidia-l4", "p5": "nvidia-h100"}[stack]


@pytest.mark.parametrize("gpu_type", sorted(catalog.GPU_TYPES))
def test_a_ray_worker_fits_the_imagined_node_of_every_gpu_type(gpu_type):
    """CA scales up from zero only if the Pending worker pod fits the node the template describes."""
    pool = gpu_pool(gpuNodeType=gpu_type, scaleToZero=True)
    prefix = "k8s.io/cluster-autoscaler/node-template/resources/"
    offered = {k.removeprefix(prefix): v for k, v in node_pools.node_template(pool).items() if k.startswith(prefix)}
    requests = raycluster.worker_resources(pool.instance)
    extended = {k: v for k, v in requests.items() if k not in ("cpu", "memory")}
    assert set(extended) == set(offered)
    for name, quantity in nonempty(extended.items(), "extended resources a worker requests"):
        assert quantity == offered[name], name
    assert int(requests["cpu"]) <= pool.instance.vcpus
    assert int(requests["memory"].removesuffix("Gi")) <= pool.instance.memory_gib
    # Auto Scaling tag limits
    for key, value in nonempty(autoscaling.asg_tags(pool, "raytrain-eks-dev").items(), "Auto Scaling tags"):
        assert len(key) <= 128 and len(value) <= 256, key


def test_asg_and_node_group_tags_only_with_scale_to_zero():
    assert autoscaling.asg_tags(gpu_pool(), "lab") == {}
    tags = autoscaling.asg_tags(gpu_pool(scaleToZero=True), "lab")
    assert tags["k8s.io/cluster-autoscaler/enabled"] == "true"
    assert tags["k8s.io/cluster-autoscaler/lab"] == "owned"


# --- the program under mocks: the GPU node group ---------------------------------------------------------

def test_gpu_node_group_scales_from_zero_and_pulumi_leaves_its_size_alone(runs, stack):
    result = runs[stack].result
    gpu = result.one(NODE_GROUP, "gpu-ng").inputs
    assert as_ints(gpu["scalingConfig"]) == {"minSize": 0, "maxSize": 2, "desiredSize": 0}
    assert gpu["tags"]["k8s.io/cluster-autoscaler/enabled"] == "true"
    assert gpu["tags"][f"k8s.io/cluster-autoscaler/raytrain-eks-{stack}"] == "owned"
    assert gpu["labels"] == {"role": "gpu-worker", "nvidia.com/gpu.present": "true", nodes.ACCELERATOR_LABEL: nodes.accelerator(
        gpu_pool(stack).instance.gpu_model)}
    # What the engine receives: a path into an input that exists, in the schema's camelCase.
    assert runs[stack].reg(NODE_GROUP, "gpu-ng").ignore_changes == ("scalingConfig.desiredSize",)
    (path,) = runs[stack].reg(NODE_GROUP, "gpu-ng").ignore_changes
    outer, inner = path.split(".")
    assert inner in gpu[outer]


def test_the_system_node_group_keeps_its_fixed_size(runs):
    system = runs["dev"].result.one(NODE_GROUP, "system-ng").inputs
    assert as_ints(system["scalingConfig"]) == {"minSize": 1, "maxSize": 1, "desiredSize": 1}
    assert not [k for k in system["tags"] if k.startswith("k8s.io/cluster-autoscaler")]
    assert runs["dev"].reg(NODE_GROUP, "system-ng").ignore_changes == ()


def test_asg_tags_land_on_the_gpu_node_groups_asg(runs, stack):
    r = runs[stack]
    gpu = r.result.one(NODE_GROUP, "gpu-ng")
    asg_name = gpu.outputs["resources"][0]["autoscalingGroups"][0]["name"]
    tags = r.result.of_type(ASG_TAG)
    on_asg = {t.inputs["tag"]["key"]: t.inputs["tag"]["value"] for t in tags}
    assert on_asg == autoscaling.asg_tags(gpu_pool(stack, scaleToZero=True), f"raytrain-eks-{stack}")
    assert len(on_asg) == len(tags)  # one resource per key
    for tag in nonempty(tags, "Auto Scaling tag resources"):
        assert tag.inputs["autoscalingGroupName"] == asg_name
        assert tag.inputs["tag"]["propagateAtLaunch"] is False  # for the autoscaler, not for instances
        assert r.reg(NODE_GROUP, "gpu-ng").urn in r.reg(ASG_TAG, tag.name).dependencies
    gpus, efa = EXPECTED_DEVICES[stack]
    assert on_asg["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == gpus
    assert on_asg["k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"] == efa


# --- the Cluster Autoscaler: release and IAM ---------------------------------------------------------------

def ca_release(r: Run):
    (release,) = [x for x in r.result.of_type(RELEASE) if x.inputs["name"] == "cluster-autoscaler"]
    return release.inputs


def test_cluster_autoscaler_release(runs, stack):
    r = runs[stack]
    inputs = ca_release(r)
    cfg = config(stack, scaleToZero=True)
    assert (inputs["chart"], inputs["version"], inputs["repositoryOpts"], inputs["namespace"]) == (
        "cluster-autoscaler", "9.59.0", {"repo": "https://kubernetes.github.io/autoscaler"}, "kube-system")
    assert inputs["atomic"] is True
    values = inputs["values"]
    role_arn = r.result.outputs["clusterAutoscalerRoleArn"]
    from workloads.image import PLACEHOLDER_DIGEST  # the chart's image is pinned like the DLC image

    settings = program.workloads(cfg)
    assert values == charts.with_pinned_image(charts.cluster_autoscaler(settings, role_arn=role_arn), settings,
                                              f"{charts.AUTOSCALER_IMAGE}@{PLACEHOLDER_DIGEST}")
    assert values["cloudProvider"] == "aws" and values["awsRegion"] == "us-east-1"
    assert values["autoDiscovery"]["clusterName"] == r.result.outputs["clusterName"]
    # it discovers exactly the groups carrying the tags put on the GPU ASG
    asg = {t.inputs["tag"]["key"]: t.inputs["tag"]["value"] for t in r.result.of_type(ASG_TAG)}
    assert set(values["autoDiscovery"]["tags"]) <= set(asg)
    sa = values["rbac"]["serviceAccount"]
    assert (sa["create"], sa["name"]) == (True, "cluster-autoscaler")
    assert sa["annotations"] == {"eks.amazonaws.com/role-arn": role_arn}
    system = r.result.one(NODE_GROUP, "system-ng").inputs["labels"]
    assert values["nodeSelector"] == system and "tolerations" not in values
    assert values["image"] == {"repository": "registry.k8s.io/autoscaling/cluster-autoscaler",
                               "tag": f"v1.36.1@{PLACEHOLDER_DIGEST}"}
    assert values["service"]["type"] == "ClusterIP"


def test_cluster_autoscaler_scales_down_within_minutes(runs):
    args = ca_release(runs["dev"])["values"]["extraArgs"]
    minutes = {k: int(v.removesuffix("m")) for k, v in args.items() if k.startswith("scale-down-")}
    assert minutes == {"scale-down-unneeded-time": 5, "scale-down-delay-after-add": 5}
    assert args["skip-nodes-with-local-storage"] == "false"  # Ray's /tmp/ray emptyDir must not pin a node
    assert args["balance-similar-node-groups"] == "true" and args["expander"] == "least-waste"


def test_cluster_autoscaler_role_trusts_only_its_service_account(runs):
    r = runs["dev"]
    role = r.result.one(ROLE, "cluster-autoscaler-irsa")
    assert r.result.outputs["clusterAutoscalerRoleArn"] == role.outputs["arn"]
    (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Principal"]["Federated"] == r.result.one(
        "aws:iam/openIdConnectProvider:OpenIdConnectProvider").outputs["arn"]
    assert set(statement["Condition"]["StringEquals"].values()) == {
        "system:serviceaccount:kube-system:cluster-autoscaler", "sts.amazonaws.com"}
    # and it is not the Ray pods' role
    ray_role = json.loads(r.result.one(ROLE, "checkpoints-irsa").inputs["assumeRolePolicy"])["Statement"][0]
    assert "cluster-autoscaler" not in json.dumps(ray_role)


def test_cluster_autoscaler_may_resize_only_this_clusters_groups(runs):
    r = runs["dev"]
    policy = json.loads(r.result.one(ROLE_POLICY, "cluster-autoscaler-irsa-scaling").inputs["policy"])
    assert policy == json.loads(iam.cluster_autoscaler_policy("raytrain-eks-dev"))
    writes = {"autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"}
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert all(s["Effect"] == "Allow" for s in nonempty(policy["Statement"], "statements of the scaling policy"))
    actions = [a for s in policy["Statement"] for a in s["Action"]]
    assert not [a for a in actions if "*" in a]
    reads = {*by_sid["DescribeNodeGroups"]["Action"], *by_sid["DescribeOwnNodeGroups"]["Action"]}
    assert by_sid["DescribeOwnNodeGroups"]["Resource"] == "arn:aws:eks:*:*:nodegroup/raytrain-eks-dev/*/*"
    assert all(re.match(r"^(autoscaling|ec2|eks):(Describe|Get)", a) for a in reads), reads
    assert {"eks:DescribeNodegroup", "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplateVersions"} <= reads
    scale = by_sid["ResizeOwnNodeGroupsOnly"]
    assert set(scale["Action"]) == writes and not writes & reads
    condition = scale["Condition"]["StringEquals"]
    assert condition == {"aws:ResourceTag/k8s.io/cluster-autoscaler/raytrain-eks-dev": "owned",
                         "aws:ResourceTag/k8s.io/cluster-autoscaler/enabled": "true"}
    # the GPU ASG carries exactly those tags, so the condition lets the autoscaler act on it
    asg = {t.inputs["tag"]["key"]: t.inputs["tag"]["value"] for t in r.result.of_type(ASG_TAG)}
    for key, value in condition.items():
        assert asg[key.removeprefix("aws:ResourceTag/")] == value
    other = json.loads(iam.cluster_autoscaler_policy("someone-else"))["Statement"][2]["Condition"]["StringEquals"]
    assert "aws:ResourceTag/k8s.io/cluster-autoscaler/raytrain-eks-dev" not in other


def test_destroy_order_autoscaler_goes_before_the_node_groups_and_its_role(runs, stack):
    """Pulumi deletes a resource only after everything that depends on it."""
    r = runs[stack]
    ca = r.reg(RELEASE, "ray-cluster-autoscaler").urn
    ancestors = r.ancestors(ca)
    required = {r.reg(NODE_GROUP, "gpu-ng").urn, r.reg(NODE_GROUP, "system-ng").urn,
                r.reg("aws:eks/addon:Addon", "cluster-coredns").urn,
                r.reg(ROLE_POLICY, "cluster-autoscaler-irsa-scaling").urn,
                r.reg(ROLE, "cluster-autoscaler-irsa").urn}
    required |= {x.urn for x in r.registrations if x.type == ASG_TAG}
    assert required <= ancestors
    # the RayCluster goes first, while the autoscaler and the operator still run
    assert ca in r.ancestors(r.reg(RAYCLUSTER, "ray-raycluster").urn)


def test_every_image_is_pinned_and_nothing_is_exposed(runs, stack):
    objects = [x for x in runs[stack].result.resources if x.type.startswith("kubernetes:")]
    spec = runs[stack].result.one(RAYCLUSTER).inputs["spec"]
    images = [spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"],
              spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"],
              spec["autoscalerOptions"]["image"]]
    assert len(set(images)) == 1 and PINNED.search(images[0])
    for x in nonempty(objects, "Kubernetes objects"):
        text = json.dumps(x.inputs)
        assert "LoadBalancer" not in text and "NodePort" not in text, x.name


def test_raycluster_is_the_pure_manifest_and_autoscaled(runs, stack):
    out = runs[stack].result.outputs
    inputs = as_ints(runs[stack].result.one(RAYCLUSTER).inputs)
    cfg = config(stack, scaleToZero=True)
    assert inputs == prioritized_manifest(program.workloads(cfg), image=out["dlcImage"],
                                          checkpoint_uri=out["checkpointBucketUri"])
    assert out["rayJobClusterSpec"] == inputs["spec"]  # a RayJob's own cluster: the same autoscaled spec
    spec = inputs["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] == 600
    (group,) = spec["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"]) == (0, 2) and "replicas" not in group


# --- cost -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stack_name,gpu_price", [("dev", 4.6016), ("p5", 55.04)])
def test_cost_while_training_and_while_idle(runs, stack_name, gpu_price):
    cost = runs[stack_name].result.outputs["estimatedCostPerHour"]
    assert cost == hourly_cost(config(stack_name, scaleToZero=True).node_pools)
    assert cost["mode"] == "scale-to-zero"
    assert cost["gpuNodes"] == pytest.approx(2 * gpu_price)
    assert parts(cost) == ["gpuNodes", "gpuRootVolumes", "systemNodes", "systemRootVolumes", "controlPlane",
                           "natGateway", "natPublicIpv4"]
    assert cost["total"] == pytest.approx(sum(cost[k] for k in parts(cost)))
    idle = sum(cost[k] for k in parts(cost) if k not in ("gpuNodes", "gpuRootVolumes"))
    assert cost["idleTotal"] == pytest.approx(idle) == pytest.approx(0.2016 + 0.0055 + 0.10 + 0.045 + 0.005)
    assert cost["total"] - cost["idleTotal"] == pytest.approx(2 * gpu_price + cost["gpuRootVolumes"])


def test_plan_prints_the_training_and_idle_prices(tmp_path, monkeypatch, capsys):
    (tmp_path / "Pulumi.z.yaml").write_text(yaml.safe_dump({"config": {
        **BASE, "raytrain-eks:scaleToZero": True, "raytrain-eks:gpuIdleTimeoutMinutes": 7}}))
    monkeypatch.setattr(plan, "REPO_ROOT", tmp_path)
    assert plan.main(["--stack", "z", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"total +\$ +9\.60 +while training", out)
    assert re.search(r"idle total +\$ +0\.36 +between jobs", out)
    assert "about 12 min after the last Ray task (7 min Ray idle timeout + 5 min Cluster Autoscaler" in out
    assert "aws:autoscaling.Tag" in out and "minSize=0 maxSize=2" in out
    release = yaml.safe_load((tmp_path / "out/helm/release-cluster-autoscaler.yaml").read_text())
    assert release["version"] == "9.59.0" and release["namespace"] == "kube-system"
    resources = json.loads((tmp_path / "out/resources.json").read_text())
    assert resources["outputs"]["estimatedCostPerHour"]["idleTotal"] == pytest.approx(0.3571)


def test_plan_without_scale_to_zero_says_idle_gpus_bill(capsys):
    assert plan.main(["--stack", "dev"]) == 0
    out = capsys.readouterr().out
    assert "bill while idle too: set raytrain-eks:scaleToZero to true" in out
    assert "idle total" not in out


# --- without scaleToZero nothing changes ---------------------------------------------------------------

def test_fixed_size_stack_has_none_of_it(fixed_dev):
    result = fixed_dev.result
    assert not result.of_type(ASG_TAG)
    assert not [x for x in result.of_type(ROLE) if "autoscaler" in x.name]
    assert [x.inputs["name"] for x in result.of_type(RELEASE)] == [
        "nvidia-device-plugin", "aws-efa-k8s-device-plugin", "kuberay-operator"]
    gpu = result.one(NODE_GROUP, "gpu-ng").inputs
    assert as_ints(gpu["scalingConfig"]) == {"minSize": 2, "maxSize": 2, "desiredSize": 2}
    assert gpu["labels"] == {"role": "gpu-worker", "nvidia.com/gpu.present": "true"}
    assert not [k for k in gpu["tags"] if k.startswith("k8s.io/cluster-autoscaler")]
    assert fixed_dev.reg(NODE_GROUP, "gpu-ng").ignore_changes == ()
    spec = as_ints(result.one(RAYCLUSTER).inputs["spec"])
    assert spec["enableInTreeAutoscaling"] is False and "autoscalerOptions" not in spec
    (group,) = spec["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    assert "annotations" not in group["template"]["metadata"]
    assert [v["name"] for v in spec["headGroupSpec"]["template"]["spec"]["volumes"]] == ["ray-tmp"]
    cost = result.outputs["estimatedCostPerHour"]
    assert set(cost) == {*parts(cost), "total", "pricing"} and "idleTotal" not in cost
    assert "clusterAutoscalerRoleArn" not in result.outputs


def test_scale_to_zero_changes_only_the_gpu_node_group_and_the_raycluster(fixed_dev, runs):
    """Both runs of the dev stack declare the same resources with the same inputs, except for what it adds."""
    def declared(run):  # what the engine creates: components (how the program groups resources) left out
        return {(x.type, x.name): x.inputs for x in run.result.resources if not x.type.startswith("raytrain:")}

    fixed, scaled = declared(fixed_dev), declared(runs["dev"])
    added = set(scaled) - set(fixed)
    assert not set(fixed) - set(scaled)
    assert {t for t, _ in added} == {ASG_TAG, ROLE, ROLE_POLICY, RELEASE,
                                     "pulumi-python:dynamic/raytrain:PinnedImage"}  # the autoscaler image's pin
    assert len([k for k in added if k[0] == ASG_TAG]) == len(autoscaling.asg_tags(gpu_pool(scaleToZero=True), "x"))
    changed = {k for k in fixed if fixed[k] != scaled[k]}
    assert changed == {(NODE_GROUP, "gpu-ng"), (RAYCLUSTER, "ray-raycluster")}
    assert set(runs["dev"].result.outputs) - set(fixed_dev.result.outputs) == {"clusterAutoscalerRoleArn"}
    assert runs["dev"].result.outputs["nodePools"]["gpu"]["minSize"] == 0
    same = {k for k in fixed_dev.result.outputs if k not in ("estimatedCostPerHour", "nodePools", "rayJobClusterSpec")}
    assert {k: fixed_dev.result.outputs[k] for k in same} == {k: runs["dev"].result.outputs[k] for k in same}

