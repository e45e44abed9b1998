"""The stack configuration: every key declared once, read once, validated whole, then frozen.

Every setting of a stack (Pulumi.<stack>.yaml, or `pulumi config set`) is declared here once,
with its default, its check and its help; the parser, the offline stack-file reader, the
did-you-mean hints and the configuration tables of docs/configuration.md (`python -m deploy.config`) all derive
from these declarations. Problems are collected and reported together, each naming the key, the
bad value, why it is wrong and how to fix it, so a user fixes a stack file in one pass instead of
one `pulumi up` per mistake.

Node pools are data (`nodePools`, in the manner of terraform-aws-eks's managed node groups);
gpuNodeType, gpuNodeCount, systemNodeType and systemNodeCount (with capacityType,
capacityReservationId, placementGroup and scaleToZero) are shorthand for the two default pools,
`system` and `gpu`, so a stack written before node pools plans exactly as it did.

Values arrive either as strings (the Pulumi engine passes every value, and structured values as
JSON) or as YAML-native types (Pulumi.<stack>.yaml read by the offline plan); both are accepted.
"""
from __future__ import annotations

import difflib
import ipaddress
import json
import re
import sys
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Callable, Mapping

from facts import autoscaler as autoscaler_facts
from facts import catalog, images
from facts import nodes as node_facts
from facts import ray as ray_facts
from facts.errors import Problems, ProblemsError
from facts.reading import clip_text, odd_characters
from infra import aws_provider, aws_rules
from infra import node_pools as pools
from infra.node_pools import NodePool

PROJECT = "raytrain-eks"

SUPPORTED_KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36")
DEFAULT_DLC_IMAGE = images.EXAMPLE
MIN_RAY_VERSION = (2, 52, 0)
MIN_KUBERAY_VERSION = (1, 5, 1)  # RayCluster spec.authOptions; older CRDs drop the field and leave Ray unauthenticated
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
MONITORING = ("none", "cloudwatch")  # the `monitoring` key; prometheus (kube-prometheus-stack, DCGM exporter) is not built yet
# Cluster Autoscaler image per Kubernetes minor: CA is built and tested against one minor, and
# the chart's default image lags (chart 9.59.0, the newest confirmed, still ships v1.35.0).
# Newest patch releases as of 2026-07-23 (github.com/kubernetes/autoscaler/releases).
CLUSTER_AUTOSCALER_IMAGE_TAGS = {"1.34": "v1.34.5", "1.35": "v1.35.2", "1.36": "v1.36.1"}
DEFAULT_CLUSTER_AUTOSCALER_CHART = "9.59.0"
MIN_CLUSTER_AUTOSCALER_CHART = (9, 47, 0)
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
MAX_POOL_NODES = 64

_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
_ZONE_NAME = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$")
_ZONE_ID = re.compile(r"^[a-z]{2,5}\d-az\d+$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")
_RESERVATION = re.compile(r"^cr-[0-9a-f]{17}$")
_SEMVER = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")
_CA_VERSION_TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class ConfigError(ProblemsError):
    """All configuration problems of a stack, one per line."""

    title = "invalid stack configuration"


@dataclass(frozen=True)
class Setting:
    """One stack key (or one key of a node pool): its default, its check, and its docs/configuration.md row.

    `parse(key, value, problems)` returns the checked value, or None after adding a problem;
    `shown_default` is the table's default column where the default is not a plain value.
    """

    name: str
    default: Any
    parse: Callable[[str, Any, Problems], Any]
    help: str
    shown_default: str | None = None

    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        value = self.default
        if value is None:
            return "unset"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, (tuple, list)):
            return f"`{json.dumps(list(value))}`"
        if isinstance(value, Mapping):
            return f"`{json.dumps(dict(value))}`"
        return f"`{value}`"


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


def _text(problem: Callable[[str], str | None]):
    """One string value, refused as `key: <why>` when `problem(text)` says why."""
    def parse(key, value, problems):
        text = _as_str(key, value, problems)
        if text is None:
            return None
        if why := problem(text):
            problems.append(f"{key}: {why}")
            return None
        return text
    return parse


def _one_of(choices: tuple[str, ...]):
    return _text(lambda text: None if text in choices else f"{text!r} is not supported; use one of {', '.join(choices)}")


def _matching(pattern: re.Pattern, what: str):
    return _text(lambda text: None if pattern.match(text) else f"{text!r} is not {what}")


def _gpu_type_problem(text: str) -> str | None:
    if text in catalog.GPU_TYPES:
        return None
    why = "has no EFA network interface" if text in catalog.NON_EFA_GPU_TYPES else "is not in the instance catalog"
    return f"{text!r} {why}; use one of the supported EFA GPU types: {', '.join(catalog.GPU_TYPES)}"


_gpu_type = _text(_gpu_type_problem)


_cpu_type = _text(lambda text: None if text in catalog.CPU_TYPES else (
    f"{text!r} is not in the instance catalog; use one of {', '.join(catalog.CPU_TYPES)}"))


def _cidrs(key, value, problems):
    items = _structured(key, value, list, problems, '["203.0.113.10/32"]')
    if items is None:
        return None
    if not items:
        problems.append(f"{key}: the list is empty; give the CIDRs allowed to reach the EKS API, e.g. your address as x.x.x.x/32")
        return None
    if len(items) > aws_rules.PUBLIC_ACCESS_CIDRS_MAX:
        problems.append(f"{key}: {len(items)} CIDRs; the EKS public endpoint takes at most "
                        f"{aws_rules.PUBLIC_ACCESS_CIDRS_MAX}: merge neighbouring ranges or reach the API through a "
                        "bastion or VPN")
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


_zone = _text(lambda text: None if _ZONE_NAME.match(text) or _ZONE_ID.match(text) else (
    f"{text!r} is neither an availability zone name such as us-east-1a nor a zone ID such as use1-az4 "
    "(`aws ec2 describe-availability-zones` lists both)"))


