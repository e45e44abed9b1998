"""Stack configuration: defaults, parsing of both value forms, and every bad input named."""
from __future__ import annotations

import dataclasses

import pytest

from deploy.config import DEFAULT_DLC_IMAGE, ConfigError, load
from facts import catalog, images
from tests.guards import nonempty

GOOD = {"aws:region": "us-east-1", "raytrain-eks:apiAccessCidrs": ["203.0.113.10/32"]}


def problems_for(**overrides) -> list[str]:
    raw = dict(GOOD)
    for key, value in overrides.items():
        full = key if ":" in key else f"raytrain-eks:{key}"
        if value is None:
            raw.pop(full, None)
        else:
            raw[full] = value
    with pytest.raises(ConfigError) as info:
        load(raw, stack="dev")
    return info.value.problems


def test_defaults_match_the_reference_deployment():
    cfg = load(GOOD, stack="dev")
    assert cfg.cluster_name == "raytrain-eks-dev"
    system, gpu = cfg.node_pools
    assert (system.name, system.instance_type, system.max_size) == ("system", "m7i.xlarge", 1)
    assert (gpu.name, gpu.instance_type, gpu.min_size, gpu.max_size) == ("gpu", "g6.12xlarge", 2, 2)
    assert gpu.capacity_type == "ON_DEMAND" and gpu.capacity_reservation_id is None
    assert gpu.placement_group is True and gpu.efa and gpu.ray_worker_group == "gpu-workers"
    assert dict(gpu.labels) == {"role": "gpu-worker", "nvidia.com/gpu.present": "true"}
    assert dict(system.labels) == {"role": "system"} and not system.taints and not system.ray_worker_group
    assert cfg.ray_version == "2.58.0" and cfg.kuberay_version == "1.7.0"
    assert cfg.dlc_image == DEFAULT_DLC_IMAGE and not images.parse(cfg.dlc_image).digest  # a tag: the plan pins it
    assert cfg.retain_checkpoints_on_destroy is True and cfg.checkpoint_bucket is None
    assert cfg.availability_zone is None and cfg.admin_role_arns == ()
    assert cfg.api_access_cidrs == ("203.0.113.10/32",)
    assert gpu.gpus == 4 and gpu.instance.efa_interfaces == 1


def test_config_is_immutable():
    cfg = load(GOOD, stack="dev")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.cluster_name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.tags["x"] = "y"  # type: ignore[index]


def test_engine_strings_and_yaml_values_parse_the_same():
    native = load({**GOOD, "raytrain-eks:gpuNodeCount": 4, "raytrain-eks:placementGroup": False,
                   "raytrain-eks:tags": {"team": "ml"}}, stack="dev")
    strings = load({"aws:region": "us-east-1", "raytrain-eks:apiAccessCidrs": '["203.0.113.10/32"]',
                    "raytrain-eks:gpuNodeCount": "4", "raytrain-eks:placementGroup": "false",
                    "raytrain-eks:tags": '{"team": "ml"}'}, stack="dev")
    assert native == strings
    gpu = strings.pool("gpu")
    assert gpu.max_size == 4 and gpu.placement_group is False and dict(strings.tags) == {"team": "ml"}


def test_a_capacity_reservation_turns_the_default_placement_group_off():
    cfg = load({**GOOD, "raytrain-eks:capacityReservationId": "cr-0123456789abcdef0"}, stack="dev")
    assert cfg.pool("gpu").placement_group is False


def test_digest_image_is_used_as_is():
    image = "public.ecr.aws/deep-learning-containers/ray@sha256:" + "ab" * 32
    cfg = load({**GOOD, "raytrain-eks:dlcImage": image}, stack="dev")
    assert cfg.dlc_image == image and images.parse(cfg.dlc_image).digest == "sha256:" + "ab" * 32


