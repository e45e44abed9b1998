"""The stack configuration: read once, validated whole, then frozen.

Every setting of a stack (Pulumi.<stack>.yaml, or `pulumi config set`) lands in
one StackConfig before any resource is declared. Problems are collected and
reported together, each naming the key, the bad value, why it is wrong and how
to fix it, so a user fixes a stack file in one pass instead of one `pulumi up`
per mistake.

Values arrive either as strings (the Pulumi engine passes every value, and
structured values as JSON) or as YAML-native types (Pulumi.<stack>.yaml read by
the offline plan); both are accepted.
"""
from __future__ import annotations

import difflib
import ipaddress
import json
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from facts import catalog, images
from facts import ray as ray_facts
from infra import aws_provider, aws_rules

PROJECT = "raytrain-eks"

SUPPORTED_KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36")
DEFAULT_DLC_IMAGE = images.EXAMPLE
MIN_RAY_VERSION = (2, 52, 0)
MIN_KUBERAY_VERSION = (1, 5, 1)  # RayCluster spec.authOptions; older CRDs drop the field and leave Ray unauthenticated
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
# Cluster Autoscaler image per Kubernetes minor: CA is built and tested against one minor, and
# the chart's default image lags (chart 9.59.0, the newest confirmed, still ships v1.35.0).
# Newest patch releases as of 2026-07-23 (github.com/kubernetes/autoscaler/releases).
CLUSTER_AUTOSCALER_IMAGE_TAGS = {"1.34": "v1.34.5", "1.35": "v1.35.2", "1.36": "v1.36.1"}
DEFAULT_CLUSTER_AUTOSCALER_CHART = "9.59.0"
MIN_CLUSTER_AUTOSCALER_CHART = (9, 47, 0)
CAPACITY_TYPES = ("ON_DEMAND", "SPOT", "CAPACITY_BLOCK")
# Namespaces a stack file may use: this project's, the AWS provider's (handed to the explicit provider),
# and Pulumi's own (pulumi:tags, ...). Any other namespace is read by nobody.
KNOWN_NAMESPACES = ("aws", "pulumi")
# The most tags the program adds to one resource: project and stack, plus Name and the two Kubernetes
# subnet tags on a subnet. AWS allows 50 per resource.
PROJECT_TAGS_PER_RESOURCE = 5
# Cluster Autoscaler 1.35 and 1.36 wait for informers on resource.k8s.io (DRA) objects; charts before
# 9.54.0 grant no RBAC for them, so the autoscaler starts but never scales (kubernetes/autoscaler chart history).
MIN_CLUSTER_AUTOSCALER_CHART_FOR = {"1.34": (9, 47, 0), "1.35": (9, 54, 0), "1.36": (9, 54, 0)}
SCALE_TO_ZERO_KEYS = ("gpuIdleTimeoutMinutes", "clusterAutoscalerVersion", "clusterAutoscalerImageTag")

_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
_ZONE_NAME = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$")
_ZONE_ID = re.compile(r"^[a-z]{2,5}\d-az\d+$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")
_RESERVATION = re.compile(r"^cr-[0-9a-f]{17}$")
_SEMVER = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")
_CA_VERSION_TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")


