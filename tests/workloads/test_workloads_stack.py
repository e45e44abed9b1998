"""The whole program under mocks, for the dev and p5 stack files: the Kubernetes objects it declares,
their provider, images, Services, placement against the node groups, dependencies, and the plan."""
from __future__ import annotations

import json
import re

import pytest
import yaml
from pulumi.runtime import rpc

from deploy import offline, plan
from infra.cost import hourly_cost
from tests.guards import nonempty
from tests.stacks import read_stack_file
from workloads import charts, disruption, image, raycluster
from workloads.stack import prioritized_manifest

from .conftest import run_stack, settings, stack_config

PINNED = re.compile(r"@sha256:[0-9a-f]{64}$")
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
RELEASE = "kubernetes:helm.sh/v3:Release"
NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
PRIORITY_CLASS = "kubernetes:scheduling.k8s.io/v1:PriorityClass"
PDB = "kubernetes:policy/v1:PodDisruptionBudget"
CRD = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
DIGEST_IMAGE = "public.ecr.aws/deep-learning-containers/ray@sha256:" + "5e" * 32


@pytest.fixture(params=["dev", "p5"])
def run(request):
    return request.getfixturevalue(f"{request.param}_run")


def kubernetes(run):
    return [r for r in run.result.resources if r.type.startswith("kubernetes:")]


def walk(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, (*path, i))
    else:
        yield path, value


def effect(taint_effect: str) -> str:
    return "".join(part.capitalize() for part in taint_effect.split("_"))


def node_groups(run):
    groups = {r.inputs["labels"]["role"]: r for r in run.result.of_type(NODE_GROUP)}
    assert set(groups) == {"system", "gpu-worker"}
    return groups["system"], groups["gpu-worker"]


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    return any(t["key"] == taint["key"] and t.get("effect") == effect(taint["effect"])
               and (t["operator"] == "Exists" or t.get("value") == taint["value"]) for t in tolerations)


def test_declares_every_kubernetes_object_through_one_provider(run):
    """One provider for everything but the CRDs, whose own provider adopts what Helm installed (test_crds)."""
    providers = {r.name: r for r in run.result.resources if r.type == "pulumi:providers:kubernetes"}
    assert sorted(providers) == ["ray-crd-k8s", "ray-k8s"]
    for provider in providers.values():
        kubeconfig = provider.inputs["kubeconfig"]
        assert kubeconfig[rpc._special_sig_key] == rpc._special_secret_sig  # stays a secret in state
        assert json.loads(kubeconfig["value"])["current-context"] == run.result.outputs["clusterName"]
    objects = kubernetes(run)
    assert sorted(r.type for r in objects) == sorted([
        "kubernetes:core/v1:Namespace", "kubernetes:core/v1:Namespace", "kubernetes:core/v1:ServiceAccount",
        NETPOL, NETPOL, NETPOL, RELEASE, RELEASE, RELEASE, RAYCLUSTER, PRIORITY_CLASS, PDB, PDB, PDB, PDB, *[CRD] * 4])
    for r in objects:
        (reg,) = [g for g in run.registrations.values() if g.type == r.type and g.name == r.name]
        provider = "ray-crd-k8s" if r.type == CRD else "ray-k8s"
        assert reg.provider.startswith(run.urn("pulumi:providers:kubernetes", provider) + "::"), r.name


def test_helm_releases_carry_chart_version_repository_and_values(run):
    cfg = settings(run.result.outputs["clusterName"].rsplit("-", 1)[-1])
    recorded = {r.inputs["name"]: r.inputs for r in run.result.of_type(RELEASE)}
    for spec in nonempty(charts.releases(cfg), "Helm releases"):
        inputs = recorded[spec.release]
        assert (inputs["chart"], inputs["version"], inputs["repositoryOpts"], inputs["namespace"]) == (
            spec.chart, spec.version, {"repo": spec.repository}, spec.namespace)
        pinned = f"{charts.chart_image(cfg, spec.release)[0]}@{image.PLACEHOLDER_DIGEST}"
        assert inputs["values"] == charts.with_pinned_image(spec, cfg, pinned)
        assert inputs["values"]["image"]["tag"].endswith("@" + image.PLACEHOLDER_DIGEST)
        assert inputs["atomic"] is True  # a failed install is rolled back, not left half-created


