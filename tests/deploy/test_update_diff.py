"""The hundredth `pulumi up`: the update diff (deploy.update_diff) on plans before and after typical changes.

Each change is planned in-process under the mocks (about 0.3 s a plan) and compared with the plan of the
stack it changes, as `python -m deploy.plan --compare-to` does. Verdicts are checked against the
providers' own replace rules as recorded from their source (deploy/data/replace_rules.json, pinned below),
and the engine's ignoreChanges rule is replayed on the stored inputs.
"""
from __future__ import annotations

import json

import pytest

from deploy import plan, update_diff
from deploy.change_table import planned  # one cache of plans for these tests and the table's
from deploy.update_diff import RULES
from tests.guards import nonempty
from tests.stacks import read_stack_file

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
SUBNET = "aws:ec2/subnet:Subnet"
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
CRD = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
BUCKET = "aws:s3/bucket:Bucket"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/ray@sha256:" + "ab" * 32
OTHER_IMAGE = IMAGE.replace("ab" * 32, "cd" * 32)
BASE = {**read_stack_file("dev"), "raytrain-eks:kubernetesVersion": "1.34", "raytrain-eks:dlcImage": IMAGE}
POOLS = {"system": {"instanceType": "m7i.xlarge"}, "gpu": {"instanceType": "g6.12xlarge", "desiredSize": 2}}
SCALED = {"raytrain-eks:scaleToZero": True}

# The provider source each rule below was read from: a different file version is a different table.
PINNED_SOURCES = {
    "aws:ec2/subnet:Subnet": ("internal/service/ec2/vpc_subnet.go", "00cda125a19d31754cb0d073cf551264c57955cb"),
    "aws:eks/nodeGroup:NodeGroup": ("internal/service/eks/node_group.go", "012e0a32f0686212f447447fd3d81c3d0ce256ad"),
    "aws:eks/cluster:Cluster": ("internal/service/eks/cluster.go", "00555dc5b38f92abbfa230badea0ed0754cea81e"),
    "aws:s3/bucket:Bucket": ("internal/service/s3/bucket.go", "0070bcd12c952f14c5434a6f351ef7b6fa791226"),
    "aws:ec2/launchTemplate:LaunchTemplate": ("internal/service/ec2/ec2_launch_template.go",
                                              "025e4f81cab8553cb052aebfcc5987e2aa8c702a"),
}


def diff(before: dict, **changes) -> update_diff.Diff:
    return update_diff.compare(planned(before), planned({**before, **changes}))


def with_pools(**pools) -> dict:
    shorthand = {k: v for k, v in BASE.items() if k not in ("raytrain-eks:gpuNodeType", "raytrain-eks:gpuNodeCount")}
    return {**shorthand, "raytrain-eks:nodePools": {**POOLS, **pools}}


def verdicts(d: update_diff.Diff, verdict: str, typ: str | None = None) -> list[str]:
    return sorted(c.name for c in d.by_verdict(verdict) if typ in (None, c.type) and not c.type.startswith("raytrain:"))


def reviewed(d: update_diff.Diff, kind: str) -> list[str]:
    return [n for n in d.review if n.startswith(kind)]


def rule(typ: str, key: str = "force_new") -> list[str]:
    return RULES["types"][typ][key]


def test_the_rules_are_the_ones_read_from_the_providers_source():
    for typ, (source, commit) in PINNED_SOURCES.items():
        entry = RULES["types"][typ]
        assert (entry["source"], entry["commit"], entry["read"]) == (source, commit, True), typ
    assert {"cidrBlock", "availabilityZone", "vpcId"} <= set(rule(SUBNET))
    assert {"instanceTypes", "subnetIds", "launchTemplate.id"} <= set(rule(NODE_GROUP))
    assert "version" not in rule(NODE_GROUP) and "scalingConfig" not in rule(NODE_GROUP)
    assert "tagSpecifications" in rule("aws:ec2/launchTemplate:LaunchTemplate", "new_version_on")
    assert "tags" not in rule("aws:ec2/launchTemplate:LaunchTemplate", "new_version_on")
    # every resource type the program declares has its rules recorded
    declared = {r["type"] for r in planned(with_pools(l40s={"instanceType": "g6e.12xlarge", "scaleToZero": True,
                                                             "maxSize": 2}))}
    missing = {t for t in declared if not t.startswith(("raytrain:", "pulumi:", "kubernetes:")) and t not in RULES["types"]}
    assert not missing
    assert "kubernetes:helm.sh/v3:Release" in RULES["types"]