class ConfigError(ValueError):
    """All configuration problems of a stack, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid stack configuration ({len(self.problems)} problem(s)):\n{lines}")


@dataclass(frozen=True)
class StackConfig:
    project: str
    stack: str
    region: str
    availability_zone: str | None
    kubernetes_version: str
    cluster_name: str
    system_node_type: str
    system_node_count: int
    gpu_node_type: str
    gpu_node_count: int
    capacity_type: str
    capacity_reservation_id: str | None
    placement_group: bool
    api_access_cidrs: tuple[str, ...]
    admin_role_arns: tuple[str, ...]
    dlc_image: str
    ray_version: str
    kuberay_version: str
    nvidia_device_plugin_version: str
    efa_device_plugin_version: str
    nccl_debug: str
    ray_namespace: str
    checkpoint_bucket: str | None
    retain_checkpoints_on_destroy: bool
    scale_to_zero: bool = False
    gpu_idle_timeout_minutes: int = 10
    cluster_autoscaler_version: str = DEFAULT_CLUSTER_AUTOSCALER_CHART
    cluster_autoscaler_image_tag: str = CLUSTER_AUTOSCALER_IMAGE_TAGS[SUPPORTED_KUBERNETES_VERSIONS[-1]]
    tags: Mapping[str, str] = field(default_factory=dict)
    aws_settings: Mapping[str, Any] = field(default_factory=dict)
    placeholders: tuple[str, ...] = ()
    noncurrent_version_expiration_days: int = 3
    control_plane_log_retention_days: int = 30
    cost_warning_per_day: float = 1000.0

    ray_cluster_name = ray_facts.CLUSTER_NAME
    ray_service_account = ray_facts.SERVICE_ACCOUNT

    @property
    def ray_head_service(self) -> str:
        return ray_facts.head_service(self.ray_cluster_name)

    @property
    def gpu(self) -> catalog.GpuInstanceType:
        return catalog.GPU_TYPES[self.gpu_node_type]

    @property
    def system(self) -> catalog.CpuInstanceType:
        return catalog.CPU_TYPES[self.system_node_type]

    @property
    def image_is_digest(self) -> bool:
        return images.parse(self.dlc_image).is_pinned

    @property
    def resource_tags(self) -> dict[str, str]:
        """Tags for every AWS resource: the user's plus the project and stack."""
        return {"project": self.project, "stack": self.stack, **self.tags}


@dataclass(frozen=True)
class _Key:
    name: str
    default: Any
    parse: Callable[[str, Any, list[str]], Any]
    help: str


def _as_str(key, value, problems):
    if isinstance(value, (dict, list)):
        problems.append(f"{key}: expected a single value, got {value!r}; write it as a plain string")
        return None
    return str(value).strip()


def _as_int(lo: int, hi: int):
    def parse(key, value, problems):
        try:
            number = int(str(value).strip())
        except ValueError:
            problems.append(f"{key}: {value!r} is not a whole number; set it to an integer between {lo} and {hi}")
            return None
        if not lo <= number <= hi:
            problems.append(f"{key}: {number} is out of range; set it to an integer between {lo} and {hi}")
            return None
        return number
    return parse


def _as_bool(key, value, problems):
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    problems.append(f"{key}: {value!r} is not a boolean; set it to true or false")
    return None


def _structured(key, value, kind, problems, example):
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            if kind is list:
                value = [v.strip() for v in value.split(",") if v.strip()]
            else:
                problems.append(f"{key}: {value!r} is not a {kind.__name__}; write it as {example}")
                return None
    if not isinstance(value, kind):
        problems.append(f"{key}: {value!r} is not a {kind.__name__}; write it as {example}")
        return None
    return value


def _one_of(choices: tuple[str, ...]):
    def parse(key, value, problems):
        text = _as_str(key, value, problems)
        if text is None:
            return None
        if text not in choices:
            problems.append(f"{key}: {text!r} is not supported; use one of {', '.join(choices)}")
            return None
        return text
    return parse


def _matching(pattern: re.Pattern, what: str):
    def parse(key, value, problems):
        text = _as_str(key, value, problems)
        if text is None:
            return None
        if not pattern.match(text):
            problems.append(f"{key}: {text!r} is not {what}")
            return None
        return text
    return parse


def _gpu_type(key, value, problems):
    text = _as_str(key, value, problems)
    if text is None:
        return None
    if text in catalog.GPU_TYPES:
        return text
    supported = ", ".join(catalog.GPU_TYPES)
    why = "has no EFA network interface" if text in catalog.NON_EFA_GPU_TYPES else "is not in the instance catalog"
    problems.append(f"{key}: {text!r} {why}; use one of the supported EFA GPU types: {supported}")
    return None


def _cpu_type(key, value, problems):
    text = _as_str(key, value, problems)
    if text is None:
        return None
    if text not in catalog.CPU_TYPES:
        problems.append(f"{key}: {text!r} is not in the instance catalog; use one of {', '.join(catalog.CPU_TYPES)}")
        return None
    return text