def test_raycluster_is_the_pure_manifest_and_valid(run, raycluster_schema, strict_raycluster_schema):
    outputs = run.result.outputs
    cfg = settings(outputs["clusterName"].rsplit("-", 1)[-1])
    inputs = offline.plain(run.result.one(RAYCLUSTER).inputs)
    assert set(inputs) == {"apiVersion", "kind", "metadata", "spec"}
    assert inputs == prioritized_manifest(cfg, image=outputs["dlcImage"], checkpoint_uri=outputs["checkpointBucketUri"])
    plain = raycluster.manifest(cfg, image=outputs["dlcImage"], checkpoint_uri=outputs["checkpointBucketUri"])
    assert inputs["spec"] == disruption.prioritized(plain["spec"]) and inputs["metadata"] == plain["metadata"]
    raycluster_schema.validate(inputs)
    strict_raycluster_schema.validate(inputs)


def test_ray_namespace_and_irsa_service_account(run):
    namespaces = {r.inputs["metadata"]["name"]: r.inputs for r in run.result.of_type("kubernetes:core/v1:Namespace")}
    assert set(namespaces) == {"ray", charts.OPERATOR_NAMESPACE}
    assert namespaces["ray"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    sa = run.result.one("kubernetes:core/v1:ServiceAccount").inputs
    assert sa["metadata"]["name"] == "ray-train" and sa["metadata"]["namespace"] == "ray"
    assert sa["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": run.result.outputs["rayIrsaRoleArn"]}
    assert sa["automountServiceAccountToken"] is False


def test_dlc_image_is_pinned_by_a_dynamic_resource_and_exported(run):
    cfg = stack_config(run.result.outputs["clusterName"].rsplit("-", 1)[-1])
    (pin,) = [r for r in run.result.resources
              if r.type == "pulumi-python:dynamic/raytrain:PinnedImage" and r.name == "dlc-image"]
    assert pin.inputs["image"] == cfg.dlc_image == "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
    assert "__provider" in pin.inputs  # the pickled ImageDigestProvider travels in state
    exported = run.result.outputs["dlcImage"]
    assert exported == "public.ecr.aws/deep-learning-containers/ray@" + image.PLACEHOLDER_DIGEST
    assert image.is_placeholder(exported) and pin.outputs["placeholder"] is True


def test_every_image_in_every_object_is_pinned_by_digest(run):
    images = [(r.name, path, value) for r in kubernetes(run) for path, value in walk(r.inputs)
              if path and path[-1] == "image"]
    assert len(images) == 2  # head and worker
    assert len({value for _, _, value in images}) == 1  # one image for head and workers
    for name, path, value in images:
        assert PINNED.search(value), (name, path, value)


def test_no_service_other_than_cluster_ip(run):
    for r in nonempty(kubernetes(run), "Kubernetes objects"):
        text = json.dumps(r.inputs)
        assert "LoadBalancer" not in text and "NodePort" not in text, r.name
        assert r.inputs.get("kind") != "Service" or r.inputs["spec"].get("type", "ClusterIP") == "ClusterIP"
        for path, value in walk(r.inputs):
            if path[-1:] == ("serviceType",) or path[-2:] == ("service", "type"):
                assert value == "ClusterIP", (r.name, path)
    assert run.result.one(RAYCLUSTER).inputs["spec"]["headGroupSpec"]["serviceType"] == "ClusterIP"


def test_tolerations_and_selectors_match_the_node_groups(run):
    system, gpu = node_groups(run)
    assert "taints" not in system.inputs or not system.inputs["taints"]
    (taint,) = gpu.inputs["taints"]
    spec = run.result.one(RAYCLUSTER).inputs["spec"]
    head = spec["headGroupSpec"]["template"]["spec"]
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]
    assert matches(head["nodeSelector"], system.inputs["labels"]) and not matches(head["nodeSelector"], gpu.inputs["labels"])
    assert matches(worker["nodeSelector"], gpu.inputs["labels"]) and not matches(worker["nodeSelector"], system.inputs["labels"])
    assert tolerates(worker["tolerations"], taint) and "tolerations" not in head
    releases = {r.inputs["name"]: r.inputs["values"] for r in run.result.of_type(RELEASE)}
    for plugin in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin"):
        assert matches(releases[plugin]["nodeSelector"], gpu.inputs["labels"]), plugin
        assert tolerates(releases[plugin]["tolerations"], taint), plugin
    assert matches(releases["kuberay-operator"]["nodeSelector"], system.inputs["labels"])