def test_resources_json_records_the_options_the_engine_acts_on():
    records = {(r["type"], r["name"]): r for r in planned({**BASE, **SCALED})}
    bucket = records[(BUCKET, "checkpoints-bucket")]["options"]
    assert bucket["protect"] is True and bucket["retainOnDelete"] is True
    assert bucket["aliases"]  # the bucket's old URN (BucketV2) is matched
    scaled = records[(NODE_GROUP, "gpu-ng")]["options"]
    assert scaled["ignoreChanges"] == ["scalingConfig.desiredSize"]
    assert all(r["urn"].startswith("urn:pulumi:dev::raytrain-eks::") for r in nonempty(records.values(), "records"))
    assert {"deleteBeforeReplace", "replaceOnChanges"} <= set(bucket)


def test_the_same_stack_changes_nothing():
    d = diff(BASE)
    assert nonempty(d.by_verdict("unchanged"), "unchanged resources") and len(d.changes) == len(d.by_verdict("unchanged"))
    assert d.review == []


# --- the twelve typical changes --------------------------------------------------------------------------

def test_a_tag_value_rolls_no_node():
    d = diff(BASE, **{"raytrain-eks:tags": {"environment": "staging"}})
    assert verdicts(d, "replace") == [] and verdicts(d, "delete") == [] and verdicts(d, "create") == []
    assert reviewed(d, "NODES") == []
    for lt in nonempty([c for c in d.changes if c.type == "aws:ec2/launchTemplate:LaunchTemplate"], "templates"):
        assert not any(p.startswith("tagSpecifications") for p in lt.changed), lt.changed
    assert "gpu-ng" in verdicts(d, "update", NODE_GROUP)  # the node group's own tags update in place


def test_node_counts_update_in_place():
    d = diff(BASE, **{"raytrain-eks:gpuNodeCount": 3})
    assert verdicts(d, "replace") == [] and reviewed(d, "NODES") == []
    gpu = d.of(NODE_GROUP, "gpu-ng")
    assert gpu.verdict == "update" and set(gpu.changed) <= {"scalingConfig.desiredSize", "scalingConfig.maxSize",
                                                             "scalingConfig.minSize"}


def test_a_new_gpu_type_replaces_its_node_group_and_no_subnet():
    d = diff(BASE, **{"raytrain-eks:gpuNodeType": "g6e.12xlarge"})
    gpu = d.of(NODE_GROUP, "gpu-ng")
    assert gpu.verdict == "replace" and "instanceTypes" in gpu.forcing and set(gpu.forcing) <= set(rule(NODE_GROUP))
    assert verdicts(d, "replace", SUBNET) == [] and verdicts(d, "create", SUBNET) == []
    assert d.of(NODE_GROUP, "system-ng").verdict == "unchanged"
    assert reviewed(d, "COLLISION") == [] and reviewed(d, "DATA") == []


def test_kubernetes_plus_one_moves_the_nodes_with_the_control_plane_and_says_so():
    d = diff(BASE, **{"raytrain-eks:kubernetesVersion": "1.35"})
    assert d.of("aws:eks/cluster:Cluster").verdict == "update"
    for name in ("gpu-ng", "system-ng"):
        group = d.of(NODE_GROUP, name)
        assert group.verdict == "update" and "version" in group.changed
    assert len(reviewed(d, "NODES")) == 2 and reviewed(d, "VERSION") == []
    assert verdicts(d, "replace") == []
    for addon in nonempty([c for c in d.changes if c.type == "aws:eks/addon:Addon"], "add-ons"):
        assert addon.verdict == "update" and addon.changed == ["addonVersion"]  # EKS's default for 1.35


def test_kubernetes_plus_two_is_flagged():
    d = diff(BASE, **{"raytrain-eks:kubernetesVersion": "1.36"})
    (skip,) = reviewed(d, "VERSION")
    assert "1.34 -> 1.36" in skip and "one minor" in skip


def test_a_new_dlc_digest_reaches_every_pod_on_a_fixed_stack():
    d = diff(BASE, **{"raytrain-eks:dlcImage": OTHER_IMAGE})
    ray = d.of(RAYCLUSTER)
    assert ray.verdict == "update"
    assert {"spec.headGroupSpec.template.spec.containers[0].image",
            "spec.workerGroupSpecs[0].template.spec.containers[0].image"} <= set(ray.changed)
    assert _upgrade_strategy(BASE) == {"type": "Recreate"}  # KubeRay recreates every pod from the new spec