def _cidrs(key, value, problems):
    items = _structured(key, value, list, problems, '["203.0.113.10/32"]')
    if items is None:
        return None
    if not items:
        problems.append(f"{key}: the list is empty; give the CIDRs allowed to reach the EKS API, e.g. your address as x.x.x.x/32")
        return None
    good = []
    for item in items:
        try:
            net = ipaddress.ip_network(str(item), strict=True)
        except ValueError as err:
            problems.append(f"{key}: {item!r} is not a CIDR ({err}); write it like 203.0.113.10/32")
            continue
        if net.prefixlen == 0:
            problems.append(
                f"{key}: {item!r} opens the EKS API endpoint to the whole internet; "
                "list only the addresses you deploy from (e.g. your IP as x.x.x.x/32)")
            continue
        if why := aws_rules.public_cidr_problem(net):
            problems.append(f"{key}: {item!r} {why}; list the public addresses you deploy from "
                            "(your IP: curl -s https://checkip.amazonaws.com)")
            continue
        good.append(net)
    if len(good) > 1 and aws_rules.covers_everything(good):
        problems.append(
            f"{key}: {', '.join(map(str, good))} together cover 0.0.0.0/0 and open the EKS API endpoint to the "
            "whole internet; list only the addresses you deploy from (e.g. your IP as x.x.x.x/32)")
    return tuple(str(n) for n in good)


def _role_arns(key, value, problems):
    items = _structured(key, value, list, problems, '["arn:aws:iam::123456789012:role/Admin"]')
    if items is None:
        return None
    for item in items:
        if not _ROLE_ARN.match(str(item)):
            problems.append(f"{key}: {item!r} is not an IAM role or user ARN; write it like arn:aws:iam::123456789012:role/Admin")
    # EKS takes one access entry per principal: a repeated ARN would fail CreateAccessEntry.
    return tuple(dict.fromkeys(str(i) for i in items))


def _tags(key, value, problems):
    mapping = _structured(key, value, dict, problems, '{"team": "ml", "cost-center": "1234"}')
    if mapping is None:
        return None
    for tag, tag_value in mapping.items():
        if isinstance(tag_value, (dict, list)):
            problems.append(f"{key}: the value of tag {tag!r} must be a string, got {tag_value!r}")
            continue
        problems.extend(f"{key}: {why}" for why in aws_rules.tag_problems(str(tag), str(tag_value)))
    return MappingProxyType({str(k): str(v) for k, v in mapping.items()})


def _version(minimum: tuple[int, int, int] | None = None,
             why: str = "the first version with token authentication; use the version of the DLC image (2.58.0)",
             example: str = "2.58.0"):
    def parse(key, value, problems):
        text = _as_str(key, value, problems)
        if text is None:
            return None
        match = _SEMVER.match(text)
        if not match:
            problems.append(f"{key}: {text!r} is not a version; write it as MAJOR.MINOR.PATCH, e.g. {example}")
            return None
        if minimum and tuple(int(g) for g in match.groups()) < minimum:
            problems.append(
                f"{key}: {text} is older than {'.'.join(map(str, minimum))}, {why}")
            return None
        return text
    return parse


def _ca_image_tag(key, value, problems):
    text = _as_str(key, value, problems)
    if text is None:
        return None
    try:
        version, _ = images.split_tag(text)
    except images.ImageError as err:
        problems.append(f"{key}: {err}; write it as vMAJOR.MINOR.PATCH, e.g. "
                        f"{CLUSTER_AUTOSCALER_IMAGE_TAGS[SUPPORTED_KUBERNETES_VERSIONS[-1]]}, optionally followed by "
                        "@sha256:<64 hex>")
        return None
    if not _CA_VERSION_TAG.match(version):
        problems.append(
            f"{key}: {text!r} is not a Cluster Autoscaler image tag; write it as vMAJOR.MINOR.PATCH, e.g. "
            f"{CLUSTER_AUTOSCALER_IMAGE_TAGS[SUPPORTED_KUBERNETES_VERSIONS[-1]]}, optionally followed by @sha256:<64 hex>")
        return None
    return text


def _zone(key, value, problems):
    text = _as_str(key, value, problems)
    if text is None:
        return None
    if _ZONE_NAME.match(text) or _ZONE_ID.match(text):
        return text
    problems.append(f"{key}: {text!r} is neither an availability zone name such as us-east-1a nor a zone ID such "
                    "as use1-az4 (`aws ec2 describe-availability-zones` lists both)")
    return None