def _bucket_problem(text: str) -> str | None:
    why = aws_rules.bucket_name_problem(text)
    return f"{text!r} is not a valid S3 bucket name: it {why}; or unset it to get a generated name" if why else None


_bucket = _text(_bucket_problem)


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


_image = _text(images.problem)


def _instance_type_problem(text: str) -> str | None:
    """Any type of the instance catalog, GPU or CPU; the catalog is where a new type is added."""
    if catalog.instance_type(text):
        return None
    why = "has no EFA network interface" if text in catalog.NON_EFA_GPU_TYPES else "is not in the instance catalog"
    return (f"{text!r} {why}; use one of {', '.join([*catalog.GPU_TYPES, *catalog.CPU_TYPES])}, or add the type's row "
            "to facts/catalog.py")


_instance_type = _text(_instance_type_problem)


def _labels(key, value, problems):
    mapping = _structured(key, value, dict, problems, '{"role": "data-worker"}')
    if mapping is None:
        return None
    for label, label_value in mapping.items():
        if isinstance(label_value, (dict, list)) or label_value is None:
            problems.append(f"{key}: the value of label {label!r} must be a string, got {label_value!r}")
        elif why := node_facts.label_problem(str(label), str(label_value).lower() if isinstance(label_value, bool)
                                             else str(label_value)):
            problems.append(f"{key}: {why}")
        else:
            problems.extend(f"{key}: {why}" for why in aws_rules.node_group_label_problems(
                "label", str(label), str(label_value).lower() if isinstance(label_value, bool) else str(label_value)))
    return MappingProxyType({str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in mapping.items()})


def _taints(key, value, problems):
    items = _structured(key, value, list, problems, '[{"key": "dedicated", "value": "data", "effect": "NoSchedule"}]')
    if items is None:
        return None
    taints = []
    for item in items:
        if isinstance(item, str):  # key=value:Effect, as kubectl taint writes it
            match = re.fullmatch(r"([^=:\s]+)=([^:\s]*):(\w+)", item.strip())
            item = dict(zip(("key", "value", "effect"), match.groups(), strict=True)) if match else item
        if not isinstance(item, dict) or not item.get("key") or set(item) - {"key", "value", "effect"}:
            problems.append(f"{key}: {item!r} is not a taint; write {{key: K, value: V, effect: NoSchedule}} or "
                            "\"K=V:NoSchedule\"")
            continue
        try:
            taints.append(node_facts.Taint(str(item["key"]), str(item.get("value", "")),
                                           str(item.get("effect", "NoSchedule"))))
        except ValueError as err:
            problems.append(f"{key}: {err}")
            continue
        if why := node_facts.label_problem(taints[-1].key, taints[-1].value):
            problems.append(f"{key}: {why.replace('label', 'taint')}")
        else:
            problems.extend(f"{key}: {why}" for why in aws_rules.node_group_label_problems(
                "taint", taints[-1].key, taints[-1].value))
    if len(taints) > aws_rules.MAX_TAINTS:
        problems.append(f"{key}: {len(taints)} taints; an EKS node group takes at most {aws_rules.MAX_TAINTS}")
    return tuple(taints)


def _worker_group(key, value, problems):
    """A Ray worker group's name, true for `<pool>-workers`, or false for none."""
    if isinstance(value, bool) or str(value).strip().lower() in ("true", "false"):
        return _as_bool(key, value, problems)
    text = _as_str(key, value, problems)
    if text is not None and not _DNS_LABEL.match(text):
        problems.append(f"{key}: {text!r} is not a Ray worker group name (lowercase letters, digits and '-', at most "
                        "63); or write true (the default name) or false (no Ray workers on this pool)")
        return None
    return text


