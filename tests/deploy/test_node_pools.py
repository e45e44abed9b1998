"""Node pools as data: the shorthand is the two default pools, a second GPU type and a CPU pool are a
stack-file change, every bad pool setting is named with its fix, and existing stacks keep every URN."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy import offline, program
from deploy.config import ConfigError, load
from infra import cost
from policy import model
from tests.examples import documented_stack
from tests.policy import rule_named
from tests.stacks import read_stack_file

REPO = Path(__file__).resolve().parents[2]
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
BASE = {"aws:region": "us-east-1", "raytrain-eks:apiAccessCidrs": ["203.0.113.10/32"]}
DEFAULT_POOLS = {"system": {"instanceType": "m7i.xlarge", "desiredSize": 1},
                 "gpu": {"instanceType": "g6.12xlarge", "desiredSize": 2}}


def recorded(result: offline.PlanResult) -> dict:
    return {(r.type, r.name): offline.plain(r.inputs) for r in result.resources}


@pytest.fixture(scope="module")
def pools_run() -> offline.PlanResult:
    return offline.run(documented_stack("pools"), stack="pools")


# --- the shorthand -------------------------------------------------------------------------------------

@pytest.mark.parametrize("shorthand, pools", [
    ({}, DEFAULT_POOLS),
    ({"gpuNodeType": "p5.48xlarge", "gpuNodeCount": 3, "systemNodeCount": 2},
     {"system": {"instanceType": "m7i.xlarge", "desiredSize": 2}, "gpu": {"instanceType": "p5.48xlarge", "desiredSize": 3}}),
    ({"scaleToZero": True, "gpuNodeCount": 4},
     {"system": DEFAULT_POOLS["system"], "gpu": {"instanceType": "g6.12xlarge", "scaleToZero": True, "maxSize": 4}}),
    ({"capacityType": "SPOT", "placementGroup": False},
     {"system": DEFAULT_POOLS["system"],
      "gpu": {"instanceType": "g6.12xlarge", "desiredSize": 2, "capacityType": "SPOT", "placementGroup": False}}),
], ids=["defaults", "p5", "scaleToZero", "spot"])
def test_the_shorthand_plans_exactly_as_the_two_pools_it_stands_for(shorthand, pools):
    short = offline.run({**BASE, **{f"raytrain-eks:{k}": v for k, v in shorthand.items()}})
    explicit = offline.run({**BASE, "raytrain-eks:nodePools": pools})
    assert recorded(short) == recorded(explicit)
    assert short.outputs == explicit.outputs


def test_a_stack_written_before_node_pools_keeps_every_urn():
    """Each URN the shipped stacks had is, to the engine, a URN or an alias of the same resource now: `pulumi up`
    on a stack deployed before node pools moves resources in its state and replaces none."""
    before = json.loads((REPO / "tests/deploy/data/urns-before-node-pools.json").read_text())
    variants = {"dev": ("dev", {}), "p5": ("p5", {}), "dev-s2z": ("dev", {"scaleToZero": True}),
                "p5-block": ("p5", {"capacityType": "CAPACITY_BLOCK", "capacityReservationId": "cr-0123456789abcdef0"})}
    for variant, (stack, overrides) in variants.items():
        raw = read_stack_file(stack, REPO)
        raw.update({f"raytrain-eks:{k}": v for k, v in overrides.items()})
        result = offline.run(raw, stack=stack)
        claims: dict[str, str] = {}
        for urn in result.registrations:
            for old in result.old_urns(urn):
                assert claims.setdefault(old, urn) == urn, f"{old} claimed by {claims[old]} and {urn}"
        missing = [u for u in before[variant] if u not in claims]
        assert not missing, f"{variant}: {missing}"


# --- a second GPU type and a CPU pool: the example of docs/configuration.md ----------------------------

def test_the_documented_example_plans_four_node_groups(pools_run):
    groups = {r.name: r.inputs for r in pools_run.of_type(NODE_GROUP)}
    assert {n: g["instanceTypes"] for n, g in groups.items()} == {
        "system-ng": ["m7i.xlarge"], "gpu-ng": ["g6.12xlarge"], "l40s-ng": ["g6e.12xlarge"], "data-ng": ["m7i.4xlarge"]}
    assert offline.plain(groups["l40s-ng"]["scalingConfig"]) == {"minSize": 0, "maxSize": 2, "desiredSize": 0}
    assert offline.plain(groups["data-ng"]["scalingConfig"]) == {"minSize": 2, "maxSize": 2, "desiredSize": 2}
    assert groups["data-ng"]["amiType"] == "AL2023_x86_64_STANDARD" and "taints" not in groups["data-ng"]
    assert groups["l40s-ng"]["labels"]["role"] == "l40s-worker" and groups["data-ng"]["labels"] == {"role": "data-worker"}
    # only the pool that scales to zero is the Cluster Autoscaler's
    asg_tags = {r.name for r in pools_run.of_type("aws:autoscaling/tag:Tag")}
    assert asg_tags and all(name.startswith("l40s-asg-") for name in asg_tags)
    assert {r.inputs["name"] for r in pools_run.of_type("kubernetes:helm.sh/v3:Release")} >= {"cluster-autoscaler"}
    assert pools_run.outputs["gpuNodeType"] == "g6.12xlarge" and pools_run.outputs["gpuNodeCount"] == 2
    assert set(pools_run.outputs["nodePools"]) == {"system", "gpu", "l40s", "data"}


def test_both_gpu_pools_share_their_zones_efa_security_group(pools_run):
    (fabric,) = pools_run.of_type(SECURITY_GROUP)
    for template in ("gpu-lt", "l40s-lt"):
        interfaces = pools_run.one(LAUNCH_TEMPLATE, template).inputs["networkInterfaces"]
        assert interfaces and all(f"{fabric.name}-id" in i["securityGroups"] for i in interfaces)
    assert "networkInterfaces" not in pools_run.one(LAUNCH_TEMPLATE, "data-lt").inputs
    subnets = {f"{s.name}-id": s.inputs["availabilityZone"] for s in pools_run.of_type("aws:ec2/subnet:Subnet")}
    zones = {n: {subnets[i] for i in pools_run.one(NODE_GROUP, f"{n}-ng").inputs["subnetIds"]} for n in ("gpu", "l40s", "data")}
    assert zones["gpu"] == zones["l40s"] == {pools_run.outputs["gpuAvailabilityZone"]}
    assert len(zones["data"]) >= 2  # without EFA: every private subnet


def test_each_ray_worker_group_lands_on_its_own_pool_only(pools_run, strict_raycluster_schema):
    manifest = offline.plain(pools_run.one(RAYCLUSTER).inputs)
    strict_raycluster_schema.validate(manifest)
    groups = {g["groupName"]: g for g in manifest["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"gpu-workers", "l40s-workers", "data-workers"}
    labels = {r.name[:-3]: r.inputs["labels"] for r in pools_run.of_type(NODE_GROUP)}
    for name, group in groups.items():
        selector = group["template"]["spec"]["nodeSelector"]
        landing = [pool for pool, node in labels.items() if all(node.get(k) == v for k, v in selector.items())]
        assert landing == [name.removesuffix("-workers")], (name, selector)
    data = groups["data-workers"]["template"]["spec"]["containers"][0]
    assert set(data["resources"]["limits"]) == {"cpu", "memory"} and data["env"] == []
    assert "tolerations" not in groups["data-workers"]["template"]["spec"]
    l40s = groups["l40s-workers"]
    assert (l40s["minReplicas"], l40s["maxReplicas"]) == (0, 2) and "replicas" not in l40s
    assert l40s["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert groups["gpu-workers"]["replicas"] == 2 and manifest["spec"]["enableInTreeAutoscaling"] is True


def test_the_cost_has_one_part_per_pool(pools_run):
    estimate = pools_run.outputs["estimatedCostPerHour"]
    assert cost.parts(estimate) == ["gpuNodes", "gpuRootVolumes", "l40sNodes", "l40sRootVolumes", "systemNodes",
                                    "systemRootVolumes", "dataNodes", "dataRootVolumes", "controlPlane", "natGateway",
                                    "natPublicIpv4"]
    assert estimate["l40sNodes"] == pytest.approx(2 * 10.4926) and estimate["dataNodes"] == pytest.approx(2 * 0.8064)
    assert estimate["idleTotal"] == pytest.approx(estimate["total"] - estimate["l40sNodes"] - estimate["l40sRootVolumes"])


def test_the_policy_pack_caps_the_gpu_nodes_of_every_gpu_pool(pools_run):
    resources = [model.Resource(r.type, r.name, r.outputs, f"urn:{r.name}", f"{r.name}-id") for r in pools_run.resources]
    assert rule_named("max-gpu-nodes").check(resources, {"maxGpuNodes": 4}) == []  # gpu 2 + l40s 2, not data
    (violation,) = rule_named("max-gpu-nodes").check(resources, {"maxGpuNodes": 3})
    assert "can run 4 GPU nodes (" in violation.message
    assert "gpu-ng: 2" in violation.message and "l40s-ng: 2" in violation.message and "data-ng" not in violation.message


# --- bad pools -----------------------------------------------------------------------------------------

def pool_problems(pools=None, **extra) -> list[str]:
    raw = {**BASE, **{f"raytrain-eks:{k}": v for k, v in extra.items()}}
    if pools is not None:
        raw["raytrain-eks:nodePools"] = pools
    with pytest.raises(ConfigError) as info:
        load(raw, stack="dev")
    return info.value.problems


KEY = "raytrain-eks:nodePools"
BAD = [
    ({"gpu": {"instanceType": "g6.12xlarge"}}, f"{KEY}: no pool named system", "add `system: {instanceType: m7i.xlarge}`"),
    ({**DEFAULT_POOLS, "gpu": {"instanceTyp": "g6.12xlarge"}}, f"{KEY}.gpu.instanceTyp: unknown node pool setting",
     "did you mean instanceType?"),
    ({**DEFAULT_POOLS, "gpu": {"desiredSize": 2}}, f"{KEY}.gpu.instanceType: not set", "e.g. g6.12xlarge"),
    ({**DEFAULT_POOLS, "x": {"instanceType": "g7.huge"}}, f"{KEY}.x.instanceType: 'g7.huge' is not in the instance catalog",
     "add the type's row to facts/catalog.py"),
    ({**DEFAULT_POOLS, "x": {"instanceType": "g5.12xlarge"}}, f"{KEY}.x.instanceType: 'g5.12xlarge' has no EFA", "use one of"),
    ({**DEFAULT_POOLS, "Bad_Name": {"instanceType": "m7i.xlarge"}}, f"{KEY}.Bad_Name: 'Bad_Name' is not a node pool name",
     "lowercase letters"),
    ({"system": {"instanceType": "g6.12xlarge"}}, f"{KEY}.system.instanceType: the system pool runs the Ray head",
     "use a CPU type"),
    ({"system": {"instanceType": "m7i.xlarge", "rayWorkerGroup": True}}, f"{KEY}.system: the system pool must keep",
     "no rayWorkerGroup"),
    ({**DEFAULT_POOLS, "data": {"instanceType": "m7i.xlarge", "enableEfaSupport": True}},
     f"{KEY}.data.enableEfaSupport: m7i.xlarge has no EFA network interface", "set it to false"),
    ({**DEFAULT_POOLS, "gpu": {"instanceType": "g6.12xlarge", "minSize": 1, "maxSize": 3}},
     f"{KEY}.gpu.minSize: 1 differs from the pool's size 3", "scaleToZero: true with maxSize"),
    ({**DEFAULT_POOLS, "gpu": {"instanceType": "g6.12xlarge", "scaleToZero": True}},
     f"{KEY}.gpu.maxSize: not set", "the most nodes it may run"),
    ({**DEFAULT_POOLS, "gpu": {"instanceType": "g6.12xlarge", "scaleToZero": True, "maxSize": 2, "desiredSize": 1}},
     f"{KEY}.gpu.desiredSize: 1; a pool that scales to zero starts at 0", "set maxSize"),
    ({**DEFAULT_POOLS, "gpu": {"instanceType": "g6.12xlarge", "capacityType": "CAPACITY_BLOCK"}},
     f"{KEY}.gpu.capacityType: CAPACITY_BLOCK needs the Capacity Block's reservation",
     f"set {KEY}.gpu.capacityReservationId"),
    ({**DEFAULT_POOLS, "gpu": {"instanceType": "g6.12xlarge", "capacityReservationId": "cr-0123456789abcdef0",
                              "scaleToZero": True, "maxSize": 2}},
     f"{KEY}.gpu.scaleToZero: a capacity reservation", "remove the reservation or set scaleToZero to false"),
    ({**DEFAULT_POOLS, "gpu": {"instanceType": "g6.12xlarge", "taints": ["nvidia.com/gpu:NoSchedule"]}},
     f"{KEY}.gpu.taints: 'nvidia.com/gpu:NoSchedule' is not a taint", '"K=V:NoSchedule"'),
    ({**DEFAULT_POOLS, "gpu": {"instanceType": "g6.12xlarge", "taints": [{"key": "a", "effect": "Never"}]}},
     f"{KEY}.gpu.taints: taint effect 'Never' is not one of", "NoSchedule"),
    ({**DEFAULT_POOLS, "gpu": {"instanceType": "g6.12xlarge", "labels": {"role": "x y"}}},
     f"{KEY}.gpu.labels: label value 'x y' of 'role' is not a Kubernetes label value", "at most 63"),
    ({**DEFAULT_POOLS, "gpu2": {"instanceType": "g6.12xlarge", "rayWorkerGroup": "gpu-workers"}},
     f"{KEY}.gpu2.rayWorkerGroup: 'gpu-workers' is also the Ray worker group of pool gpu", "give each pool its own"),
    ({**DEFAULT_POOLS, "big": {"instanceType": "g6.48xlarge", "labels": {"role": "gpu-worker", "nvidia.com/gpu.present": "true",
                                                                         "size": "big"}}},
     f"{KEY}.gpu.labels: {{'role': 'gpu-worker', 'nvidia.com/gpu.present': 'true'}} also match the nodes of pool big",
     "give gpu a label big lacks"),
    ({**DEFAULT_POOLS, "gpu": {"instanceType": "g6.12xlarge", "availabilityZone": "eu-west-1a"}},
     f"{KEY}.gpu.availabilityZone: 'eu-west-1a' is not in region us-east-1", "pick an AZ of us-east-1"),
    ({"system": {"instanceType": "m7i.xlarge"}}, None, None),  # a stack without GPUs plans
]


@pytest.mark.parametrize("pools, starts, fix", [b for b in BAD if b[1]], ids=[b[1].split(": ")[0] for b in BAD if b[1]])
def test_a_bad_pool_setting_is_named_with_its_fix(pools, starts, fix):
    problems = pool_problems(pools)
    matching = [p for p in problems if p.startswith(starts)]
    assert matching, problems
    assert fix in matching[0], matching[0]


def test_the_shorthand_keys_are_refused_beside_node_pools():
    problems = pool_problems(DEFAULT_POOLS, gpuNodeCount=4, scaleToZero=True)
    assert {p.split(":", 2)[1] for p in problems} == {"gpuNodeCount", "scaleToZero"}
    assert all("give the setting to the pool in nodePools instead" in p for p in problems)


def test_every_pool_problem_is_reported_at_once():
    problems = pool_problems({"gpu": {"instanceType": "g7.huge"}, "data": {"instanceType": "m7i.xlarge", "diskSize": 5}})
    assert any(p.startswith(f"{KEY}.gpu.instanceType") for p in problems)
    assert any(p.startswith(f"{KEY}.data.diskSize: 5 is out of range") for p in problems)
    assert any(p.startswith(f"{KEY}: no pool named system") for p in problems)


def test_a_cpu_only_stack_plans_without_device_plugin_targets():
    cfg = load({**BASE, "raytrain-eks:nodePools": {"system": {"instanceType": "m7i.xlarge"}}}, stack="dev")
    assert cfg.gpu_pools == () and program.workloads(cfg).worker_groups == ()