def _bucket(key, value, problems):
    text = _as_str(key, value, problems)
    if text is None:
        return None
    if why := aws_rules.bucket_name_problem(text):
        problems.append(f"{key}: {text!r} is not a valid S3 bucket name: it {why}; or unset it to get a generated name")
        return None
    return text


def _retention_days(key, value, problems):
    days = _as_int(1, 3653)(key, value, problems)
    if days is not None and days not in aws_rules.LOG_RETENTION_DAYS:
        problems.append(f"{key}: {days} is not a retention CloudWatch Logs offers; use one of "
                        f"{', '.join(map(str, aws_rules.LOG_RETENTION_DAYS))}")
        return None
    return days


def _dollars(key, value, problems):
    try:
        number = float(str(value).strip())
    except ValueError:
        number = -1.0
    if not number > 0:
        problems.append(f"{key}: {value!r} is not a positive amount of US dollars, e.g. 1000")
        return None
    return number


def _image(key, value, problems):
    text = _as_str(key, value, problems)
    if text is None:
        return None
    if why := images.problem(text):
        problems.append(f"{key}: {why}")
        return None
    return text


KEYS: dict[str, _Key] = {k.name: k for k in (
    _Key("availabilityZone", None, _zone,
         "AZ of the GPU nodes, by name or zone ID; unset picks one that offers gpuNodeType"),
    _Key("kubernetesVersion", SUPPORTED_KUBERNETES_VERSIONS[-1], _one_of(SUPPORTED_KUBERNETES_VERSIONS), "EKS version"),
    _Key("clusterName", None, _matching(_CLUSTER_NAME, "a valid EKS cluster name (letters, digits, - and _, at most 100)"),
         "EKS cluster name; default <project>-<stack>"),
    _Key("systemNodeType", "m7i.xlarge", _cpu_type, "instance type of the CPU system nodes"),
    _Key("systemNodeCount", 1, _as_int(1, 10), "number of CPU system nodes"),
    _Key("gpuNodeType", "g6.12xlarge", _gpu_type, "EFA GPU instance type"),
    _Key("gpuNodeCount", 2, _as_int(1, 64), "number of GPU nodes"),
    _Key("capacityType", "ON_DEMAND", _one_of(CAPACITY_TYPES), "ON_DEMAND, SPOT or CAPACITY_BLOCK"),
    _Key("capacityReservationId", None, _matching(_RESERVATION, "a capacity reservation id like cr-0123456789abcdef0"),
         "target an On-Demand Capacity Reservation"),
    _Key("placementGroup", None, _as_bool, "cluster placement group for the GPU nodes; default true without a reservation"),
    _Key("apiAccessCidrs", None, _cidrs, "CIDRs allowed to reach the public EKS API endpoint (required)"),
    _Key("adminRoleArns", (), _role_arns, "extra IAM principals with cluster-admin access entries"),
    _Key("dlcImage", DEFAULT_DLC_IMAGE, _image, "Ray Train DLC image, by digest or by tag (resolved to a digest)"),
    _Key("rayVersion", "2.58.0", _version(MIN_RAY_VERSION), "Ray version of the image"),
    _Key("kuberayVersion", "1.7.0", _version(
        MIN_KUBERAY_VERSION, "the first KubeRay release whose RayCluster has authOptions (Ray token authentication); "
        "use 1.7.0"), "KubeRay operator chart version"),
    _Key("nvidiaDevicePluginVersion", "0.20.0", _version(), "NVIDIA k8s-device-plugin chart version"),
    _Key("efaDevicePluginVersion", "v0.5.32", _version(), "aws-efa-k8s-device-plugin chart version"),
    _Key("ncclDebug", "INFO", _one_of(NCCL_DEBUG_LEVELS), "NCCL_DEBUG on the GPU workers"),
    _Key("rayNamespace", "ray", _matching(re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"), "a Kubernetes namespace name"),
         "namespace of the RayCluster"),
    _Key("checkpointBucket", None, _bucket, "checkpoint bucket name; default generated"),
    _Key("noncurrentVersionExpirationDays", 3, _as_int(1, 365),
         "days a deleted or overwritten checkpoint object is kept as a noncurrent version"),
    _Key("controlPlaneLogRetentionDays", 30, _retention_days, "retention of the EKS control-plane log group"),
    _Key("costWarningPerDay", 1000.0, _dollars, "warn above this estimated cost per day (US dollars)"),
    _Key("retainCheckpointsOnDestroy", True, _as_bool, "protect the checkpoint bucket from pulumi destroy"),
    _Key("tags", MappingProxyType({}), _tags, "tags applied to every AWS resource that takes tags"),
    _Key("scaleToZero", False, _as_bool,
         "GPU workers and GPU nodes scale to zero when idle (KubeRay autoscaler + Cluster Autoscaler)"),
    _Key("gpuIdleTimeoutMinutes", 10, _as_int(1, 1440),
         "with scaleToZero: minutes a Ray GPU worker may sit idle before it is removed"),
    _Key("clusterAutoscalerVersion", DEFAULT_CLUSTER_AUTOSCALER_CHART, _version(
        MIN_CLUSTER_AUTOSCALER_CHART,
        "the first cluster-autoscaler chart whose ClusterRole lets Cluster Autoscaler >= 1.32 watch VolumeAttachments; "
        f"with an older chart the autoscaler runs but never scales (kubernetes/autoscaler#7663). Use "
        f"{DEFAULT_CLUSTER_AUTOSCALER_CHART}", example=DEFAULT_CLUSTER_AUTOSCALER_CHART),
         "with scaleToZero: cluster-autoscaler Helm chart version"),
    _Key("clusterAutoscalerImageTag", None, _ca_image_tag,
         "with scaleToZero: Cluster Autoscaler image tag (optionally @sha256:...); default follows kubernetesVersion"),
)}


def load(raw: Mapping[str, Any], *, stack: str, project: str = PROJECT) -> StackConfig:
    """Build a StackConfig from full config keys ("aws:region", "raytrain-eks:gpuNodeCount").

    Raises ConfigError listing every problem found.
    """
    problems: list[str] = []
    prefix = f"{project}:"
    ours = {k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)}
    for name in sorted(set(ours) - set(KEYS)):
        close = difflib.get_close_matches(name, KEYS, n=1, cutoff=0.6)
        hint = f"did you mean {prefix}{close[0]}?" if close else f"known keys: {', '.join(KEYS)}"
        problems.append(f"{prefix}{name}: unknown configuration key; {hint}")
    _check_namespaces(raw, project, problems)
    aws_settings = aws_provider.parse(raw, problems)

    values: dict[str, Any] = {}
    for name, key in KEYS.items():
        if name in ours and ours[name] is not None:
            values[name] = key.parse(f"{prefix}{name}", ours[name], problems)
        else:
            values[name] = key.default

    region = raw.get("aws:region")
    if not region:
        problems.append("aws:region: not set; run `pulumi config set aws:region us-east-1` (or the region you deploy to)")
    elif not _REGION.match(str(region)):
        problems.append(f"aws:region: {region!r} is not an AWS region name such as us-east-1")
    elif str(region) not in aws_rules.eks_regions():
        close = difflib.get_close_matches(str(region), sorted(aws_rules.eks_regions()), n=3, cutoff=0.7)
        problems.append(f"aws:region: {region!r} is not a region where AWS offers EKS (botocore's endpoint list)"
                        + (f"; did you mean {' or '.join(close)}?" if close else ""))
    if values["apiAccessCidrs"] is None and "apiAccessCidrs" not in ours:
        problems.append(
            f"{prefix}apiAccessCidrs: not set; the EKS API is never opened to 0.0.0.0/0 silently. Run "
            f"`pulumi config set --path '{prefix}apiAccessCidrs[0]' $(curl -s https://checkip.amazonaws.com)/32`")

    az = values["availabilityZone"]
    if az and region and _ZONE_NAME.match(az) and not str(az).startswith(str(region)):
        problems.append(f"{prefix}availabilityZone: {az!r} is not in region {region}; pick an AZ of {region} or unset it")
    reservation = values["capacityReservationId"]
    if reservation and values["capacityType"] == "SPOT":
        problems.append(f"{prefix}capacityReservationId: a capacity reservation holds On-Demand capacity; set capacityType to ON_DEMAND or remove the reservation")
    if values["capacityType"] == "CAPACITY_BLOCK" and not reservation and "capacityReservationId" not in ours:
        problems.append(f"{prefix}capacityType: CAPACITY_BLOCK needs the Capacity Block's reservation; set "
                        f"{prefix}capacityReservationId to its cr-... id (EC2 console, Capacity Reservations)")
    if reservation and values["placementGroup"] is True:
        problems.append(
            f"{prefix}placementGroup: true together with capacityReservationId causes InsufficientInstanceCapacity "
            "unless the reservation was made in that placement group; set placementGroup to false")
    if values["placementGroup"] is None:
        values["placementGroup"] = reservation is None
    _check_scale_to_zero(values, ours, prefix, problems)
    cluster_name = values["clusterName"] or f"{project}-{stack}"
    if values["clusterName"] is None and (why := aws_rules.cluster_name_problem(cluster_name)):
        suggestion = re.sub(r"[^A-Za-z0-9_-]", "-", cluster_name)[: aws_rules.CLUSTER_NAME_MAX]
        problems.append(f"{prefix}clusterName: not set, and the default {cluster_name!r} (<project>-<stack>, from "
                        f"stack {stack!r}) {why}; set it, e.g. `pulumi config set {prefix}clusterName {suggestion}`")
    _check_tag_count(values["tags"], aws_settings, prefix, problems)
    placeholders = _placeholders(values["apiAccessCidrs"], prefix)

    if problems:
        raise ConfigError(problems)

    return StackConfig(
        project=project,
        stack=stack,
        region=str(region),
        availability_zone=values["availabilityZone"],
        kubernetes_version=values["kubernetesVersion"],
        cluster_name=cluster_name,
        system_node_type=values["systemNodeType"],
        system_node_count=values["systemNodeCount"],
        gpu_node_type=values["gpuNodeType"],
        gpu_node_count=values["gpuNodeCount"],
        capacity_type=values["capacityType"],
        capacity_reservation_id=reservation,
        placement_group=values["placementGroup"],
        api_access_cidrs=values["apiAccessCidrs"],
        admin_role_arns=tuple(values["adminRoleArns"]),
        dlc_image=values["dlcImage"],
        ray_version=values["rayVersion"],
        kuberay_version=values["kuberayVersion"],
        nvidia_device_plugin_version=values["nvidiaDevicePluginVersion"],
        efa_device_plugin_version=values["efaDevicePluginVersion"],
        nccl_debug=values["ncclDebug"],
        ray_namespace=values["rayNamespace"],
        checkpoint_bucket=values["checkpointBucket"],
        retain_checkpoints_on_destroy=values["retainCheckpointsOnDestroy"],
        scale_to_zero=values["scaleToZero"],
        gpu_idle_timeout_minutes=values["gpuIdleTimeoutMinutes"],
        cluster_autoscaler_version=values["clusterAutoscalerVersion"],
        cluster_autoscaler_image_tag=(values["clusterAutoscalerImageTag"]
                                      or CLUSTER_AUTOSCALER_IMAGE_TAGS[values["kubernetesVersion"]]),
        tags=values["tags"],
        aws_settings=aws_settings,
        placeholders=placeholders,
        noncurrent_version_expiration_days=values["noncurrentVersionExpirationDays"],
        control_plane_log_retention_days=values["controlPlaneLogRetentionDays"],
        cost_warning_per_day=values["costWarningPerDay"],
    )