def _pool_entries(key, value, problems):
    """The nodePools map as {pool name: {setting: raw value}}; each entry's settings are checked with its pool."""
    mapping = _structured(key, value, dict, problems, '{"gpu": {"instanceType": "g6.12xlarge", "desiredSize": 2}}')
    if mapping is None:
        return None
    entries = {}
    for name, entry in mapping.items():
        where = f"{key}.{name}"
        if not isinstance(name, str) or not pools.NAME.match(name):
            problems.append(f"{where}: {name!r} is not a node pool name; use lowercase letters, digits and '-', "
                            "starting with a letter, at most 20 characters")
            continue
        if not isinstance(entry, dict):
            problems.append(f"{where}: {entry!r} is not a mapping of node pool settings; write e.g. "
                            "{instanceType: g6.12xlarge, desiredSize: 2}")
            continue
        for unknown in sorted(set(entry) - set(POOL_KEYS)):
            close = difflib.get_close_matches(str(unknown), POOL_KEYS, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"a node pool takes: {', '.join(POOL_KEYS)}"
            problems.append(f"{where}.{unknown}: unknown node pool setting; {hint}")
        entries[name] = {k: v for k, v in entry.items() if k in POOL_KEYS}
    if not entries and not problems:
        problems.append(f"{key}: the map is empty; declare at least the `system` pool")
    return entries


# --- the declarations ------------------------------------------------------------------------------

# Metadata of a StackConfig field: the stack key it is (STACK_KEY), or the keys node_pools is built from (POOL_SOURCES).
STACK_KEY = "stack key"
POOL_SOURCES = "node pool keys"


def stack_key(name: str, default: Any, parse: Callable[[str, Any, Problems], Any], help: str,
              shown_default: str | None = None) -> Any:
    """A StackConfig field that is the stack key `name`: its default, check and docs row, declared once."""
    declared = {STACK_KEY: Setting(name, default, parse, help, shown_default)}
    if type(default).__hash__ is None:  # dataclasses refuse an unhashable default (MappingProxyType) as such
        return field(default_factory=lambda: default, metadata=declared)
    return field(default=default, metadata=declared)


def pool_keys(*settings: Setting) -> Any:
    """The node_pools field, declaring the keys it is built from: nodePools, or the shorthand of the default pools."""
    return field(default=(), metadata={POOL_SOURCES: settings})


@dataclass(frozen=True)
class StackConfig:
    """The validated stack. Each field from api_access_cidrs to tags IS a stack key's declaration (`stack_key`),
    so KEYS, the parser and docs/configuration.md's table derive from these fields; node_pools declares the keys it is
    built from. A field's default is its key's: None where the key is required (apiAccessCidrs) or `load`
    derives the value (clusterName, clusterAutoscalerImageTag)."""

    project: str
    stack: str
    region: str  # aws:region, the AWS provider's key (REGION_ROW)
    api_access_cidrs: tuple[str, ...] = stack_key(
        "apiAccessCidrs", None, _cidrs,
        "CIDRs allowed to reach the public EKS API endpoint; `0.0.0.0/0` is refused (private endpoint access is "
        "always on)", "required")
    availability_zone: str | None = stack_key(
        "availabilityZone", None, _zone,
        "AZ of the EFA node pools that name none of their own (EFA does not cross AZs), by name (`us-east-1a`) or "
        "zone ID (`use1-az4`); checked against the EC2 instance-type offerings by zone ID. A zone EKS refuses for "
        "control-plane subnets may hold nodes; the control plane then uses two other zones",
        "the reservation's zone, else the first zone offering the first EFA pool's type that EKS accepts for its "
        "control plane")
    kubernetes_version: str = stack_key(
        "kubernetesVersion", SUPPORTED_KUBERNETES_VERSIONS[-1], _one_of(SUPPORTED_KUBERNETES_VERSIONS),
        f"EKS version: one of {', '.join(SUPPORTED_KUBERNETES_VERSIONS)} (standard support; upgrade policy "
        "STANDARD)")
    cluster_name: str = stack_key(
        "clusterName", None, _matching(_CLUSTER_NAME, "a valid EKS cluster name (letters, digits, - and _, at "
                                                      "most 100)"),
        "EKS cluster name (letters, digits, `-`, `_`, at most 100); a stack name that gives an invalid default "
        "(`team.ml`) must set it", "`raytrain-eks-<stack>`")
    node_pools: tuple[NodePool, ...] = pool_keys(
        Setting("nodePools", None, _pool_entries,
                "the node groups, a map of pool name to its settings (see [Node pools](#node-pools)); replaces the "
                "shorthand keys below, which describe the two default pools `system` and `gpu`",
                "the `system` and `gpu` pools of the shorthand keys"),
        Setting("systemNodeType", "m7i.xlarge", _cpu_type,
                "shorthand: CPU nodes of the `system` pool, for the Ray head, the KubeRay operator and add-ons"),
        Setting("systemNodeCount", 1, _as_int(1, 10), "shorthand: `system` pool nodes, 1 to 10"),
        Setting("gpuNodeType", "g6.12xlarge", _gpu_type,
                f"shorthand: EFA GPU type of the `gpu` pool: {', '.join(catalog.GPU_TYPES)}"),
        Setting("gpuNodeCount", 2, _as_int(1, MAX_POOL_NODES), f"shorthand: `gpu` pool nodes, 1 to {MAX_POOL_NODES}"),
        Setting("capacityType", "ON_DEMAND", _one_of(pools.CAPACITY_TYPES),
                "shorthand: the `gpu` pool's `ON_DEMAND`, `SPOT` or `CAPACITY_BLOCK` (Capacity Blocks for ML: the node "
                "group's capacity type and the launch template's `capacity-block` market type and instance type, as EKS "
                "requires)"),
        Setting("capacityReservationId", None, _matching(_RESERVATION, "a capacity reservation id like "
                                                                       "cr-0123456789abcdef0"),
                "shorthand: an On-Demand Capacity Reservation or, with `CAPACITY_BLOCK`, the Capacity Block (`cr-...`) "
                "of the `gpu` pool; not with SPOT. Looked up at preview: it sets the GPU zone and must hold "
                "`gpuNodeType`, at least `gpuNodeCount` instances, Linux, and be active"),
        Setting("placementGroup", None, _as_bool,
                "shorthand: cluster placement group for the `gpu` pool; not combined with a reservation",
                "`true` (`false` with a reservation)"),
        Setting("scaleToZero", False, _as_bool,
                "shorthand: the `gpu` pool's Ray workers and nodes scale to zero when idle (KubeRay autoscaler + "
                "Kubernetes Cluster Autoscaler); `gpuNodeCount` becomes the maximum. Not with `capacityReservationId` "
                "(a reservation bills whether instances run or not)"))
    admin_role_arns: tuple[str, ...] = stack_key(
        "adminRoleArns", (), _role_arns,
        "extra IAM principals given cluster-admin access entries; repeats are kept once, and the deployer (who "
        "always has one as cluster creator) is refused at preview")
    dlc_image: str = stack_key(
        "dlcImage", DEFAULT_DLC_IMAGE, _image,
        "the Ray Train DLC image, `registry/repo@sha256:<64 hex>` or `registry/repo:tag` (the registry host is "
        "never implied); a tag is resolved once and the digest kept in the stack state (see Image pinning)")
    ray_version: str = stack_key(
        "rayVersion", "2.58.0", _version(MIN_RAY_VERSION),
        "Ray version of the image, at least 2.52 (token authentication)")
    kuberay_version: str = stack_key(
        "kuberayVersion", "1.7.0", _version(
            MIN_KUBERAY_VERSION, "the first KubeRay release whose RayCluster has authOptions (Ray token "
            "authentication); use 1.7.0"),
        "KubeRay operator chart version, at least 1.5.1 (the first whose RayCluster has `authOptions`, "
        "Ray token authentication)")
    nvidia_device_plugin_version: str = stack_key(
        "nvidiaDevicePluginVersion", "0.20.0", _version(), "NVIDIA k8s-device-plugin chart version")
    efa_device_plugin_version: str = stack_key(
        "efaDevicePluginVersion", "v0.5.32", _version(), "aws-efa-k8s-device-plugin chart version")
    nccl_debug: str = stack_key(
        "ncclDebug", "INFO", _one_of(NCCL_DEBUG_LEVELS),
        "NCCL_DEBUG on the GPU workers for NCCL processes started by other means: VERSION, WARN, INFO or TRACE. "
        "GPU jobs of `trainer submit` always run INFO into per-rank files (the EFA proof reads them); lowering "
        "it there needs `--no-require-efa`")
    monitoring: str = stack_key(
        "monitoring", "none", _one_of(MONITORING),
        "`none` or `cloudwatch`: the amazon-cloudwatch-observability EKS add-on (Container Insights with NVIDIA GPU "
        "and EFA metrics; its IAM role through IRSA; CloudWatch bills per metric and GB, see docs/operations.md)")
    ray_namespace: str = stack_key(
        "rayNamespace", ray_facts.DEFAULT_NAMESPACE, _matching(_DNS_LABEL, "a Kubernetes namespace name"),
        "namespace of the RayCluster")
    checkpoint_bucket: str | None = stack_key(
        "checkpointBucket", None, _bucket, "checkpoint bucket name, checked against S3's naming rules",
        "generated (`<cluster name, S3-safe>-ckpt-<26 characters>`)")
    noncurrent_version_expiration_days: int = stack_key(
        "noncurrentVersionExpirationDays", 3, _as_int(1, 365),
        "days a deleted or overwritten checkpoint object is kept as a noncurrent version before S3 expires it, "
        "1 to 365")
    control_plane_log_retention_days: int = stack_key(
        "controlPlaneLogRetentionDays", 30, _retention_days,
        "retention of the control-plane log group, one of CloudWatch's values (1, 3, 5, 7, 14, 30, 60, 90, ...)")
    cost_warning_per_day: float = stack_key(
        "costWarningPerDay", 1000.0, _dollars,
        "the plan and `pulumi preview` warn above this estimated cost per day (US dollars), naming the EC2 vCPU "
        "quota needed")
    gpu_idle_timeout_minutes: int = stack_key(
        "gpuIdleTimeoutMinutes", 10, _as_int(1, 1440),
        "with a pool that scales to zero: minutes a Ray worker may sit idle before it is removed, 1 to 1440")
    cluster_autoscaler_version: str = stack_key(
        "clusterAutoscalerVersion", DEFAULT_CLUSTER_AUTOSCALER_CHART, _version(
            MIN_CLUSTER_AUTOSCALER_CHART,
            "the first cluster-autoscaler chart whose ClusterRole lets Cluster Autoscaler >= 1.32 watch "
            "VolumeAttachments; with an older chart the autoscaler runs but never scales (kubernetes/autoscaler#7663). "
            f"Use {DEFAULT_CLUSTER_AUTOSCALER_CHART}", example=DEFAULT_CLUSTER_AUTOSCALER_CHART),
        "with a pool that scales to zero: cluster-autoscaler chart version (kubernetes.github.io/autoscaler), at "
        "least 9.47.0 with Kubernetes 1.34 and 9.54.0 with 1.35 and 1.36 (older charts grant no "
        "`resource.k8s.io` RBAC: the autoscaler starts but never scales)")
    cluster_autoscaler_image_tag: str = stack_key(
        "clusterAutoscalerImageTag", None, _ca_image_tag,
        "with a pool that scales to zero: Cluster Autoscaler image tag, `vX.Y.Z` or `vX.Y.Z@sha256:<64 hex>`; its "
        "minor must equal `kubernetesVersion`",
        f"follows `kubernetesVersion` (`{CLUSTER_AUTOSCALER_IMAGE_TAGS[SUPPORTED_KUBERNETES_VERSIONS[-1]]}` for "
        f"{SUPPORTED_KUBERNETES_VERSIONS[-1]})")
    retain_checkpoints_on_destroy: bool = stack_key(
        "retainCheckpointsOnDestroy", True, _as_bool,
        "protect the bucket from `pulumi destroy` (and keep it if the stack is deleted)")
    tags: Mapping[str, str] = stack_key(
        "tags", MappingProxyType({}), _tags,
        "tags on every AWS resource that takes tags (plus `project` and `stack`); at most 45 with "
        "`aws:defaultTags` (AWS allows 50 and the program adds up to 5), letters, digits, spaces and "
        "`+ - = . _ : / @` only (S3 and IAM)")
    aws_settings: Mapping[str, Any] = field(default_factory=dict)  # the aws: keys, for the explicit provider
    placeholders: tuple[str, ...] = ()  # values that plan offline but that AWS refuses (see _placeholders)

    ray_cluster_name = ray_facts.CLUSTER_NAME
    ray_service_account = ray_facts.SERVICE_ACCOUNT

    @property
    def ray_head_service(self) -> str:
        return ray_facts.head_service(self.ray_cluster_name)

    @property
    def resource_tags(self) -> dict[str, str]:
        """Tags for every AWS resource: the user's plus the project and stack."""
        return {"project": self.project, "stack": self.stack, **self.tags}

    def pool(self, name: str) -> NodePool:
        return next(p for p in self.node_pools if p.name == name)

    @property
    def system_pool(self) -> NodePool:
        return self.pool(pools.SYSTEM_POOL)

    @property
    def gpu_pools(self) -> tuple[NodePool, ...]:
        return pools.gpu_pools(self.node_pools)

    @property
    def scale_to_zero(self) -> bool:
        """A node pool scales to zero, so the Cluster Autoscaler runs."""
        return any(p.scale_to_zero for p in self.node_pools)


def declared_keys(cls: type = StackConfig) -> dict[str, Setting]:
    """Every stack key the fields of `cls` declare, in field order (the order of docs/configuration.md's table)."""
    found: dict[str, Setting] = {}
    for f in fields(cls):
        for setting in ((f.metadata[STACK_KEY],) if STACK_KEY in f.metadata else f.metadata.get(POOL_SOURCES, ())):
            found[setting.name] = setting
    return found


def key_fields(cls: type = StackConfig) -> dict[str, str]:
    """Stack key -> the field of `cls` it sets (the keys node_pools is built from set none directly)."""
    return {f.metadata[STACK_KEY].name: f.name for f in fields(cls) if STACK_KEY in f.metadata}


KEYS: dict[str, Setting] = declared_keys()
# What the nodePools map replaces: the shorthand of the two default pools, the other keys node_pools is built from.
SHORTHAND_KEYS = tuple(s.name for f in fields(StackConfig) for s in f.metadata.get(POOL_SOURCES, ())
                       if s.name != "nodePools")

# Not ours, but required: the AWS provider's region, checked here against botocore's endpoint list.
REGION_ROW = ("aws:region", "required", "region to deploy to; must be one where AWS offers EKS")

POOL_KEYS: dict[str, Setting] = {s.name: s for s in (
    Setting("instanceType", None, _instance_type,
            "an instance type of the catalog (`facts/catalog.py`): a GPU type or a CPU type", "required"),
    Setting("desiredSize", None, _as_int(0, MAX_POOL_NODES),
            f"nodes of a fixed-size pool, 1 to {MAX_POOL_NODES} (minSize and maxSize, if given, must equal it)", "`1`"),
    Setting("minSize", None, _as_int(0, MAX_POOL_NODES), "with `scaleToZero`: 0 (the only value it takes)", "unset"),
    Setting("maxSize", None, _as_int(1, MAX_POOL_NODES),
            "with `scaleToZero`: the most nodes the Cluster Autoscaler starts (required there)", "`desiredSize`"),
    Setting("labels", None, _labels,
            "Kubernetes labels of the nodes, which the pool's Ray workers select",
            "`role: <pool>-worker` with Ray workers, else `role: <pool>`; GPU types add `nvidia.com/gpu.present: "
            "\"true\"`"),
    Setting("taints", None, _taints,
            "taints of the nodes, `{key, value, effect}` or `key=value:Effect`; the pool's Ray workers (and, on GPU "
            "pools, the device plugins) tolerate them", "`nvidia.com/gpu=true:NoSchedule` on GPU types, else none"),
    Setting("capacityType", "ON_DEMAND", _one_of(pools.CAPACITY_TYPES), "`ON_DEMAND`, `SPOT` or `CAPACITY_BLOCK`"),
    Setting("capacityReservationId", None,
            _matching(_RESERVATION, "a capacity reservation id like cr-0123456789abcdef0"),
            "an On-Demand Capacity Reservation, or with `CAPACITY_BLOCK` the Capacity Block; sets the pool's zone"),
    Setting("enableEfaSupport", None, _as_bool,
            "one EFA interface per network card, in the pool's one zone, with the zone's EFA security group",
            "`true` on types with EFA"),
    Setting("placementGroup", None, _as_bool, "a cluster placement group for the pool's nodes",
            "`true` with EFA and no reservation"),
    Setting("scaleToZero", False, _as_bool,
            "0 to `maxSize` nodes, started by the Cluster Autoscaler when Ray asks for them; the pool's Ray workers "
            "scale with KubeRay's autoscaler"),
    Setting("rayWorkerGroup", None, _worker_group,
            "the Ray worker group on these nodes (one worker per node, claiming it whole): a name, `true` or `false`",
            "`<pool>-workers` on GPU types, none on CPU types"),
    Setting("diskSize", None, _as_int(20, 16384), "root volume, GiB (gp3, encrypted)", "`200` on GPU types, else `50`"),
    Setting("availabilityZone", None, _zone,
            "pin the pool to one zone (name or zone ID); an EFA pool otherwise goes to the stack's GPU zone, a pool "
            "without EFA across every private subnet", "unset"),
)}


# --- reading a stack -------------------------------------------------------------------------------

def load(raw: Mapping[str, Any], *, stack: str, project: str = PROJECT, cls: type = StackConfig) -> StackConfig:
    """Build a StackConfig from full config keys ("aws:region", "raytrain-eks:gpuNodeCount").

    The keys read are those the fields of `cls` declare (a subclass with one more `stack_key` field reads
    one more key). Raises ConfigError listing every problem found.
    """
    keys = declared_keys(cls)
    problems = Problems()
    prefix = f"{project}:"
    ours = {k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)}
    _check_unknown_keys(ours, keys, prefix, problems)
    _check_namespaces(raw, project, problems)
    aws_settings = aws_provider.parse(raw, problems)
    values = {name: setting.parse(f"{prefix}{name}", ours[name], problems)
              if name in ours and ours[name] is not None else setting.default for name, setting in keys.items()}
    region = raw.get("aws:region")
    _check_region(region, problems)
    if values["apiAccessCidrs"] is None and "apiAccessCidrs" not in ours:
        problems.append(
            f"{prefix}apiAccessCidrs: not set; the EKS API is never opened to 0.0.0.0/0 silently. Run "
            f"`pulumi config set --path '{prefix}apiAccessCidrs[0]' $(curl -s https://checkip.amazonaws.com)/32`")
    node_pools = _node_pools(values, ours, prefix, problems)
    _check_zones(values["availabilityZone"], node_pools, region, prefix, problems)
    _check_scale_to_zero(values, ours, any(p.scale_to_zero for p in node_pools), prefix, problems)
    cluster_name = _cluster_name(values["clusterName"], project, stack, prefix, problems)
    _check_tag_count(values["tags"], aws_settings, prefix, problems)
    _check_own_names(values, cluster_name, prefix, problems)
    placeholders = _placeholders(values["apiAccessCidrs"], prefix)

    problems.raise_if_any(ConfigError)
    values.update(clusterName=cluster_name, clusterAutoscalerImageTag=(
        values["clusterAutoscalerImageTag"] or CLUSTER_AUTOSCALER_IMAGE_TAGS[values["kubernetesVersion"]]))
    return cls(project=project, stack=stack, region=str(region), node_pools=tuple(node_pools),
               aws_settings=aws_settings, placeholders=placeholders,
               **{name: values[key] for key, name in key_fields(cls).items()})