def _upgrade_strategy(config: dict) -> dict:
    (ray,) = [r for r in planned(config) if r["type"] == RAYCLUSTER]
    return ray["inputs"]["spec"].get("upgradeStrategy")


@pytest.mark.parametrize("change", [{"raytrain-eks:dlcImage": OTHER_IMAGE}, {"raytrain-eks:ncclDebug": "WARN"},
                                    {"raytrain-eks:gpuNodeCount": 3}])
def test_a_scaled_stack_applies_the_new_worker_groups_not_the_stored_ones(change):
    """The engine substitutes the OLD stored input for every ignoreChanges path (pulumi/pulumi#2657), and a
    replacement is built from that: replayed here on the RayCluster's stored inputs."""
    before, after = planned({**BASE, **SCALED}), planned({**BASE, **SCALED, **change})
    (old,) = [r for r in before if r["type"] == RAYCLUSTER]
    (new,) = [r for r in after if r["type"] == RAYCLUSTER]
    goal, masked = update_diff.substitute_ignored(old["inputs"], new["inputs"], new["options"]["ignoreChanges"])
    assert masked == [] and goal["spec"]["workerGroupSpecs"] == new["inputs"]["spec"]["workerGroupSpecs"]
    ray = update_diff.compare(before, after).of(RAYCLUSTER)
    assert ray.verdict == "update" and ray.notes == []
    assert any(p.startswith("spec.workerGroupSpecs") for p in ray.changed)
    assert _upgrade_strategy({**BASE, **SCALED}) == {"type": "Recreate"}
    assert "replicas" not in json.dumps(new["inputs"]["spec"]["workerGroupSpecs"])  # the autoscaler's field


def test_the_engine_rule_replayed_shows_what_ignore_changes_did():
    """The replay itself: an ignored path keeps the stored value, and a path the old inputs lack is dropped."""
    old = {"spec": {"workerGroupSpecs": [{"image": "old"}]}, "metadata": {"annotations": {"d": "1"}}}
    new = {"spec": {"workerGroupSpecs": [{"image": "new"}], "extra": 1}, "metadata": {"annotations": {"d": "2"}}}
    goal, masked = update_diff.substitute_ignored(old, new, ["spec.workerGroupSpecs", "spec.extra"])
    assert goal == {"spec": {"workerGroupSpecs": [{"image": "old"}]}, "metadata": {"annotations": {"d": "2"}}}
    assert masked == [("spec", "workerGroupSpecs"), ("spec", "extra")]
    before = [{"type": RAYCLUSTER, "name": "r", "urn": "u", "id": "r-id", "inputs": old, "options": {}}]
    after = [{"type": RAYCLUSTER, "name": "r", "urn": "u", "id": "r-id", "inputs": new, "options": {
        "ignoreChanges": ["spec.workerGroupSpecs"], "replaceOnChanges": ['metadata.annotations["d"]'],
        "deleteBeforeReplace": True}}]
    d = update_diff.compare(before, after)
    assert d.of(RAYCLUSTER).verdict == "replace" and d.of(RAYCLUSTER).forcing == ['metadata.annotations["d"]']
    assert reviewed(d, "STALE")  # the replacement would carry the OLD worker groups: flagged


def test_worker_env_updates_the_raycluster_only():
    d = diff(BASE, **{"raytrain-eks:ncclDebug": "WARN"})
    assert [c.name for c in d.changes if c.verdict != "unchanged" and not c.type.startswith("raytrain:")] == [
        "ray-raycluster"]
    assert all(p.startswith("spec.workerGroupSpecs") for p in nonempty(d.of(RAYCLUSTER).changed, "changed paths"))


def test_a_pools_zone_moves_that_pool_and_renumbers_no_other_subnet():
    before = with_pools(gpu={**POOLS["gpu"], "availabilityZone": "us-east-1a"})
    after = {**before, "raytrain-eks:nodePools": {**POOLS, "gpu": {**POOLS["gpu"], "availabilityZone": "us-east-1c"}}}
    d = update_diff.compare(planned(before), planned(after))
    assert d.of(NODE_GROUP, "gpu-ng").verdict == "replace" and "subnetIds" in d.of(NODE_GROUP, "gpu-ng").forcing
    old_cidrs = {r["name"]: r["inputs"]["cidrBlock"] for r in planned(before) if r["type"] == SUBNET}
    new_cidrs = {r["name"]: r["inputs"]["cidrBlock"] for r in planned(after) if r["type"] == SUBNET}
    kept = nonempty(old_cidrs.keys() & new_cidrs.keys(), "subnets in both plans")
    assert {n: old_cidrs[n] for n in kept} == {n: new_cidrs[n] for n in kept}
    assert verdicts(d, "replace", SUBNET) == [] and reviewed(d, "COLLISION") == []


