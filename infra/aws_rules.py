"""Rules AWS enforces on what this program declares, stated in AWS's prose rather than its API models.

botocore's service models carry types, enums, lengths and patterns (tests/infra/test_conformance.py
checks the plan against them); what they state only in words lives here, as pure functions, so the
configuration can refuse a value before anything is created instead of AWS refusing it mid-apply.
Each rule names its source.
"""
from __future__ import annotations

import hashlib
import ipaddress
import re
from functools import lru_cache

# EKS user guide, "Cluster VPC and subnet requirements": control-plane subnets may not be in these
# zone IDs. Zone names map to zone IDs differently in every account, so only IDs can be compared.
REFUSED_CONTROL_PLANE_ZONE_IDS = frozenset({"use1-az3", "usw1-az2", "cac1-az3"})

# EKS API CreateCluster: name 1-100 characters, ^[0-9A-Za-z][A-Za-z0-9\-_]* (botocore's eks model).
CLUSTER_NAME_MAX = 100
_CLUSTER_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]*$")

# S3 user guide, "General purpose bucket naming rules".
BUCKET_NAME_MIN, BUCKET_NAME_MAX = 3, 63
_BUCKET_CHARS = re.compile(r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$")
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
# pulumi_aws (terraform-provider-aws) appends a 26-character unique suffix to bucketPrefix.
BUCKET_PREFIX_MAX = 37

# EC2, EKS, S3 and IAM: at most 50 user tags per resource; keys 1-128, values 0-256 characters;
# the aws: prefix is reserved. S3 and IAM allow only letters, digits, spaces and + - = . _ : / @
# (S3 user guide, "Categorizing your objects using tags"; IAM user guide, "Tagging IAM resources").
MAX_TAGS = 50
TAG_KEY_MAX, TAG_VALUE_MAX = 128, 256
_TAG_CHARS = re.compile(r"^[\w\s+\-=.:/@]*$", re.UNICODE)

# CloudWatch Logs PutRetentionPolicy: the values its documentation lists (botocore's logs model).
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                      2557, 2922, 3288, 3653)

# RFC 5737 documentation ranges: what example stack files use as a placeholder for "your address".
DOCUMENTATION_RANGES = tuple(ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))
# IANA special-purpose IPv4 ranges that are not publicly routable (RFC 6890): EKS refuses them as
# publicAccessCidrs.
_NON_PUBLIC = tuple((ipaddress.ip_network(block), kind) for block, kind in (
    ("0.0.0.0/8", "'this network' (RFC 1122)"), ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "shared address space (RFC 6598)"), ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"), ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignment"), ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking (RFC 2544)"), ("224.0.0.0/4", "multicast"), ("240.0.0.0/4", "reserved")))


def cluster_name_problem(name: str) -> str | None:
    """Why EKS would refuse this cluster name, or None."""
    if not 1 <= len(name) <= CLUSTER_NAME_MAX:
        return f"is {len(name)} characters long; EKS allows 1 to {CLUSTER_NAME_MAX}"
    if not _CLUSTER_NAME.match(name):
        return ("holds characters EKS refuses; a cluster name is letters, digits, hyphens and underscores, "
                "starting with a letter or digit")
    return None


def bucket_name_problem(name: str) -> str | None:
    """Why S3 CreateBucket would refuse this general purpose bucket name, or None."""
    if not BUCKET_NAME_MIN <= len(name) <= BUCKET_NAME_MAX:
        return f"is {len(name)} characters long; S3 allows {BUCKET_NAME_MIN} to {BUCKET_NAME_MAX}"
    if not _BUCKET_CHARS.match(name):
        return ("holds characters S3 refuses; a bucket name is lowercase letters, digits, dots and hyphens, "
                "starting and ending with a letter or digit (no underscores, no capitals)")
    if ".." in name:
        return "has two adjacent dots, which S3 refuses"
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        return "is formatted as an IP address, which S3 refuses"
    if name.startswith(_BUCKET_RESERVED_PREFIXES):
        return f"starts with a prefix S3 reserves ({', '.join(_BUCKET_RESERVED_PREFIXES)})"
    if name.endswith(_BUCKET_RESERVED_SUFFIXES):
        return f"ends with a suffix S3 reserves ({', '.join(_BUCKET_RESERVED_SUFFIXES)})"
    return None