def test_worker_devices_follow_the_gpu_family(p5_run, dev_run):
    for run, (gpus, efa) in ((dev_run, ("4", "1")), (p5_run, ("8", "32"))):
        (group,) = run.result.one(RAYCLUSTER).inputs["spec"]["workerGroupSpecs"]
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"]) == (gpus, efa)
        assert offline.plain(group["replicas"]) == 2
        (launch_template,) = [r for r in run.result.of_type("aws:ec2/launchTemplate:LaunchTemplate")
                              if "networkInterfaces" in r.inputs]
        assert len(launch_template.inputs["networkInterfaces"]) == int(efa)  # one EFA device per interface


def test_destroy_order_in_cluster_objects_before_node_groups_before_cluster_before_network(run):
    """Pulumi deletes a resource only after everything that depends on it: these edges are the order."""
    system_ng = run.urn(NODE_GROUP, "system-ng")
    gpu_ng = run.urn(NODE_GROUP, "gpu-ng")
    coredns = run.urn("aws:eks/addon:Addon", "cluster-coredns")
    cluster = run.urn("aws:eks/cluster:Cluster", "cluster-eks")
    for urn in nonempty(run.urns(lambda r: r.type.startswith("kubernetes:")), "Kubernetes resources"):
        assert {system_ng, gpu_ng, coredns} <= run.ancestors(urn), urn
    for node_group in (system_ng, gpu_ng):
        assert cluster in run.ancestors(node_group)
    network = set(run.urns(lambda r: r.type in ("aws:ec2/vpc:Vpc",) or r.name.startswith("net-private-")
                           and r.type == "aws:ec2/subnet:Subnet"))
    assert len(network) == 3 and network <= run.ancestors(cluster)
    assert cluster in run.ancestors(run.urn("pulumi:providers:kubernetes", "ray-k8s"))


def test_raycluster_waits_for_operator_device_plugins_and_service_account(run):
    deps = run.registrations[run.urn(RAYCLUSTER, "ray-raycluster")].dependencies
    wanted = {run.urn(RELEASE, f"ray-{name}") for name in ("kuberay-operator", "nvidia-device-plugin",
                                                          "aws-efa-k8s-device-plugin")}
    wanted |= {run.urn("kubernetes:core/v1:ServiceAccount", "ray-service-account"),
               run.urn("kubernetes:core/v1:Namespace", "ray-namespace")}
    assert wanted <= deps


def test_nothing_is_created_before_the_image_is_pinned(run):
    pin = run.urn("pulumi-python:dynamic/raytrain:PinnedImage", "dlc-image")
    aws_provider = run.urn("pulumi:providers:aws", "aws")
    assert pin in run.registrations[aws_provider].dependencies
    for reg in nonempty(run.registrations.values(), "registrations"):
        if reg.type.startswith("aws:"):
            assert reg.provider.startswith(aws_provider + "::"), reg.name


def test_aws_layer_waits_for_addons_policies_and_nat_route(dev_run):
    run = dev_run
    for name in ("system-ng", "gpu-ng"):
        ancestors = run.ancestors(run.urn(NODE_GROUP, name))
        assert run.urn("aws:eks/addon:Addon", "cluster-vpc-cni") in ancestors
        assert set(run.urns(lambda r: r.name.startswith("cluster-node-")
                            and r.type == "aws:iam/rolePolicyAttachment:RolePolicyAttachment")) <= ancestors
        assert run.urn("aws:ec2/natGateway:NatGateway", "net-nat") in ancestors