BAD = [
    # (overrides, key named in the message, words the message must contain)
    ({"aws:region": None}, "aws:region", "not set"),
    ({"aws:region": "mars-1"}, "aws:region", "not an AWS region"),
    ({"apiAccessCidrs": None}, "apiAccessCidrs", "0.0.0.0/0"),
    ({"apiAccessCidrs": ["0.0.0.0/0"]}, "apiAccessCidrs", "whole internet"),
    ({"apiAccessCidrs": ["10.0.0.300/32"]}, "apiAccessCidrs", "not a CIDR"),
    ({"apiAccessCidrs": []}, "apiAccessCidrs", "empty"),
    ({"gpuNodeType": "g5.12xlarge"}, "gpuNodeType", "no EFA"),
    ({"gpuNodeType": "x9.huge"}, "gpuNodeType", "not in the instance catalog"),
    ({"gpuNodeCount": 0}, "gpuNodeCount", "out of range"),
    ({"gpuNodeCount": "two"}, "gpuNodeCount", "not a whole number"),
    ({"systemNodeType": "t2.nano"}, "systemNodeType", "not in the instance catalog"),
    ({"systemNodeCount": 0}, "systemNodeCount", "out of range"),
    ({"capacityType": "RESERVED"}, "capacityType", "ON_DEMAND, SPOT"),
    ({"capacityReservationId": "cr-123"}, "capacityReservationId", "capacity reservation id"),
    ({"capacityReservationId": "cr-0123456789abcdef0", "capacityType": "SPOT"}, "capacityReservationId", "ON_DEMAND"),
    ({"capacityReservationId": "cr-0123456789abcdef0", "placementGroup": True}, "placementGroup", "InsufficientInstanceCapacity"),
    ({"placementGroup": "maybe"}, "placementGroup", "true or false"),
    ({"availabilityZone": "eu-west-1a"}, "availabilityZone", "not in region us-east-1"),
    ({"availabilityZone": "useast1"}, "availabilityZone", "availability zone name"),
    ({"kubernetesVersion": "1.20"}, "kubernetesVersion", "1.34, 1.35, 1.36"),
    ({"clusterName": "bad name!"}, "clusterName", "valid EKS cluster name"),
    ({"adminRoleArns": ["admin"]}, "adminRoleArns", "not an IAM role"),
    ({"dlcImage": "ray:latest"}, "dlcImage", "registry/repository"),
    ({"dlcImage": "public.ecr.aws/x/ray@sha256:1234"}, "dlcImage", "registry/repository@sha256"),
    ({"dlcImage": "myregistry/ray:2.58"}, "dlcImage", "would read it as a Docker Hub namespace"),
    ({"rayVersion": "2.40.0"}, "rayVersion", "token authentication"),
    ({"rayVersion": "latest"}, "rayVersion", "not a version"),
    ({"kuberayVersion": "one"}, "kuberayVersion", "not a version"),
    ({"checkpointBucket": "Bad_Bucket"}, "checkpointBucket", "S3 bucket name"),
    ({"retainCheckpointsOnDestroy": "sometimes"}, "retainCheckpointsOnDestroy", "true or false"),
    ({"tags": {"aws:owner": "me"}}, "tags", "reserved prefix"),
    ({"tags": "not-a-map"}, "tags", "not a dict"),
    ({"ncclDebug": "LOUD"}, "ncclDebug", "INFO"),
    ({"gpuNodeTyp": "g6.12xlarge"}, "gpuNodeTyp", "did you mean raytrain-eks:gpuNodeType"),
    ({"scaleToZero": "sometimes"}, "scaleToZero", "true or false"),
    ({"scaleToZero": True, "capacityReservationId": "cr-0123456789abcdef0", "placementGroup": False},
     "scaleToZero", "bills its instances whether they run or not"),
    ({"scaleToZero": True, "gpuIdleTimeoutMinutes": 0}, "gpuIdleTimeoutMinutes", "out of range"),
    ({"scaleToZero": True, "gpuIdleTimeoutMinutes": "ten"}, "gpuIdleTimeoutMinutes", "not a whole number"),
    ({"gpuIdleTimeoutMinutes": 5}, "gpuIdleTimeoutMinutes", "no effect unless raytrain-eks:scaleToZero is true"),
    ({"scaleToZero": True, "clusterAutoscalerVersion": "latest"}, "clusterAutoscalerVersion", "e.g. 9.59.0"),
    ({"scaleToZero": True, "clusterAutoscalerVersion": "9.43.1"}, "clusterAutoscalerVersion", "never scales"),
    ({"clusterAutoscalerVersion": "9.59.0"}, "clusterAutoscalerVersion", "no effect unless"),
    ({"scaleToZero": True, "clusterAutoscalerImageTag": "1.36.1"}, "clusterAutoscalerImageTag", "vMAJOR.MINOR.PATCH"),
    ({"scaleToZero": True, "clusterAutoscalerImageTag": "v1.36.1@sha256:abc"}, "clusterAutoscalerImageTag",
     "@sha256:<64 hex>"),
    ({"scaleToZero": True, "clusterAutoscalerImageTag": "v1.35.2"}, "clusterAutoscalerImageTag",
     "minor version must match the cluster's, e.g. v1.36.1"),
    ({"scaleToZero": True, "kubernetesVersion": "1.34", "clusterAutoscalerImageTag": "v1.36.1"},
     "clusterAutoscalerImageTag", "e.g. v1.34.5"),
    ({"scaleToZer": True}, "scaleToZer", "did you mean raytrain-eks:scaleToZero"),
    # AWS's own rules (infra.aws_rules), each a value AWS would refuse mid-apply
    ({"aws:region": "us-east-7"}, "aws:region", "not a region where AWS offers EKS"),
    ({"aws:region": "eu-west-9"}, "aws:region", "did you mean"),
    ({"aws:regin": "us-east-1"}, "aws:regin", "did you mean aws:region?"),
    ({"raytrain_eks:gpuNodeType": "p5.48xlarge"}, "raytrain_eks:gpuNodeType", "did you mean raytrain-eks:gpuNodeType?"),
    ({"aws:accessKey": "AKIA0000000000000000"}, "aws:accessKey", "static credentials"),
    ({"aws:allowedAccountIds": ["12345"]}, "aws:allowedAccountIds", "12-digit AWS account ID"),
    ({"aws:maxRetries": "many"}, "aws:maxRetries", "not an integer"),
    ({"apiAccessCidrs": ["10.1.2.3/32"]}, "apiAccessCidrs", "private (RFC 1918)"),
    ({"apiAccessCidrs": ["100.64.0.1/32"]}, "apiAccessCidrs", "shared address space"),
    ({"apiAccessCidrs": ["127.0.0.1/32"]}, "apiAccessCidrs", "loopback"),
    ({"apiAccessCidrs": ["2001:db8::/64"]}, "apiAccessCidrs", "IPv4 CIDRs only"),
    ({"apiAccessCidrs": ["0.0.0.0/1", "128.0.0.0/1"]}, "apiAccessCidrs", "together cover 0.0.0.0/0"),
    ({"apiAccessCidrs": ["0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/1"]}, "apiAccessCidrs", "together cover 0.0.0.0/0"),
    ({"checkpointBucket": "team..ml"}, "checkpointBucket", "two adjacent dots"),
    ({"checkpointBucket": "xn--ckpt"}, "checkpointBucket", "prefix S3 reserves"),
    ({"checkpointBucket": "ckpt-s3alias"}, "checkpointBucket", "suffix S3 reserves"),
    ({"checkpointBucket": "192.168.1.1"}, "checkpointBucket", "IP address"),
    ({"checkpointBucket": "a" * 64}, "checkpointBucket", "3 to 63"),
    ({"tags": {f"t{i}": "x" for i in range(46)}}, "tags", "exceed AWS's 50 tags per resource"),
    ({"tags": {"team": "ml"}, "aws:defaultTags": {"tags": {f"d{i}": "x" for i in range(45)}}}, "tags", "keep at most 45"),
    ({"tags": {"owner": "me!"}}, "tags", "S3 and IAM tags allow only"),
    ({"tags": {"owner": "x" * 257}}, "tags", "at most 256"),
    ({"aws:defaultTags": {"tags": {"owner": "a&b"}}}, "aws:defaultTags", "S3 and IAM tags allow only"),
    ({"capacityType": "CAPACITY_BLOCK"}, "capacityType", "needs the Capacity Block's reservation"),
    ({"availabilityZone": "use1-az"}, "availabilityZone", "zone ID such as use1-az4"),
    ({"controlPlaneLogRetentionDays": 10}, "controlPlaneLogRetentionDays", "1, 3, 5, 7, 14, 30"),
    ({"noncurrentVersionExpirationDays": 0}, "noncurrentVersionExpirationDays", "out of range"),
    ({"costWarningPerDay": "lots"}, "costWarningPerDay", "positive amount of US dollars"),
]