def bucket_prefix(cluster_name: str, suffix: str = "-ckpt-") -> str:
    """A bucketPrefix S3 and the provider accept, derived from any valid cluster name.

    Lowercased, underscores to hyphens, at most BUCKET_PREFIX_MAX characters with `suffix`; a name
    cut short keeps a hash of the whole name so two long names still give different prefixes.
    """
    base = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", cluster_name.lower())).strip("-") or "raytrain"
    room = BUCKET_PREFIX_MAX - len(suffix)
    if len(base) > room:
        digest = hashlib.sha256(cluster_name.encode()).hexdigest()[:6]
        base = f"{base[: room - len(digest) - 1].rstrip('-')}-{digest}"
    while base.startswith(_BUCKET_RESERVED_PREFIXES):
        base = base[1:].lstrip("-")
    return f"{base}{suffix}"


def tag_problems(key: str, value: str) -> list[str]:
    """What EC2, EKS, S3 or IAM would refuse about one tag."""
    problems = []
    if key.lower().startswith("aws:"):
        problems.append(f"tag {key!r} uses the reserved prefix 'aws:'; rename it")
    if not 1 <= len(key) <= TAG_KEY_MAX:
        problems.append(f"tag {key!r} must be 1 to {TAG_KEY_MAX} characters long")
    if len(value) > TAG_VALUE_MAX:
        problems.append(f"the value of tag {key!r} is {len(value)} characters; AWS allows at most {TAG_VALUE_MAX}")
    for what, text in (("key", key), ("value", value)):
        if not _TAG_CHARS.match(text):
            bad = sorted({c for c in text if not _TAG_CHARS.match(c)})
            problems.append(f"the {what} of tag {key!r} holds {''.join(bad)!r}; S3 and IAM tags allow only "
                            "letters, digits, spaces and + - = . _ : / @")
    return problems