def test_a_configured_digest_is_used_as_is():
    run = run_stack("dev", dlcImage=DIGEST_IMAGE)
    pins = {r.name for r in run.result.resources if r.type.startswith("pulumi-python:dynamic")}
    assert pins == {f"ray-{c}-image" for c in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin", "kuberay-operator")}
    assert run.result.outputs["dlcImage"] == DIGEST_IMAGE
    spec = run.result.one(RAYCLUSTER).inputs["spec"]
    images = {spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"],
              spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"]}
    assert images == {DIGEST_IMAGE}


def test_the_p5_stack_is_configuration_only():
    dev, p5 = read_stack_file("dev"), read_stack_file("p5")
    assert p5["raytrain-eks:gpuNodeType"] == "p5.48xlarge"
    changed = {k.split(":", 1)[1] for k in set(dev) | set(p5) if dev.get(k) != p5.get(k)}
    assert "gpuNodeType" in changed
    assert changed <= {"gpuNodeType", "gpuNodeCount", "tags", "capacityReservationId", "availabilityZone",
                       "placementGroup", "capacityType"}
    total = hourly_cost(stack_config("p5").node_pools)["total"]
    assert f"about ${total:.2f}/hour" in (plan.REPO_ROOT / "Pulumi.p5.yaml").read_text()


def test_the_plan_writes_the_raycluster_and_the_releases(tmp_path, raycluster_schema, capsys):
    assert plan.main(["--stack", "p5", "--out", str(tmp_path)]) == 0
    assert "$  110.48" in capsys.readouterr().out
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.yaml")}
    assert {"kubernetes/raycluster-raytrain.yaml", "kubernetes/serviceaccount-ray-train.yaml",
            "kubernetes/namespace-ray.yaml", f"kubernetes/namespace-{charts.OPERATOR_NAMESPACE}.yaml",
            "kubernetes/networkpolicy-default-deny-ingress.yaml", "kubernetes/networkpolicy-raytrain-ray-ingress.yaml",
            "kubernetes/networkpolicy-rayjob-clusters-ray-ingress.yaml", "kubernetes/priorityclass-raytrain-ray.yaml",
            *(f"kubernetes/poddisruptionbudget-{n}.yaml" for n in ("raytrain-head", "raytrain-worker",
                                                                  "rayjob-clusters-head", "rayjob-clusters-worker")),
            "helm/release-nvidia-device-plugin.yaml", "helm/release-aws-efa-k8s-device-plugin.yaml",
            "helm/release-kuberay-operator.yaml"} == written
    cluster = yaml.safe_load((tmp_path / "kubernetes/raycluster-raytrain.yaml").read_text())
    raycluster_schema.validate(cluster)
    limits = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["vpc.amazonaws.com/efa"] == "32"
    priority = yaml.safe_load((tmp_path / "kubernetes/priorityclass-raytrain-ray.yaml").read_text())
    assert (priority["kind"], priority["value"], priority["globalDefault"]) == ("PriorityClass", 1_000_000, False)
    operator = yaml.safe_load((tmp_path / "helm/release-kuberay-operator.yaml").read_text())
    assert (operator["chart"], operator["version"], operator["repository"]) == (
        "kuberay-operator", "1.7.0", charts.KUBERAY_REPOSITORY)
    assert operator["values"]["nodeSelector"] == {"role": "system"}


# --- NetworkPolicies: only the Ray cluster reaches its pods --------------------------------------------------

def test_the_ray_namespace_denies_ingress_but_between_ray_pods(run):
    cfg = stack_config(run.result.outputs["clusterName"].rsplit("-", 1)[-1])
    policies = {r.inputs["metadata"]["name"]: r.inputs for r in run.result.of_type(NETPOL)}
    assert set(policies) == {"default-deny-ingress", "raytrain-ray-ingress", "rayjob-clusters-ray-ingress"}
    deny = policies["default-deny-ingress"]
    assert deny["metadata"]["namespace"] == cfg.ray_namespace
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    ray = policies["raytrain-ray-ingress"]["spec"]
    # KubeRay v1.7.0 labels every pod of a RayCluster ray.io/cluster=<name> (utils.RayClusterLabelKey)
    assert ray["podSelector"] == {"matchLabels": {"ray.io/cluster": cfg.ray_cluster_name}}
    among_ray, operator = ray["ingress"]
    assert among_ray == {"from": [{"podSelector": ray["podSelector"]}]}
    assert operator["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": charts.OPERATOR_NAMESPACE}}}]
    assert operator["ports"] == [{"protocol": "TCP", "port": 8265}]
    # a RayJob's own cluster has a generated name; KubeRay v1.7.0 labels its pods ray.io/originated-from-crd=RayJob
    jobs = policies["rayjob-clusters-ray-ingress"]["spec"]
    assert jobs["podSelector"] == {"matchLabels": {"ray.io/originated-from-crd": "RayJob"}}
    assert jobs["ingress"] == [{"from": [{"podSelector": jobs["podSelector"]}]}, operator]  # HTTPMode: the operator
    deps = run.registrations[run.urn(RAYCLUSTER, "ray-raycluster")].dependencies
    assert {run.urn(NETPOL, f"ray-netpol-{name}") for name in policies} <= deps  # in force before any Ray pod