def test_a_new_pool_creates_its_own_and_touches_no_other_node_group():
    d = diff(with_pools(), **{"raytrain-eks:nodePools": {**POOLS, "data": {"instanceType": "m7i.4xlarge",
                                                                         "desiredSize": 1}}})
    assert "data-ng" in verdicts(d, "create", NODE_GROUP)
    assert verdicts(d, "replace") == [] and verdicts(d, "delete") == []
    assert d.of(NODE_GROUP, "gpu-ng").verdict == d.of(NODE_GROUP, "system-ng").verdict == "unchanged"


def test_a_renamed_pool_is_a_new_node_group_and_the_old_one_goes():
    pools = {"system": POOLS["system"], "train": POOLS["gpu"]}
    d = diff(with_pools(), **{"raytrain-eks:nodePools": pools})
    assert "train-ng" in verdicts(d, "create", NODE_GROUP) and "gpu-ng" in verdicts(d, "delete", NODE_GROUP)
    assert d.of(NODE_GROUP, "system-ng").verdict == "unchanged"
    assert reviewed(d, "COLLISION") == [] and reviewed(d, "DATA") == []


def test_a_cluster_rename_replaces_the_cluster_and_never_the_bucket():
    d = diff(BASE, **{"raytrain-eks:clusterName": "raytrain-renamed"})
    eks = d.of("aws:eks/cluster:Cluster")
    assert eks.verdict == "replace" and eks.forcing == ["name"] and "name" in rule("aws:eks/cluster:Cluster")
    assert d.of(BUCKET).verdict in ("unchanged", "update")
    assert reviewed(d, "DATA") == [] and reviewed(d, "COLLISION") == []
    assert "bucketPrefix" in rule(BUCKET)  # what would have replaced it


def test_a_kuberay_version_updates_the_operator_release_and_its_crds_in_place():
    """The CRDs are the new chart's (tests/charts.py's stand-in for 1.6.0: 1.7.0's with a changed spec)."""
    d = diff(BASE, **{"raytrain-eks:kuberayVersion": "1.6.0"})
    release = d.of("kubernetes:helm.sh/v3:Release", "ray-kuberay-operator")
    assert release.verdict == "update" and "version" in release.changed
    # only the operator's image pin (no cloud object: the new tag is pinned anew)
    assert verdicts(d, "replace") == ["ray-kuberay-operator-image"] and reviewed(d, "NODES") == []
    assert rule("pulumi-python:dynamic/raytrain:PinnedImage") == ["image"]
    crds = nonempty([c for c in d.changes if c.type == CRD], "CRDs in the plan")
    assert sorted(c.name for c in crds) == [f"ray-crd-{n}.ray.io" for n in ("rayclusters", "raycronjobs", "rayjobs",
                                                                          "rayservices")]
    assert all(c.verdict == "update" and c.changed == ["spec.sha256"] and c.forcing == [] for c in crds)
    # pulumi-kubernetes' diff.go has no apiextensions entry: only a CRD's name or namespace replaces it
    assert update_diff.type_rules(CRD)["force_new"] == ["metadata.name", "metadata.namespace"]
    (note,) = reviewed(d, "CRDS")
    assert "rayclusters.ray.io, raycronjobs.ray.io, rayjobs.ray.io, rayservices.ray.io applied in place" in note
    assert reviewed(d, "DATA") == []


def test_a_crd_dropped_by_a_chart_is_flagged_and_stays_in_the_cluster():
    """Deleting a CRD deletes every custom resource of it: the review says so, and that it is retained."""
    before = planned(BASE)
    after = [r for r in before if r["name"] != "ray-crd-raycronjobs.ray.io"]
    d = update_diff.compare(before, after)
    assert d.of(CRD, "ray-crd-raycronjobs.ray.io").verdict == "delete"
    (note,) = reviewed(d, "DATA")
    assert "ray-crd-raycronjobs.ray.io" in note and "retainOnDelete" in note