def is_documentation_range(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    return any(net.version == doc.version and net.subnet_of(doc) for doc in DOCUMENTATION_RANGES)


def public_cidr_problem(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str | None:
    """Why EKS would refuse this range in publicAccessCidrs (public IPv4 only), or None.

    Documentation ranges are not judged here: the shipped stack files use one as a placeholder.
    """
    if net.version != 4:
        return "is IPv6; the EKS public endpoint's access list takes IPv4 CIDRs only"
    for block, kind in _NON_PUBLIC:
        if net.subnet_of(block):
            return f"lies in {block}, a {kind} range; the EKS public endpoint accepts only public addresses"
    return None


def covers_everything(nets: list[ipaddress.IPv4Network]) -> bool:
    """True when the ranges together are 0.0.0.0/0, however they are split."""
    return ipaddress.ip_network("0.0.0.0/0") in list(ipaddress.collapse_addresses(nets))


@lru_cache(maxsize=1)
def eks_regions() -> frozenset[str]:
    """Every region of every partition where botocore's endpoint data lists EKS."""
    import botocore.session

    session = botocore.session.get_session()
    return frozenset(region for partition in session.get_available_partitions()
                     for region in session.get_available_regions("eks", partition_name=partition))


# EKS's documented limit on the public endpoint's access list (EKS user guide, cluster-endpoint:
# "You can specify up to 40 CIDR blocks"); UpdateClusterConfig/CreateCluster refuse more.
PUBLIC_ACCESS_CIDRS_MAX = 40
# Node label namespaces EKS and the kubelet keep for themselves (NodeRestriction admission refuses node
# labels under kubernetes.io and k8s.io; EKS sets its own under eks.amazonaws.com).
RESERVED_LABEL_DOMAINS = ("kubernetes.io", "k8s.io", "eks.amazonaws.com")
MAX_TAINTS = 50  # aws_eks_node_group's taint MaxItems (terraform-provider-aws node_group.go), EKS's quota


@lru_cache(maxsize=1)
def eks_label_limits() -> dict[str, tuple[int, int]]:
    """(min, max) lengths of node-group label and taint keys and values, from botocore's EKS model."""
    import botocore.session

    shapes = botocore.session.get_session().get_service_model("eks").shape_for
    return {name: (shapes(name).metadata.get("min", 0), shapes(name).metadata["max"])
            for name in ("labelKey", "labelValue", "taintKey", "taintValue")}


def node_group_label_problems(kind: str, key: str, value: str) -> list[str]:
    """What EKS's CreateNodegroup refuses of one label or taint (`kind`) that Kubernetes itself would take."""
    limits, problems = eks_label_limits(), []
    for part, text in (("Key", key), ("Value", value)):
        low, high = limits[f"{kind}{part}"]
        if not low <= len(text) <= high:
            size = "empty" if not text else f"{len(text)} characters"
            problems.append(f"{kind} {part.lower()} {text!r} of {key!r} is {size}; EKS takes {low} to {high} "
                            f"characters{' (prefix included)' if part == 'Key' else ''}")
    domain = key.partition("/")[0] if "/" in key else ""
    if kind == "label" and any(domain == d or domain.endswith("." + d) for d in RESERVED_LABEL_DOMAINS):
        problems.append(f"label key {key!r} is in {domain}, a namespace Kubernetes and EKS reserve for themselves "
                        f"({', '.join(RESERVED_LABEL_DOMAINS)}); use a prefix of your own, e.g. example.com/")
    return problems


def tag_collisions(user_tags: dict[str, str], own_keys: tuple[str, ...]) -> list[str]:
    """User tags that differ from the program's own, or from each other, only in case: IAM compares tag keys
    case-insensitively and refuses the pair (CreateRole: "Duplicate tag keys found"), EC2 keeps both."""
    problems, seen = [], {k.lower(): k for k in own_keys}
    for key in user_tags:
        other = seen.get(key.lower())
        if other is not None:
            whose = "the program's own tag" if other in own_keys else "another tag"
            problems.append(f"tag {key!r} is {whose} {other!r} but for case; IAM takes tag keys case-insensitively "
                            "and refuses both on one role: rename or drop it")
        seen.setdefault(key.lower(), key)
    return problems


@lru_cache(maxsize=None)
def partition(region: str) -> str:
    """The region's partition (aws, aws-cn, aws-us-gov), from botocore's endpoint data: every ARN names it."""
    import botocore.session

    return botocore.session.get_session().get_partition_for_region(region)


# Service principals that differ by partition (AWS in China: EC2's is ec2.amazonaws.com.cn; EKS's is the same
# everywhere). Trust policies for nodes must name the partition's.
PARTITION_SERVICE_PRINCIPALS = {"aws-cn": {"ec2.amazonaws.com": "ec2.amazonaws.com.cn"}}


def service_principal(service: str, region: str) -> str:
    return PARTITION_SERVICE_PRINCIPALS.get(partition(region), {}).get(service, service)


def in_partition(arn: str, region: str) -> str:
    """An `arn:aws:` ARN written for the aws partition, in the region's partition."""
    return arn.replace("arn:aws:", f"arn:{partition(region)}:", 1)


def vpc_endpoint_service(region: str, service: str) -> str:
    """VPC endpoint service names: com.amazonaws.<region>.<service>, and cn.com.amazonaws... in China."""
    return f"{'cn.' if partition(region) == 'aws-cn' else ''}com.amazonaws.{region}.{service}"