# Namespaces every EKS cluster already has, and the one the program makes for the KubeRay operator:
# creating the Ray namespace there fails with "already exists" after the cluster is up.
EXISTING_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
OPERATOR_NAMESPACE = "kuberay-system"  # workloads.charts.OPERATOR_NAMESPACE (tests/workloads checks they agree)


def own_tag_keys(cluster_name: str | None) -> tuple[str, ...]:
    """The tag keys the program itself sets beside the user's: resource_tags, the network's, the autoscaler's."""
    cluster = cluster_name or ""
    return ("project", "stack", "Name", "availability-zone", "kubernetes.io/role/elb", "kubernetes.io/role/internal-elb",
            f"kubernetes.io/cluster/{cluster}", *autoscaler_facts.discovery_tags(cluster))


def _check_own_names(values: dict, cluster_name: str | None, prefix: str, problems: Problems) -> None:
    """User tags and the Ray namespace may not collide with what the program or EKS already names."""
    problems.extend(f"{prefix}tags: {why}"
                    for why in aws_rules.tag_collisions(dict(values["tags"] or {}), own_tag_keys(cluster_name)))
    namespace = values["rayNamespace"]
    if namespace in (*EXISTING_NAMESPACES, OPERATOR_NAMESPACE):
        whose = "the KubeRay operator's (the program creates it)" if namespace == OPERATOR_NAMESPACE else (
            "one every EKS cluster already has")
        problems.append(f"{prefix}rayNamespace: {namespace!r} is {whose}, so creating it fails after the cluster "
                        f"exists; use a namespace of its own (default {ray_facts.DEFAULT_NAMESPACE!r})")