def _check_namespaces(raw: Mapping[str, Any], project: str, problems: list[str]) -> None:
    """A key in a namespace nobody reads would be ignored, and the defaults deployed instead."""
    known = (project, *KNOWN_NAMESPACES)
    for key in sorted(raw):
        namespace, colon, name = key.partition(":")
        if not colon:
            problems.append(f"{key}: has no namespace, so nothing reads it; write it as {project}:{key}")
        elif namespace not in known:
            close = difflib.get_close_matches(namespace, known, n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]}:{name}?" if close else
                    f"this program reads only {', '.join(n + ':' for n in known)} keys (its providers are explicit, "
                    "so other providers' settings never reach them); remove it")
            problems.append(f"{key}: namespace {namespace!r} is read by nothing here; {hint}")


def _check_tag_count(tags: Mapping[str, str] | None, aws_settings: Mapping[str, Any], prefix: str,
                     problems: list[str]) -> None:
    """AWS allows 50 tags per resource; the program adds up to PROJECT_TAGS_PER_RESOURCE of its own."""
    default_tags = dict((aws_settings.get("defaultTags") or {}).get("tags") or {})
    for tag, value in default_tags.items():
        problems.extend(f"aws:defaultTags: {why}" for why in aws_rules.tag_problems(str(tag), str(value)))
    user = set(tags or {}) | set(default_tags)
    room = aws_rules.MAX_TAGS - PROJECT_TAGS_PER_RESOURCE
    extra = user - {"project", "stack", "Name"}
    if len(extra) > room:
        problems.append(f"{prefix}tags: {len(extra)} tags (with aws:defaultTags) plus the up to "
                        f"{PROJECT_TAGS_PER_RESOURCE} the program adds exceed AWS's {aws_rules.MAX_TAGS} tags per "
                        f"resource; keep at most {room}")