@pytest.mark.parametrize("overrides,key,words", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_configuration_names_the_key_and_the_fix(overrides, key, words):
    problems = problems_for(**overrides)
    matching = [p for p in problems if p.startswith(key if ":" in key else f"raytrain-eks:{key}")]
    assert matching, problems
    assert any(words in p for p in matching), matching


def test_at_least_fifteen_distinct_keys_are_covered_by_bad_cases():
    assert len({key for _, key, _ in BAD}) >= 15


def test_all_problems_are_reported_together():
    problems = problems_for(gpuNodeCount=0, capacityType="X", tags={"aws:x": "y"}, gpuNodeTyp="z",
                            **{"aws:region": None})
    keys = {p.split(":")[0] + ":" + p.split(":")[1] for p in problems}
    assert {"raytrain-eks:gpuNodeCount", "raytrain-eks:capacityType", "raytrain-eks:tags",
            "raytrain-eks:gpuNodeTyp", "aws:region"} <= keys
    message = str(ConfigError(problems))
    assert f"{len(problems)} problem(s)" in message


def test_unknown_gpu_type_lists_the_supported_ones():
    (problem,) = problems_for(gpuNodeType="g5.12xlarge")
    for name in nonempty(catalog.GPU_TYPES, "GPU types in the catalog"):
        assert name in problem


def test_aws_and_pulumi_settings_are_read_and_other_namespaces_refused():
    cfg = load({**GOOD, "aws:profile": "dev", "pulumi:tags": {"team": "ml"}}, stack="dev")
    assert cfg.region == "us-east-1" and dict(cfg.aws_settings) == {"profile": "dev"}
    problems = problems_for(**{"kubernetes:context": "x"})
    assert any(p.startswith("kubernetes:context: namespace 'kubernetes' is read by nothing") for p in problems)


@pytest.mark.parametrize("stack,why", [("team.ml", "holds characters EKS refuses"), ("s" * 90, "EKS allows 1 to 100")])
def test_a_default_cluster_name_eks_would_refuse_is_an_error_naming_the_stack(stack, why):
    with pytest.raises(ConfigError) as info:
        load(GOOD, stack=stack)
    (problem,) = info.value.problems
    assert problem.startswith("raytrain-eks:clusterName: not set") and f"stack {stack!r}" in problem and why in problem
    assert "pulumi config set raytrain-eks:clusterName" in problem
    assert load({**GOOD, "raytrain-eks:clusterName": "team-ml"}, stack=stack).cluster_name == "team-ml"


def test_repeated_admin_arns_are_kept_once():
    arn = "arn:aws:iam::123456789012:role/Admin"
    cfg = load({**GOOD, "raytrain-eks:adminRoleArns": [arn, "arn:aws:iam::123456789012:role/Ops", arn]}, stack="dev")
    assert cfg.admin_role_arns == (arn, "arn:aws:iam::123456789012:role/Ops")


def test_documentation_ranges_plan_as_placeholders_and_public_ranges_do_not():
    cfg = load(GOOD, stack="dev")
    (placeholder,) = cfg.placeholders
    assert placeholder.startswith("raytrain-eks:apiAccessCidrs: 203.0.113.10/32 is a documentation range")
    assert "checkip.amazonaws.com" in placeholder
    public = load({**GOOD, "raytrain-eks:apiAccessCidrs": ["52.94.0.0/22", "8.8.8.8/32"]}, stack="dev")
    assert public.placeholders == () and public.api_access_cidrs == ("52.94.0.0/22", "8.8.8.8/32")


def test_capacity_blocks_and_zone_ids_are_accepted():
    cfg = load({**GOOD, "raytrain-eks:capacityType": "CAPACITY_BLOCK", "raytrain-eks:gpuNodeType": "p5.48xlarge",
                "raytrain-eks:capacityReservationId": "cr-0123456789abcdef0",
                "raytrain-eks:availabilityZone": "use1-az6"}, stack="p5")
    assert cfg.pool("gpu").capacity_type == "CAPACITY_BLOCK" and cfg.availability_zone == "use1-az6"
    assert cfg.pool("gpu").placement_group is False


# --- StackConfig is derived from the key declarations ----------------------------------------------

def _field_default(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def test_every_declared_key_is_a_stack_config_field_with_the_declared_default():
    """One declaration per key: the field is the declaration, so names and defaults cannot drift apart."""
    from deploy import config

    by_field = {f.name: f for f in dataclasses.fields(config.StackConfig)}
    sets = config.key_fields()
    pool_sources = set(config.KEYS) - set(sets)
    assert pool_sources == {"nodePools", *config.SHORTHAND_KEYS}  # these build node_pools, they set no field
    assert config.SHORTHAND_KEYS[:4] == ("systemNodeType", "systemNodeCount", "gpuNodeType", "gpuNodeCount")
    for key, name in nonempty(sets.items(), "stack keys that set a field"):
        camel = name.split("_")[0] + "".join(w.capitalize() for w in name.split("_")[1:])
        assert camel == key, (key, name)
        assert _field_default(by_field[name]) == config.KEYS[key].default, key
    # What is not a stack key is explicit, and docs/configuration.md's rows are these declarations in field order.
    assert set(by_field) - set(sets.values()) == {"project", "stack", "region", "node_pools", "aws_settings",
                                                  "placeholders"}
    rows = config.markdown_tables()["stack"].splitlines()[3:]
    assert [r.split("`")[1] for r in rows] == list(config.KEYS)


def test_a_new_declaration_is_a_new_field_read_from_the_stack_file():
    """Adding a key is one `stack_key` field: it is declared, parsed, defaulted and refused by name."""
    from deploy import config

    @dataclasses.dataclass(frozen=True)
    class Extended(config.StackConfig):
        max_jobs: int = config.stack_key("maxJobs", 3, config._as_int(1, 9), "jobs at once, 1 to 9")

    assert config.declared_keys(Extended)["maxJobs"].default == 3
    assert config.key_fields(Extended)["maxJobs"] == "max_jobs"
    assert load(GOOD, stack="dev", cls=Extended).max_jobs == 3
    cfg = load({**GOOD, "raytrain-eks:maxJobs": "5"}, stack="dev", cls=Extended)
    assert isinstance(cfg, Extended) and cfg.max_jobs == 5 and cfg.cluster_name == "raytrain-eks-dev"
    with pytest.raises(ConfigError) as info:
        load({**GOOD, "raytrain-eks:maxJobs": 12}, stack="dev", cls=Extended)
    assert info.value.problems == ["raytrain-eks:maxJobs: 12 is out of range; set it to an integer between 1 and 9"]
    assert "raytrain-eks:maxJobs: unknown configuration key" in problems_for(maxJobs=5)[0]  # StackConfig has none


def test_load_sets_every_field_from_its_own_key():
    """A non-default value for each key lands in that key's field (nothing is copied by hand)."""
    from deploy import config

    given = {"availabilityZone": "us-east-1b", "kubernetesVersion": "1.35", "clusterName": "c1",
             "adminRoleArns": ["arn:aws:iam::123456789012:role/Admin"],
             "dlcImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/ray:2.58", "rayVersion": "2.57.0",
             "kuberayVersion": "1.6.0", "nvidiaDevicePluginVersion": "0.19.0", "efaDevicePluginVersion": "v0.5.30",
             "ncclDebug": "WARN", "rayNamespace": "train", "checkpointBucket": "my-ckpt-bucket",
             "noncurrentVersionExpirationDays": 7, "controlPlaneLogRetentionDays": 60, "costWarningPerDay": 50,
             "gpuIdleTimeoutMinutes": 20, "clusterAutoscalerVersion": "9.58.0", "clusterAutoscalerImageTag": "v1.35.1",
             "retainCheckpointsOnDestroy": False, "tags": {"team": "ml"}, "scaleToZero": True, "monitoring": "cloudwatch"}
    assert set(config.key_fields()) - set(given) == {"apiAccessCidrs"}  # GOOD sets it; a new key needs a value here
    cfg = load({**GOOD, **{f"raytrain-eks:{k}": v for k, v in given.items()}}, stack="dev")
    for key, name in nonempty(config.key_fields().items(), "stack keys that set a field"):
        if key == "apiAccessCidrs":
            continue
        expected = config.KEYS[key].parse(key, given[key], config.Problems())
        assert getattr(cfg, name) == expected and expected != config.KEYS[key].default, key