def _check_unknown_keys(ours: Mapping[str, Any], keys: Mapping[str, Any], prefix: str, problems: Problems) -> None:
    for name in sorted(set(ours) - set(keys)):
        close = difflib.get_close_matches(name, keys, n=1, cutoff=0.6)
        hint = f"did you mean {prefix}{close[0]}?" if close else f"known keys: {', '.join(keys)}"
        odd = odd_characters(name)
        problems.append(f"{prefix}{clip_text(name)}: unknown configuration key; {hint}" + (f" ({odd})" if odd else ""))


def _check_region(region: Any, problems: Problems) -> None:
    """aws:region is set, and is a region where EKS is offered (botocore's endpoint list)."""
    if not region:
        problems.append("aws:region: not set; run `pulumi config set aws:region us-east-1` (or the region you deploy to)")
    elif not _REGION.match(str(region)):
        problems.append(f"aws:region: {region!r} is not an AWS region name such as us-east-1")
    elif str(region) not in aws_rules.eks_regions():
        close = difflib.get_close_matches(str(region), sorted(aws_rules.eks_regions()), n=3, cutoff=0.7)
        problems.append(f"aws:region: {region!r} is not a region where AWS offers EKS (botocore's endpoint list)"
                        + (f"; did you mean {' or '.join(close)}?" if close else ""))