def _placeholders(cidrs: tuple[str, ...] | None, prefix: str) -> tuple[str, ...]:
    """Values that plan offline but must be replaced before they reach AWS."""
    found = []
    for cidr in cidrs or ():
        if aws_rules.is_documentation_range(ipaddress.ip_network(cidr)):
            found.append(
                f"{prefix}apiAccessCidrs: {cidr} is a documentation range (RFC 5737), a placeholder EKS refuses; "
                f"replace it with your address: `pulumi config set --path '{prefix}apiAccessCidrs[0]' "
                "\"$(curl -s https://checkip.amazonaws.com)/32\"`")
    return tuple(found)


def _check_scale_to_zero(values: dict[str, Any], ours: Mapping[str, Any], prefix: str, problems: list[str]) -> None:
    """Settings that only mean something together, or that would defeat the point of scaling to zero."""
    if values["scaleToZero"] is None:
        return
    if not values["scaleToZero"]:
        for name in SCALE_TO_ZERO_KEYS:
            if ours.get(name) is not None:
                problems.append(f"{prefix}{name}: has no effect unless {prefix}scaleToZero is true; "
                                f"set scaleToZero to true or remove {name}")
        return
    if values["capacityReservationId"]:
        problems.append(
            f"{prefix}scaleToZero: a capacity reservation (capacityReservationId) bills its instances whether they "
            "run or not, so scaling the GPU nodes to zero saves nothing; remove the reservation or set scaleToZero "
            "to false")
    chart, kubernetes = values["clusterAutoscalerVersion"], values["kubernetesVersion"]
    floor = MIN_CLUSTER_AUTOSCALER_CHART_FOR.get(kubernetes or "")
    chart_match = _SEMVER.match(chart) if chart else None
    if floor and chart_match and tuple(int(g) for g in chart_match.groups()) < floor:
        problems.append(
            f"{prefix}clusterAutoscalerVersion: chart {chart} is older than {'.'.join(map(str, floor))}, the first "
            f"whose ClusterRole lets Cluster Autoscaler {kubernetes} watch resource.k8s.io (DRA) objects; with it the "
            f"autoscaler starts but never scales. Use {DEFAULT_CLUSTER_AUTOSCALER_CHART} (or at least "
            f"{'.'.join(map(str, floor))})")
    tag = values["clusterAutoscalerImageTag"]
    match = _CA_VERSION_TAG.match(tag.partition("@")[0]) if tag else None
    if match and kubernetes and f"{match.group(1)}.{match.group(2)}" != kubernetes:
        problems.append(
            f"{prefix}clusterAutoscalerImageTag: {tag} is Cluster Autoscaler {match.group(1)}.{match.group(2)}, "
            f"but kubernetesVersion is {kubernetes}; the autoscaler's minor version must match the cluster's, e.g. "
            f"{CLUSTER_AUTOSCALER_IMAGE_TAGS[kubernetes]}")


def from_pulumi() -> StackConfig:
    """Read the running stack's configuration from the Pulumi engine."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    raw = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    normalized = {key.replace(":config:", ":", 1): value for key, value in raw.items()}
    return load(normalized, stack=pulumi.get_stack(), project=pulumi.get_project())