def test_a_chart_version_without_declared_crds_is_still_flagged():
    """A plan from before the CRDs were declared: Helm alone would leave them old."""
    old = [r for r in planned(BASE) if r["type"] != CRD]
    new = [r for r in planned({**BASE, "raytrain-eks:kuberayVersion": "1.6.0"}) if r["type"] != CRD]
    (note,) = reviewed(update_diff.compare(old, new), "CRDS")
    assert "kuberay-operator 1.6.0" in note and "Helm never upgrades CRDs" in note


# --- the diff's own rules ---------------------------------------------------------------------------------

def _subnet(name: str, cidr: str, **options) -> dict:
    return {"type": SUBNET, "name": name, "urn": name, "id": f"{name}-id", "options": options,
            "inputs": {"cidrBlock": cidr, "vpcId": "vpc-id", "availabilityZone": "us-east-1a"}}


def test_a_create_before_delete_subnet_with_an_existing_cidr_is_a_collision():
    before = [_subnet("a", "10.0.0.0/19"), _subnet("b", "10.0.32.0/19")]
    after = [_subnet("a", "10.0.32.0/19"), _subnet("b", "10.0.64.0/19")]
    d = update_diff.compare(before, after)
    assert d.of(SUBNET, "a").verdict == "replace" and d.of(SUBNET, "a").forcing == ["cidrBlock"]
    (collision,) = reviewed(d, "COLLISION")
    assert "subnet a (10.0.32.0/19) overlaps existing b" in collision


def test_a_replaced_id_reaches_every_input_that_carries_it():
    before = [_subnet("a", "10.0.0.0/19"),
              {"type": NODE_GROUP, "name": "ng", "urn": "ng", "id": "ng-id", "options": {},
               "inputs": {"subnetIds": ["a-id"], "clusterName": "c"}}]
    after = [_subnet("a", "10.0.64.0/19"), before[1]]
    d = update_diff.compare(before, after)
    assert d.of(NODE_GROUP).verdict == "replace" and d.of(NODE_GROUP).forcing == ["subnetIds"]
    assert reviewed(d, "NODES")


def test_the_plan_command_prints_the_diff(tmp_path, capsys):
    assert plan.main(["--stack", "dev", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert plan.main(["--stack", "dev", "--compare-to", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Update against the earlier plan" in out and "0 replace, 0 update, 0 delete" in out
    assert plan.main(["--compare-to", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "--compare-to" in err and "resources.json" in err


def test_a_plan_written_before_urns_and_options_were_recorded_still_compares():
    """A base branch's resources.json may hold only type, name and inputs: matched by type and name, its ids
    are the mocks' `<name>-id`, so a replaced subnet still reaches the node group that names it."""
    old = [{k: r[k] for k in ("type", "name", "inputs")} for r in planned(BASE)]
    d = update_diff.compare(old, planned(BASE))
    assert d.by_verdict("create") == [] and d.by_verdict("delete") == [] and d.by_verdict("replace") == []
    moved = [{**r, "inputs": {**r["inputs"], "cidrBlock": "10.0.96.0/19"}} if r["name"] == "net-private-us-east-1a"
             else r for r in old]
    d = update_diff.compare(moved, planned(BASE))
    assert d.of(SUBNET, "net-private-us-east-1a").verdict == "replace"
    assert d.of(NODE_GROUP, "gpu-ng").verdict == "replace" and d.of(NODE_GROUP, "gpu-ng").forcing == ["subnetIds"]


def test_a_capacity_block_node_group_that_would_roll_is_told_to_scale_to_zero():
    group = {"type": NODE_GROUP, "name": "gpu-ng", "urn": "g", "id": "gpu-ng-id", "options": {},
             "inputs": {"capacityType": "CAPACITY_BLOCK", "version": "1.34", "subnetIds": ["s"]}}
    d = update_diff.compare([group], [{**group, "inputs": {**group["inputs"], "version": "1.35"}}])
    assert any("Capacity Block node group, which EKS updates only at zero nodes" in n for n in reviewed(d, "NODES"))
    plain = {**group, "inputs": {**group["inputs"], "capacityType": "ON_DEMAND"}}
    d = update_diff.compare([plain], [{**plain, "inputs": {**plain["inputs"], "version": "1.35"}}])
    assert not any("Capacity Block" in n for n in d.review) and reviewed(d, "NODES")