def _check_zones(stack_zone: str | None, node_pools: list[NodePool], region: Any, prefix: str,
                 problems: Problems) -> None:
    """Every zone named, the stack's and each pool's, is in the stack's region."""
    for key, zone in [(f"{prefix}availabilityZone", stack_zone),
                      *((p.key("availabilityZone"), p.availability_zone) for p in node_pools)]:
        if zone and region and _ZONE_NAME.match(zone) and not str(zone).startswith(str(region)):
            problems.append(f"{key}: {zone!r} is not in region {region}; pick an AZ of {region} or unset it")


def _cluster_name(given: str | None, project: str, stack: str, prefix: str, problems: Problems) -> str:
    """clusterName, else <project>-<stack> when EKS takes that name."""
    cluster_name = given or f"{project}-{stack}"
    if given is None and (why := aws_rules.cluster_name_problem(cluster_name)):
        suggestion = re.sub(r"[^A-Za-z0-9_-]", "-", cluster_name)[: aws_rules.CLUSTER_NAME_MAX]
        problems.append(f"{prefix}clusterName: not set, and the default {cluster_name!r} (<project>-<stack>, from "
                        f"stack {stack!r}) {why}; set it, e.g. `pulumi config set {prefix}clusterName {suggestion}`")
    return cluster_name


# --- node pools -------------------------------------------------------------------------------------

def _node_pools(values: dict[str, Any], ours: Mapping[str, Any], prefix: str, problems: Problems) -> list[NodePool]:
    """The pools of nodePools, else of the shorthand keys (never both), checked together."""
    if "nodePools" in ours:
        for name in SHORTHAND_KEYS:
            if ours.get(name) is not None:
                problems.append(f"{prefix}{name}: the shorthand of the default pools, but {prefix}nodePools is set; "
                                "give the setting to the pool in nodePools instead (see docs/configuration.md, Node pools)")
        node_pools = _declared_pools(values["nodePools"] or {}, prefix, problems)
    else:
        node_pools = _shorthand_pools(values, ours, prefix, problems)
    _check_pools(node_pools, "nodePools" in ours, prefix, problems)
    return node_pools