def test_the_vpc_cni_enforces_network_policies(run):
    (vpc_cni,) = [r for r in run.result.of_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "vpc-cni"]
    assert json.loads(vpc_cni.inputs["configurationValues"]) == {"enableNetworkPolicy": "true"}
    others = [r for r in run.result.of_type("aws:eks/addon:Addon") if r.inputs["addonName"] != "vpc-cni"]
    assert others and all("configurationValues" not in r.inputs for r in others)


# --- scaleToZero: a stack update never takes the worker group from the autoscaler --------------------------

@pytest.fixture(scope="module")
def autoscaled_registrations():
    """The RayCluster's registration as the engine gets it, replaceOnChanges and deleteBeforeReplace included."""
    seen = {}
    original = offline._RecordingMonitor.RegisterResource

    def record(self, request):
        response = original(self, request)
        if request.type == RAYCLUSTER:
            seen["ray"] = request
        return response

    offline._RecordingMonitor.RegisterResource = record
    try:
        run = run_stack("dev", **{"raytrain-eks:scaleToZero": True})
    finally:
        offline._RecordingMonitor.RegisterResource = original
    return run, seen["ray"]


def test_an_update_declares_the_whole_raycluster_on_a_scaled_stack(autoscaled_registrations):
    """No ignoreChanges: the engine would build every later RayCluster from the OLD stored worker groups
    (pulumi/pulumi#2657); KubeRay's Recreate strategy and patchForce carry a new spec to every pod instead."""
    run, request = autoscaled_registrations
    assert list(request.ignoreChanges) == [] and list(request.replaceOnChanges) == []
    inputs = offline.plain(run.result.one(RAYCLUSTER).inputs)
    assert inputs["metadata"]["annotations"] == {raycluster.PATCH_FORCE: "true"}
    assert inputs["spec"]["upgradeStrategy"] == {"type": "Recreate"}


def test_fixed_clusters_keep_pulumi_owning_the_worker_group(dev_run):
    reg = dev_run.registrations[dev_run.urn(RAYCLUSTER, "ray-raycluster")]
    assert reg.ignore_changes == ()
    assert "annotations" not in dev_run.result.one(RAYCLUSTER).inputs["metadata"]


# --- the charts' images, pinned like the DLC image ------------------------------------------------------

def test_every_charts_image_is_pinned_by_a_dynamic_resource(run):
    cfg = settings(run.result.outputs["clusterName"].rsplit("-", 1)[-1])
    pins = {r.name: r for r in run.result.resources if r.type == "pulumi-python:dynamic/raytrain:PinnedImage"}
    for chart in nonempty(charts.releases(cfg), "Helm releases"):
        pin = pins[f"ray-{chart.release}-image"]
        assert pin.inputs["image"] == charts.image_to_pin(cfg, chart.release)
        assert pin.inputs["__provider"]  # the provider travels in state, so the digest is kept there
        reg = run.registrations[run.urn("kubernetes:helm.sh/v3:Release", f"ray-{chart.release}")]
        assert run.urn("pulumi-python:dynamic/raytrain:PinnedImage", pin.name) in reg.dependencies


def test_the_autoscaler_image_is_pinned_too_and_a_given_digest_is_kept():
    run = run_stack("dev", **{"raytrain-eks:scaleToZero": True})
    values = {r.inputs["name"]: r.inputs["values"] for r in run.result.of_type(RELEASE)}
    assert values["cluster-autoscaler"]["image"] == {
        "repository": charts.AUTOSCALER_IMAGE, "tag": "v1.36.1@" + image.PLACEHOLDER_DIGEST}
    given = "v1.36.1@sha256:" + "0f" * 32
    run = run_stack("dev", **{"raytrain-eks:scaleToZero": True, "raytrain-eks:clusterAutoscalerImageTag": given})
    values = {r.inputs["name"]: r.inputs["values"] for r in run.result.of_type(RELEASE)}
    assert values["cluster-autoscaler"]["image"]["tag"] == given
    assert "ray-cluster-autoscaler-image" not in {r.name for r in run.result.resources}