def _shorthand_pools(values: dict[str, Any], ours: Mapping[str, Any], prefix: str,
                     problems: Problems) -> list[NodePool]:
    """The two pools the shorthand keys describe, with the keys named in every message about them."""
    key = {name: f"{prefix}{name}" for name in (*SHORTHAND_KEYS, "availabilityZone")}
    system = _build_pool(pools.SYSTEM_POOL, {"instanceType": values["systemNodeType"],
                                             "desiredSize": values["systemNodeCount"]},
                         {"instanceType": key["systemNodeType"], "desiredSize": key["systemNodeCount"],
                          "minSize": key["systemNodeCount"], "maxSize": key["systemNodeCount"]}, prefix, problems)
    scaled = bool(values["scaleToZero"])
    given = {"instanceType": values["gpuNodeType"], "capacityType": values["capacityType"], "scaleToZero": scaled,
             "maxSize" if scaled else "desiredSize": values["gpuNodeCount"]}
    for name in ("capacityReservationId", "placementGroup"):
        if name in ours:
            given[name] = values[name]
    gpu = _build_pool("gpu", given, {
        "instanceType": key["gpuNodeType"], "desiredSize": key["gpuNodeCount"], "minSize": key["gpuNodeCount"],
        "maxSize": key["gpuNodeCount"], "capacityType": key["capacityType"],
        "capacityReservationId": key["capacityReservationId"], "placementGroup": key["placementGroup"],
        "scaleToZero": key["scaleToZero"], "availabilityZone": key["availabilityZone"]}, prefix, problems)
    return [p for p in (system, gpu) if p is not None]


def _declared_pools(entries: Mapping[str, Mapping[str, Any]], prefix: str, problems: Problems) -> list[NodePool]:
    found = []
    for name, entry in entries.items():
        given = {f: POOL_KEYS[f].parse(f"{prefix}nodePools.{name}.{f}", v, problems)
                 for f, v in entry.items() if v is not None}
        if (pool := _build_pool(name, given, {}, prefix, problems)) is not None:
            found.append(pool)
    return found


def _build_pool(name: str, given: Mapping[str, Any], keys: Mapping[str, str], prefix: str,
                problems: Problems) -> NodePool | None:
    """One pool from the settings given for it (a None value: given, but refused already); None when invalid."""
    def key(f: str) -> str:
        return keys.get(f, f"{prefix}nodePools.{name}.{f}")

    before = len(problems)
    instance_type = given.get("instanceType")
    if instance_type is None:
        if "instanceType" not in given:
            problems.append(f"{key('instanceType')}: not set; every node pool needs an instance type of the catalog, "
                            "e.g. g6.12xlarge or m7i.xlarge")
        return None
    row = catalog.instance_type(instance_type)
    scaled = bool(given.get("scaleToZero"))
    capacity = given.get("capacityType") or "ON_DEMAND"
    reservation = given.get("capacityReservationId")
    efa, placement = _pool_network(given, row, instance_type, reservation, key, problems)
    _check_pool_capacity(given, capacity, reservation, scaled, key, problems)
    sizes = _pool_sizes(given, scaled, key, problems)
    group, labels, taints, disk = _pool_placement(name, given, row, instance_type)
    if len(problems) > before:
        return None
    return NodePool(
        name=name, instance_type=instance_type, min_size=sizes[0], max_size=sizes[1], desired_size=sizes[2],
        labels=MappingProxyType(dict(labels)), taints=tuple(taints), capacity_type=capacity,
        capacity_reservation_id=reservation, efa=efa, placement_group=placement, scale_to_zero=scaled,
        ray_worker_group=group, disk_size_gib=disk, availability_zone=given.get("availabilityZone"),
        keys=MappingProxyType(dict(keys)))


def _pool_network(given: Mapping[str, Any], row: catalog.InstanceType, instance_type: str, reservation: str | None,
                  key: Callable[[str], str], problems: Problems) -> tuple[bool, bool]:
    """EFA (on where the type has it) and the placement group (on with EFA, unless capacity is reserved)."""
    efa = given.get("enableEfaSupport")
    if efa is None:
        efa = row.efa_interfaces > 0
    elif efa and not row.efa_interfaces:
        problems.append(f"{key('enableEfaSupport')}: {instance_type} has no EFA network interface; set it to false, "
                        f"or use a type with EFA: {', '.join(catalog.GPU_TYPES)}")
    placement = given.get("placementGroup")
    if reservation and placement is True:
        problems.append(f"{key('placementGroup')}: true together with {key('capacityReservationId')} causes "
                        "InsufficientInstanceCapacity unless the reservation was made in that placement group; set "
                        "placementGroup to false")
    if placement is None:
        placement = efa and reservation is None
    return efa, placement


def _check_pool_capacity(given: Mapping[str, Any], capacity: str, reservation: str | None, scaled: bool,
                         key: Callable[[str], str], problems: Problems) -> None:
    """A reservation goes with On-Demand or a Capacity Block, which needs one, and never with scaling to zero."""
    if reservation and capacity == "SPOT":
        problems.append(f"{key('capacityReservationId')}: a capacity reservation holds On-Demand capacity; set "
                        f"{key('capacityType')} to ON_DEMAND or remove the reservation")
    if capacity == "CAPACITY_BLOCK" and not reservation and "capacityReservationId" not in given:
        problems.append(f"{key('capacityType')}: CAPACITY_BLOCK needs the Capacity Block's reservation; set "
                        f"{key('capacityReservationId')} to its cr-... id (EC2 console, Capacity Reservations)")
    if scaled and reservation:
        problems.append(
            f"{key('scaleToZero')}: a capacity reservation ({key('capacityReservationId')}) bills its instances "
            "whether they run or not, so scaling the nodes to zero saves nothing; remove the reservation or set "
            "scaleToZero to false")


def _pool_sizes(given: Mapping[str, Any], scaled: bool, key: Callable[[str], str],
                problems: Problems) -> tuple[int, int, int]:
    """(min, max, desired): 0, maxSize, 0 when the pool scales to zero; else one size for all three."""
    desired, smallest, largest = given.get("desiredSize"), given.get("minSize"), given.get("maxSize")
    if scaled:
        if smallest not in (None, 0):
            problems.append(f"{key('minSize')}: {smallest}; a pool that scales to zero has minSize 0; remove it")
        if desired not in (None, 0):
            problems.append(f"{key('desiredSize')}: {desired}; a pool that scales to zero starts at 0 and the Cluster "
                            "Autoscaler sets the size; remove it and set maxSize")
        if largest is None and "maxSize" not in given:
            problems.append(f"{key('maxSize')}: not set; a pool that scales to zero needs the most nodes it may run")
        return 0, largest or 0, 0
    size = next((v for v in (desired, largest, smallest) if v is not None), 1)
    for f, v in (("minSize", smallest), ("maxSize", largest), ("desiredSize", desired)):
        if v is not None and v != size:
            problems.append(f"{key(f)}: {v} differs from the pool's size {size}; without scaleToZero nothing "
                            "resizes a node group, so its minSize, maxSize and desiredSize are one number: set "
                            "desiredSize only, or scaleToZero: true with maxSize")
    if size < 1:
        problems.append(f"{key('desiredSize')}: 0 nodes; a fixed-size pool needs at least 1 (or set "
                        "scaleToZero: true with maxSize)")
    return size, size, size


def _pool_placement(name: str, given: Mapping[str, Any], row: catalog.InstanceType,
                    instance_type: str) -> tuple[str | None, Mapping[str, str], tuple, int]:
    """Ray worker group, labels, taints and root volume: as given, else the defaults of a GPU or CPU pool."""
    group = given.get("rayWorkerGroup")
    if group is None or group is True:
        group = f"{name}-workers" if group is True or row.gpus else None
    group = group or None
    labels = given.get("labels")
    if labels is None:
        labels = pools.default_labels(name, instance_type, group)
    taints = given.get("taints")
    if taints is None:
        taints = (node_facts.GPU_TAINT,) if row.gpus else ()
    disk = given.get("diskSize") or (pools.GPU_ROOT_VOLUME_GIB if row.gpus else pools.CPU_ROOT_VOLUME_GIB)
    return group, labels, taints, disk


def _check_pools(node_pools: list[NodePool], declared: bool, prefix: str, problems: Problems) -> None:
    """What only the pools together can break: the system pool, worker-group names, workers landing elsewhere."""
    by_name = {p.name: p for p in node_pools}
    system = by_name.get(pools.SYSTEM_POOL)
    where = f"{prefix}nodePools.{pools.SYSTEM_POOL}"
    if declared and system is None and not any(f"{where}." in p or p.startswith(f"{where}:") for p in problems):
        problems.append(f"{prefix}nodePools: no pool named {pools.SYSTEM_POOL}; the Ray head, the KubeRay operator and "
                        f"CoreDNS run there: add `{pools.SYSTEM_POOL}: {{instanceType: m7i.xlarge}}`")
    if system is not None:
        if system.gpus:
            problems.append(f"{system.key('instanceType')}: the {pools.SYSTEM_POOL} pool runs the Ray head (no GPUs) "
                            f"and the operators; use a CPU type: {', '.join(catalog.CPU_TYPES)}")
        if system.scale_to_zero or system.taints or system.ray_worker_group:
            problems.append(f"{where}: the {pools.SYSTEM_POOL} pool must keep its nodes and take the Ray head: "
                            "no scaleToZero, no taints, no rayWorkerGroup")
    groups: dict[str, str] = {}
    for pool in node_pools:
        if pool.ray_worker_group in groups:
            problems.append(f"{pool.key('rayWorkerGroup')}: {pool.ray_worker_group!r} is also the Ray worker group of "
                            f"pool {groups[pool.ray_worker_group]}; give each pool its own")
        elif pool.ray_worker_group:
            groups[pool.ray_worker_group] = pool.name
    for pool in node_pools:
        if not pool.ray_worker_group:
            continue
        selector = set(pool.labels.items())
        for other in node_pools:
            if other is not pool and selector <= set(other.labels.items()):
                problems.append(f"{pool.key('labels')}: {dict(pool.labels)} also match the nodes of pool {other.name}, "
                                f"so the Ray workers of {pool.name} could land there; give {pool.name} a label "
                                f"{other.name} lacks (the default role: {pool.name}-worker does)")


def _check_namespaces(raw: Mapping[str, Any], project: str, problems: Problems) -> None:
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
                     problems: Problems) -> None:
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


def _check_scale_to_zero(values: dict[str, Any], ours: Mapping[str, Any], scaled: bool, prefix: str,
                         problems: Problems) -> None:
    """Settings that only mean something when a pool scales to zero, and the autoscaler's versions."""
    if values["scaleToZero"] is None:
        return
    if not scaled:
        # With nodePools the shorthand's scaleToZero is refused: name the pool's own key there.
        scaling = (f"a pool of {prefix}nodePools scales to zero (its scaleToZero: true, with maxSize)"
                   if "nodePools" in ours else f"{prefix}scaleToZero is true")
        for name in SCALE_TO_ZERO_KEYS:
            if ours.get(name) is not None:
                problems.append(f"{prefix}{name}: has no effect unless {scaling}; set that or remove {name}")
        return
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


# --- the tables of docs/configuration.md --------------------------------------------------------------

def _row(cells: tuple[str, str, str]) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown_tables() -> dict[str, str]:
    """The configuration tables of docs/configuration.md, from the declarations: `stack` and `nodePools`."""
    header = ("| key | default | meaning |", "|---|---|---|")
    stack = [_row((f"`{REGION_ROW[0]}`", *REGION_ROW[1:]))]
    stack += [_row((f"`{s.name}`", s.default_text(), s.help)) for s in KEYS.values()]
    pool = [_row((f"`{s.name}`", s.default_text(), s.help)) for s in POOL_KEYS.values()]
    return {"stack": "\n".join([*header, *stack]), "nodePools": "\n".join([*header, *pool])}


def main(argv: list[str] | None = None) -> int:
    """`python -m deploy.config`: print the configuration tables (a test keeps docs/configuration.md equal)."""
    for name, table in markdown_tables().items():
        print(f"<!-- {name} table: python -m deploy.config -->\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
