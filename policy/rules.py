"""This project's security and cost rules, as pure functions over plain resource data.

Nothing here imports pulumi_policy: `pack.py` adapts these functions to the Pulumi
policy SDK, and the tests call them directly on hand-built resources and on the
resources of the mocked program.

Properties use the engine's camelCase names. A value the engine does not know yet
(during `pulumi preview`, anything computed from a resource still to be created)
arrives as UNKNOWN. A rule never guesses about it: it reports what it can decide
and, when an UNKNOWN was the only thing standing between it and a verdict, raises
Unknown, which Pulumi shows as an advisory "can't run policy during preview";
`pulumi up` runs the rule again once the values are known.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from facts import catalog, images
from facts import ray as ray_facts


class _UnknownValue:
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _UnknownValue()


class Unknown(Exception):
    """The verdict depends on a value that is not known until the resource exists."""

    def __init__(self, path: str):
        super().__init__(f"{path} is not known during preview")
        self.path = path


class PolicyConfigError(ValueError):
    """A policy pack configuration value is invalid."""


@dataclass(frozen=True)
class Resource:
    """One resource of a stack, as stack rules see it.

    `id` is the physical ID when known; `deps` maps a top-level property to the URNs
    of the resources its value was computed from (the engine's property
    dependencies), which is how references are resolved while IDs are still unknown.
    """

    type: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""
    id: Any = None
    deps: Mapping[str, Sequence[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Violation:
    message: str
    urn: str = ""


class _Findings:
    """Violations found so far, and the first unknown value that blocked a decision."""

    def __init__(self) -> None:
        self.violations: list = []
        self.unknown: str | None = None

    def fail(self, item) -> None:
        self.violations.append(item)

    def not_known(self, path: str) -> None:
        self.unknown = self.unknown or path

    def result(self) -> list:
        if self.violations:
            return self.violations
        if self.unknown:
            raise Unknown(self.unknown)
        return []


def _get(value: Any, *path: str | int, default: Any = None) -> Any:
    """value[path[0]][path[1]]...; UNKNOWN as soon as an unknown value is met on the way."""
    for key in path:
        if value is UNKNOWN:
            return UNKNOWN
        if isinstance(key, int):
            if not isinstance(value, (list, tuple)) or key >= len(value):
                return default
        elif not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    return value


def _items(value: Any, path: str, found: "_Findings") -> list:
    """The elements of a list property; an unknown list is noted and yields nothing."""
    if value is UNKNOWN:
        found.not_known(path)
        return []
    return list(value) if isinstance(value, (list, tuple)) else []


def _truthy(value: Any) -> bool:
    """pulumi_aws passes some booleans as strings ("true")."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


# --- configuration -------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    name: str
    schema: Mapping[str, Any]
    description: str


def _check_setting(rule: str, setting: Setting, value: Any) -> Any:
    schema = setting.schema
    where = f"policy pack config {rule}.{setting.name}"
    if schema["type"] == "integer":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyConfigError(f"{where}: {value!r} is not a whole number; {setting.description}")
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise PolicyConfigError(f"{where}: {value} is out of range; set a whole number from {lo} to {hi}")
        return value
    if schema["type"] == "array":
        if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
            raise PolicyConfigError(f"{where}: {value!r} is not a non-empty list of names; {setting.description}")
        return tuple(value)
    raise AssertionError(f"unsupported setting type {schema['type']}")


# --- rule 1: IMDSv2 ------------------------------------------------------------------

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
EKS_MANAGED_NODE_GROUP = "eks:index:ManagedNodeGroup"


def imdsv2_required(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """Node credentials sit behind IMDS: tokens required, one hop so pods cannot reach it."""
    found = _Findings()
    max_hops = config["maxHopLimit"]
    if resource_type in (LAUNCH_TEMPLATE, INSTANCE):
        options = props.get("metadataOptions")
        if options is UNKNOWN:
            found.not_known("metadataOptions")
        elif not isinstance(options, Mapping):
            found.fail("metadataOptions is not set, so IMDSv1 stays enabled; set metadataOptions "
                       f"httpTokens=\"required\" and httpPutResponseHopLimit={max_hops}")
        elif options.get("httpEndpoint") == "disabled":
            pass
        else:
            tokens = options.get("httpTokens")
            if tokens is UNKNOWN:
                found.not_known("metadataOptions.httpTokens")
            elif tokens != "required":
                found.fail(f"metadataOptions.httpTokens is {tokens!r}: IMDSv1 stays enabled; set it to \"required\"")
            hops = options.get("httpPutResponseHopLimit")
            number = _number(hops)
            if hops is UNKNOWN:
                found.not_known("metadataOptions.httpPutResponseHopLimit")
            elif number is None or number > max_hops:
                found.fail(f"metadataOptions.httpPutResponseHopLimit is {hops!r}: pods could reach the node's "
                           f"credentials; set it to {max_hops} (pods use IRSA)")
    elif resource_type == NODE_GROUP:
        template = props.get("launchTemplate")
        if template is None:
            found.fail("the node group has no launchTemplate, so EKS's default template decides the IMDS settings; "
                       "give it a launch template with httpTokens=\"required\"")
    return found.result()


# --- rule 2: no public IPs on nodes ----------------------------------------------------

def no_public_ip_on_nodes(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """Nodes live in private subnets and reach the internet through the NAT gateway only."""
    found = _Findings()
    if resource_type == LAUNCH_TEMPLATE:
        for i, interface in enumerate(_items(props.get("networkInterfaces"), "networkInterfaces", found)):
            value = _get(interface, "associatePublicIpAddress")
            if value is UNKNOWN:
                found.not_known(f"networkInterfaces[{i}].associatePublicIpAddress")
            elif _truthy(value):
                found.fail(f"networkInterfaces[{i}].associatePublicIpAddress is {value!r}: the node gets a public IP; "
                           "set it to \"false\"")
    elif resource_type == INSTANCE:
        value = props.get("associatePublicIpAddress")
        if value is UNKNOWN:
            found.not_known("associatePublicIpAddress")
        elif _truthy(value):
            found.fail("associatePublicIpAddress is true: the instance gets a public IP; set it to false")
    return found.result()


# --- rule 3: the EKS endpoint ----------------------------------------------------------

EKS_CLUSTER = "aws:eks/cluster:Cluster"
EKS_COMPONENT_CLUSTER = "eks:index:Cluster"


def _endpoint_settings(resource_type: str, props: Mapping[str, Any]) -> tuple[Any, Any, str]:
    if resource_type == EKS_CLUSTER:
        vpc = props.get("vpcConfig")
        if vpc is UNKNOWN:
            return UNKNOWN, UNKNOWN, "vpcConfig"
        vpc = vpc if isinstance(vpc, Mapping) else {}
        return vpc.get("endpointPublicAccess"), vpc.get("publicAccessCidrs"), "vpcConfig."
    return props.get("endpointPublicAccess"), props.get("publicAccessCidrs"), ""


def eks_endpoint_restricted(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """A public EKS API endpoint must list the CIDRs allowed to reach it, never 0.0.0.0/0."""
    found = _Findings()
    if resource_type not in (EKS_CLUSTER, EKS_COMPONENT_CLUSTER):
        return []
    public, cidrs, prefix = _endpoint_settings(resource_type, props)
    if public is UNKNOWN:
        found.not_known(f"{prefix}endpointPublicAccess")
        return found.result()
    if public is False or (isinstance(public, str) and public.lower() == "false"):
        return []
    if cidrs is UNKNOWN:
        found.not_known(f"{prefix}publicAccessCidrs")
    elif not cidrs:
        found.fail(f"{prefix}endpointPublicAccess is on and {prefix}publicAccessCidrs is empty, which AWS reads as "
                   "0.0.0.0/0; list the addresses you deploy from (x.x.x.x/32) or turn public access off")
    else:
        for i, cidr in enumerate(cidrs):
            if cidr is UNKNOWN:
                found.not_known(f"{prefix}publicAccessCidrs[{i}]")
                continue
            try:
                net = ipaddress.ip_network(str(cidr), strict=False)
            except ValueError:
                found.fail(f"{prefix}publicAccessCidrs[{i}] is {cidr!r}, not a CIDR; write it like 203.0.113.10/32")
                continue
            if net.prefixlen == 0:
                found.fail(f"{prefix}publicAccessCidrs[{i}] is {cidr}: the EKS API is open to the whole internet; "
                           "list only the addresses you deploy from")
    return found.result()


# --- rule 4: nothing of Ray exposed outside the cluster --------------------------------

SERVICE = "kubernetes:core/v1:Service"
INGRESS_TYPES = ("kubernetes:networking.k8s.io/v1:Ingress", "kubernetes:networking.k8s.io/v1beta1:Ingress",
                 "kubernetes:extensions/v1beta1:Ingress")
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
RAY_CLUSTER_SPECS = {  # type -> path of the RayCluster spec inside the resource
    "kubernetes:ray.io/v1:RayCluster": ("spec",),
    "kubernetes:ray.io/v1alpha1:RayCluster": ("spec",),
    "kubernetes:ray.io/v1:RayJob": ("spec", "rayClusterSpec"),
    "kubernetes:ray.io/v1:RayService": ("spec", "rayClusterConfig"),
}
EXPOSED_SERVICE_TYPES = ("LoadBalancer", "NodePort")
# GCS, dashboard + Jobs API, Ray client (the head's ports), and Serve.
RAY_PORTS = frozenset({*ray_facts.HEAD_PORTS.values(), 8000})
RAY_PORT_NAMES = frozenset({*ray_facts.HEAD_PORTS, "gcs", "ray-client", "serve"})
WHY_RAY = ("Ray's dashboard and Jobs API run arbitrary code for whoever reaches them (ShadowRay, CVE-2023-48022); "
           "keep it ClusterIP and use kubectl port-forward")


def _namespace(props: Mapping[str, Any]) -> Any:
    namespace = _get(props, "metadata", "namespace")
    return "default" if namespace is None else namespace


def _is_ray_port(port: Any) -> bool:
    if isinstance(port, str):
        return port in RAY_PORT_NAMES or (port.isdigit() and int(port) in RAY_PORTS)
    number = _number(port)
    return number is not None and int(number) in RAY_PORTS


def _service_is_ray(spec: Mapping[str, Any], found: _Findings) -> bool:
    selector = spec.get("selector")
    if selector is UNKNOWN:
        found.not_known("spec.selector")
    elif isinstance(selector, Mapping) and any(str(k).startswith("ray.io/") for k in selector):
        return True
    for port in _items(spec.get("ports"), "spec.ports", found):
        if isinstance(port, Mapping) and any(_is_ray_port(port.get(k)) for k in ("port", "targetPort", "name")):
            return True
    return False


def _check_service(props: Mapping[str, Any], ray_namespaces: tuple[str, ...], found: _Findings) -> None:
    spec = props.get("spec")
    if spec is UNKNOWN:
        found.not_known("spec")
        return
    spec = spec if isinstance(spec, Mapping) else {}
    namespace = _namespace(props)
    if namespace is UNKNOWN:
        found.not_known("metadata.namespace")
    in_ray_namespace = namespace in ray_namespaces
    if not (in_ray_namespace or _service_is_ray(spec, found)):
        return
    kind = spec.get("type", "ClusterIP")
    if kind is UNKNOWN:
        found.not_known("spec.type")
    where = f"in the Ray namespace {namespace!r}" if in_ray_namespace else "selecting Ray pods or ports"
    if kind in EXPOSED_SERVICE_TYPES:
        found.fail(f"Service of type {kind} {where}: {WHY_RAY}")
    if spec.get("externalIPs"):
        found.fail(f"Service with externalIPs {where}: {WHY_RAY}")


def _ingress_backends(spec: Mapping[str, Any], found: _Findings) -> Iterable[tuple[Any, Any]]:
    """(service name, port number or name) of every backend, v1 and v1beta1 spellings."""
    backends = [spec.get("defaultBackend"), spec.get("backend")]
    for i, rule in enumerate(_items(spec.get("rules"), "spec.rules", found)):
        for path in _items(_get(rule, "http", "paths"), f"spec.rules[{i}].http.paths", found):
            backends.append(_get(path, "backend"))
    for backend in backends:
        if backend is UNKNOWN:
            found.not_known("spec...backend")
        if not isinstance(backend, Mapping):
            continue
        service = backend.get("service")
        if isinstance(service, Mapping):
            port = service.get("port")
            yield service.get("name"), port.get("number", port.get("name")) if isinstance(port, Mapping) else port
        elif "serviceName" in backend:
            yield backend.get("serviceName"), backend.get("servicePort")
        elif service is UNKNOWN:
            found.not_known("spec...backend.service")


def _check_ingress(props: Mapping[str, Any], ray_namespaces: tuple[str, ...], found: _Findings) -> None:
    namespace = _namespace(props)
    if namespace is UNKNOWN:
        found.not_known("metadata.namespace")
        return
    if namespace in ray_namespaces:
        found.fail(f"Ingress in the Ray namespace {namespace!r} routes outside traffic to Ray: {WHY_RAY}")
        return
    spec = props.get("spec")
    if spec is UNKNOWN:
        found.not_known("spec")
        return
    for name, port in _ingress_backends(spec if isinstance(spec, Mapping) else {}, found):
        if (isinstance(name, str) and name.endswith("-head-svc")) or _is_ray_port(port):
            found.fail(f"Ingress backend {name}:{port} is a Ray head service or port: {WHY_RAY}")
        elif name is UNKNOWN or port is UNKNOWN:
            found.not_known("spec...backend.service")


def _check_ray_cluster_spec(spec: Any, where: str, found: _Findings) -> None:
    if spec is UNKNOWN:
        found.not_known(where)
        return
    head = f"{where}.headGroupSpec"
    checks = {
        "serviceType": lambda v: v in EXPOSED_SERVICE_TYPES,
        "headService.spec.type": lambda v: v in EXPOSED_SERVICE_TYPES,
        "enableIngress": _truthy,
    }
    for path, exposes in checks.items():
        value = _get(spec, "headGroupSpec", *path.split("."))
        if value is UNKNOWN:
            found.not_known(f"{head}.{path}")
        elif exposes(value):
            also = " (KubeRay creates an Ingress to the head)" if path == "enableIngress" else ""
            found.fail(f"{head}.{path} is {'true' if value is True else value}{also}: {WHY_RAY}")


def _exposing_values(values: Any, found: _Findings, path: str = "values") -> Iterable[str]:
    """Paths in Helm values that ask for a LoadBalancer/NodePort service or an ingress."""
    if values is UNKNOWN:
        found.not_known(path)
    elif isinstance(values, Mapping):
        for key, value in values.items():
            here = f"{path}.{key}"
            if key in ("type", "serviceType") and value in EXPOSED_SERVICE_TYPES:
                yield f"{here}={value}"
            elif key == "enableIngress" and _truthy(value):
                yield f"{here}=true"
            elif key == "ingress" and isinstance(value, Mapping) and _truthy(value.get("enabled")):
                yield f"{here}.enabled=true"
            else:
                yield from _exposing_values(value, found, here)
    elif isinstance(values, list):
        for i, value in enumerate(values):
            yield from _exposing_values(value, found, f"{path}[{i}]")


def ray_not_exposed(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """No LoadBalancer, NodePort or Ingress reaches Ray, nor anything in the Ray namespace."""
    found = _Findings()
    ray_namespaces = config["rayNamespaces"]
    if resource_type == SERVICE:
        _check_service(props, ray_namespaces, found)
    elif resource_type in INGRESS_TYPES:
        _check_ingress(props, ray_namespaces, found)
    elif resource_type in RAY_CLUSTER_SPECS:
        path = RAY_CLUSTER_SPECS[resource_type]
        _check_ray_cluster_spec(_get(props, *path), ".".join(path), found)
        if resource_type == "kubernetes:ray.io/v1:RayService":
            serve_type = _get(props, "spec", "serveService", "spec", "type")
            if serve_type is UNKNOWN:
                found.not_known("spec.serveService.spec.type")
            elif serve_type in EXPOSED_SERVICE_TYPES:
                found.fail(f"spec.serveService.spec.type is {serve_type}: {WHY_RAY}")
    elif resource_type == HELM_RELEASE:
        namespace, chart = props.get("namespace"), props.get("chart")
        if namespace is UNKNOWN or chart is UNKNOWN:
            found.not_known("namespace" if namespace is UNKNOWN else "chart")
        if namespace in ray_namespaces or (isinstance(chart, str) and "ray" in chart.lower()):
            for path in _exposing_values(props.get("values") or {}, found):
                found.fail(f"Helm release {props.get('name') or chart!r} sets {path}: {WHY_RAY}")
    return found.result()


# --- rule 5: images by digest --------------------------------------------------------

CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def _pod_specs(value: Any, path: str) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """Every mapping that holds `containers`, wherever it sits (Pod, Deployment, CronJob, RayCluster...)."""
    if isinstance(value, Mapping):
        if "containers" in value:
            yield path, value
        for key, child in value.items():
            yield from _pod_specs(child, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _pod_specs(child, f"{path}[{i}]")


def _release_image(props: Mapping[str, Any], found: "_Findings") -> None:
    """A Helm release's `image` values ({repository, tag}, as these charts take them) render repository:tag."""
    image = _get(props, "values", "image")
    if image is UNKNOWN:
        found.not_known("values.image")
        return
    if not isinstance(image, Mapping):
        found.fail("values.image is not set: the chart would run its default image, pinned by tag only; "
                   "set image.repository and image.tag to <tag>@sha256:<64 hex>")
        return
    tag = _get(image, "tag")
    if tag is UNKNOWN:
        found.not_known("values.image.tag")
    elif not (isinstance(tag, str) and _tag_pinned(tag)):
        found.fail(f"values.image.tag {tag!r} is not pinned by digest; use <tag>@sha256:<64 hex>")


def _tag_pinned(tag: str) -> bool:
    try:
        return images.split_tag(tag)[1] is not None
    except images.ImageError:
        return False


def images_by_digest(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """A tag can be moved to other bytes; a digest cannot. Every container image is repo@sha256:<64 hex>."""
    found = _Findings()
    if resource_type == HELM_RELEASE:
        _release_image(props, found)
        return found.result()
    if not resource_type.startswith("kubernetes:"):
        return []
    for path, pod in _pod_specs(props, ""):
        for key in CONTAINER_LISTS:
            for i, container in enumerate(_items(pod.get(key), f"{path}.{key}", found)):
                where = f"{path}.{key}[{i}]"
                image = _get(container, "image")
                if image is UNKNOWN:
                    found.not_known(f"{where}.image")
                elif not isinstance(image, str) or not images.is_pinned(image):
                    name = _get(container, "name", default="?")
                    found.fail(f"{where} ({name}) image {image!r} is not pinned by digest; "
                               "use registry/repository@sha256:<64 hex>")
    return found.result()


# --- rule: Ray pods run least-privileged ------------------------------------------------

SECCOMP_CONFINED = ("RuntimeDefault", "Localhost")


def _ray_pod_templates(spec: Any, where: str, found: "_Findings") -> Iterable[tuple[str, Any]]:
    if spec is UNKNOWN:
        found.not_known(where)
        return
    yield f"{where}.headGroupSpec.template.spec", _get(spec, "headGroupSpec", "template", "spec")
    for i, group in enumerate(_items(_get(spec, "workerGroupSpecs"), f"{where}.workerGroupSpecs", found)):
        yield f"{where}.workerGroupSpecs[{i}].template.spec", _get(group, "template", "spec")


def _check_container_privileges(container: Any, where: str, found: "_Findings") -> None:
    security = _get(container, "securityContext")
    if security is UNKNOWN:
        found.not_known(f"{where}.securityContext")
        return
    security = security if isinstance(security, Mapping) else {}
    drop, add = _get(security, "capabilities", "drop"), _get(security, "capabilities", "add")
    listed = [*(drop if isinstance(drop, list) else [drop]), *(add if isinstance(add, list) else [add])]
    if UNKNOWN in listed:
        found.not_known(f"{where}.securityContext.capabilities")
    elif "ALL" not in (drop or []) or add:
        found.fail(f"{where}: capabilities must drop ALL and add none (drop={drop}, add={add})")
    escalation, privileged = security.get("allowPrivilegeEscalation"), security.get("privileged")
    if UNKNOWN in (escalation, privileged):
        found.not_known(f"{where}.securityContext")
    elif escalation is not False or privileged is True:
        found.fail(f"{where}: set allowPrivilegeEscalation false and privileged false")


def ray_pods_least_privileged(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """Ray needs no Linux capability: its containers drop ALL, cannot escalate, and run under a seccomp profile."""
    if resource_type not in RAY_CLUSTER_SPECS:
        return []
    found = _Findings()
    path = RAY_CLUSTER_SPECS[resource_type]
    spec = _get(props, *path)
    where = ".".join(path)
    for pod_path, pod in _ray_pod_templates(spec, where, found):
        if pod is UNKNOWN:
            found.not_known(pod_path)
            continue
        seccomp = _get(pod, "securityContext", "seccompProfile", "type")
        for i, container in enumerate(_items(_get(pod, "containers"), f"{pod_path}.containers", found)):
            own = _get(container, "securityContext", "seccompProfile", "type")
            if UNKNOWN in (seccomp, own):
                found.not_known(f"{pod_path}.securityContext.seccompProfile")
            elif (own or seccomp) not in SECCOMP_CONFINED:
                found.fail(f"{pod_path}.containers[{i}]: no seccomp profile (set the pod's "
                           "securityContext.seccompProfile.type to RuntimeDefault)")
            _check_container_privileges(container, f"{pod_path}.containers[{i}]", found)
    if spec is not UNKNOWN and _get(spec, "autoscalerOptions") not in (None, UNKNOWN):
        _check_container_privileges(_get(spec, "autoscalerOptions"), f"{where}.autoscalerOptions", found)
    return found.result()


# --- stack rule: the Ray namespace denies ingress by default ------------------------------

NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"


def _denies_all_ingress(policy: Resource) -> bool | None:
    spec = _get(policy.props, "spec")
    if spec is UNKNOWN:
        return None
    selector, types, ingress = (_get(spec, "podSelector"), _get(spec, "policyTypes"), _get(spec, "ingress"))
    if UNKNOWN in (selector, types, ingress):
        return None
    return selector in ({}, None) and "Ingress" in (types or []) and not ingress


def ray_namespace_default_deny(resources: Sequence[Resource], config: Mapping[str, Any]) -> list[Violation]:
    """The Jobs API is remote code execution behind a token: inside the cluster only Ray's own pods reach it."""
    found = _Findings()
    clusters = [r for r in resources if r.type in RAY_CLUSTER_SPECS]
    policies = [r for r in resources if r.type == NETWORK_POLICY]
    for cluster in clusters:
        namespace = _get(cluster.props, "metadata", "namespace")
        if namespace is UNKNOWN:
            found.not_known(f"{cluster.name}.metadata.namespace")
            continue
        verdicts = [_denies_all_ingress(p) for p in policies
                    if _get(p.props, "metadata", "namespace") in (namespace, UNKNOWN)]
        if True in verdicts:
            continue
        if None in verdicts:
            found.not_known(f"NetworkPolicies of namespace {namespace}")
            continue
        found.fail(Violation(f"{cluster.type} {cluster.name}: namespace {namespace!r} has no NetworkPolicy denying "
                             "all ingress by default (podSelector {}, policyTypes [Ingress], no rules); every pod of "
                             "the cluster can reach the Ray Jobs API", cluster.urn))
    return found.result()


# --- stack rules: references ------------------------------------------------------------

SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SUBNET = "aws:ec2/subnet:Subnet"
VPC_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
VPC_EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
ALL_PROTOCOLS = ("-1", "all")


def _refers(holder: Resource, prop: str, value: Any, target: Resource) -> bool:
    """Whether `value`, found under holder.props[prop], is target's ID."""
    if value is not UNKNOWN and value is not None and target.id not in (None, UNKNOWN) and value == target.id:
        return True
    return bool(target.urn) and target.urn in (holder.deps.get(prop) or ())


def _resolve(holder: Resource, prop: str, values: Sequence[Any], candidates: Sequence[Resource],
             found: _Findings, path: str) -> list[Resource]:
    """The candidates `values` refer to; an unknown value that resolves to none of them is noted."""
    matched = [c for c in candidates if any(_refers(holder, prop, v, c) for v in values)]
    if not matched and any(v is UNKNOWN for v in values):
        found.not_known(path)
    return matched


def _verdict(*conditions: Any) -> bool | None:
    """True if all hold, False if one fails, None if an unknown value leaves it open."""
    if any(c is False for c in conditions):
        return False
    return None if any(c is None for c in conditions) else True


def _equals(value: Any, *allowed: str) -> bool | None:
    return None if value is UNKNOWN else str(value) in allowed


def _is(holder: Resource, prop: str, group: Resource) -> bool | None:
    value = holder.props.get(prop)
    if _refers(holder, prop, value, group):
        return True
    # An unknown ID whose dependencies name other resources is not this group's.
    return None if value is UNKNOWN and not holder.deps.get(prop) else False


def _self_rules(group: Resource, resources: Sequence[Resource]) -> tuple[set[str], set[str]]:
    """Directions in which `group` surely allows all traffic to/from itself, and those an unknown value may allow."""
    sure: set[str] = set()
    maybe: set[str] = set()

    def note(direction: str, verdict: bool | None) -> None:
        if verdict:
            sure.add(direction)
        elif verdict is None:
            maybe.add(direction)

    for direction in ("ingress", "egress"):
        inline = group.props.get(direction)
        if inline is UNKNOWN:
            maybe.add(direction)
            continue
        for rule in inline or []:
            if rule is UNKNOWN or not isinstance(rule, Mapping):
                note(direction, None if rule is UNKNOWN else False)
                continue
            groups = rule.get("securityGroups")
            itself = (True if _truthy(rule.get("self")) or any(_refers(group, direction, g, group) for g in groups or [])
                      else None if UNKNOWN in (rule.get("self"), groups) else False)
            note(direction, _verdict(_equals(rule.get("protocol"), *ALL_PROTOCOLS), itself))
    for rule in resources:
        props = rule.props
        if rule.type in (VPC_INGRESS, VPC_EGRESS):
            direction = "ingress" if rule.type == VPC_INGRESS else "egress"
            note(direction, _verdict(_equals(props.get("ipProtocol"), *ALL_PROTOCOLS), _is(rule, "securityGroupId", group),
                                     _is(rule, "referencedSecurityGroupId", group)))
        elif rule.type == SG_RULE:
            kind = props.get("type")
            itself = True if _truthy(props.get("self")) else _is(rule, "sourceSecurityGroupId", group)
            verdict = _verdict(_equals(props.get("protocol"), *ALL_PROTOCOLS), _is(rule, "securityGroupId", group), itself)
            for direction in ("ingress", "egress") if kind is UNKNOWN else (kind,) if kind in ("ingress", "egress") else ():
                note(direction, None if kind is UNKNOWN and verdict is not False else verdict)
    return sure, maybe - sure


# --- rule 6: EFA security-group self rules ------------------------------------------------

def efa_security_group_self_rules(resources: Sequence[Resource], config: Mapping[str, Any]) -> list[Violation]:
    """Every EFA interface carries a group that allows all traffic from AND to itself.

    0.0.0.0/0 egress does not cover the outbound self rule; without it NCCL over EFA
    fails with "Unresponsive receiver".
    """
    found = _Findings()
    groups = [r for r in resources if r.type == SECURITY_GROUP]
    both = {"ingress", "egress"}
    for template in (r for r in resources if r.type == LAUNCH_TEMPLATE):
        lacking: dict[str, tuple[Resource, set[str], list[int]]] = {}
        outside: dict[tuple, list[int]] = {}
        for i, interface in enumerate(_items(template.props.get("networkInterfaces"),
                                             f"{template.name}.networkInterfaces", found)):
            where = f"{template.name}.networkInterfaces[{i}]"
            kind = _get(interface, "interfaceType")
            if kind is UNKNOWN:
                found.not_known(f"{where}.interfaceType")
            if kind not in ("efa", "efa-only"):
                continue
            values = _get(interface, "securityGroups")
            values = [UNKNOWN] if values is UNKNOWN else list(values or [])
            attached = _resolve(template, "networkInterfaces", values, groups, found, f"{where}.securityGroups")
            rules_of = {g.name: _self_rules(g, resources) for g in attached}
            if any(sure == both for sure, _ in rules_of.values()):
                continue
            if any(sure | maybe == both for sure, maybe in rules_of.values()):
                found.not_known(f"{where}: the self rules of its security groups")
            elif not attached:
                if all(v is not UNKNOWN for v in values):
                    outside.setdefault(tuple(map(str, values)), []).append(i)
            else:
                for group in attached:
                    lacking.setdefault(group.name, (group, both - rules_of[group.name][0], []))[2].append(i)
        for values, indices in outside.items():
            found.fail(Violation(
                f"{template.name} EFA interfaces {_span(indices)} use only security groups not declared in this stack "
                f"({', '.join(values) or 'none'}), so their self rules cannot be checked; attach a group of this "
                "stack with all-traffic ingress and egress rules referencing itself", template.urn))
        for group, missing, indices in lacking.values():
            found.fail(Violation(
                f"security group {group.name} on {template.name} EFA interfaces {_span(indices)} lacks the "
                f"all-traffic {' and '.join(sorted(missing))} rule referencing itself; EFA needs both directions "
                "(0.0.0.0/0 egress does not cover the outbound self rule)", group.urn or template.urn))
    return found.result()


def _span(indices: list[int]) -> str:
    return f"[{indices[0]}]" if len(indices) == 1 else f"[{indices[0]}..{indices[-1]}] ({len(indices)})"


# --- rule 7: GPU nodes per stack --------------------------------------------------------

GPU_AMI = re.compile(r"NVIDIA|GPU", re.IGNORECASE)


def _is_gpu(instance_types: Sequence[Any], ami_type: Any) -> bool | None:
    if (any(isinstance(t, str) and catalog.is_gpu_type(t) for t in instance_types)
            or (isinstance(ami_type, str) and GPU_AMI.search(ami_type))):
        return True
    return None if UNKNOWN in (*instance_types, ami_type) else False


def _gpu_node_groups(resources: Sequence[Resource], found: _Findings) -> Iterable[tuple[Resource, int]]:
    templates = [r for r in resources if r.type == LAUNCH_TEMPLATE]
    for r in resources:
        if r.type in (NODE_GROUP, EKS_MANAGED_NODE_GROUP):
            types = _items(r.props.get("instanceTypes"), f"{r.name}.instanceTypes", found)
            if not types and r.props.get("instanceTypes") is not UNKNOWN:
                launch = _get(r.props, "launchTemplate", "id")
                ids = [UNKNOWN] if launch is UNKNOWN else [launch]
                types = [t.props.get("instanceType")
                         for t in _resolve(r, "launchTemplate", ids, templates, found, f"{r.name}.launchTemplate")]
            gpu = _is_gpu(types, r.props.get("amiType"))
            if gpu is None:
                found.not_known(f"{r.name}.instanceTypes")
            if not gpu:
                continue
            size = _get(r.props, "scalingConfig", "maxSize")
            number = _number(size)
            if size is UNKNOWN:
                found.not_known(f"{r.name}.scalingConfig.maxSize")
            elif number is None:
                found.fail(Violation(f"GPU node group {r.name} has no scalingConfig.maxSize; set it", r.urn))
            else:
                yield r, int(number)
        elif r.type == INSTANCE:
            gpu = _is_gpu([r.props.get("instanceType")], None)
            if gpu is None:
                found.not_known(f"{r.name}.instanceType")
            elif gpu:
                yield r, 1


def max_gpu_nodes(resources: Sequence[Resource], config: Mapping[str, Any]) -> list[Violation]:
    """GPU nodes bill by the hour: the stack may grow to at most maxGpuNodes of them (node groups' maxSize)."""
    found = _Findings()
    limit = config["maxGpuNodes"]
    groups = list(_gpu_node_groups(resources, found))
    total = sum(n for _, n in groups)
    if total > limit:
        detail = ", ".join(f"{r.name}: {n}" for r, n in groups)
        found.fail(Violation(
            f"the stack can run {total} GPU nodes ({detail}), more than maxGpuNodes={limit}; lower the node "
            f"count or raise max-gpu-nodes.maxGpuNodes in the policy pack config for this stack",
            groups[0][0].urn if len(groups) == 1 else ""))
    return found.result()


# --- rule 8: node groups in private subnets ------------------------------------------------

def nodes_in_private_subnets(resources: Sequence[Resource], config: Mapping[str, Any]) -> list[Violation]:
    """Node groups only use subnets that do not hand out public IPs."""
    found = _Findings()
    subnets = [r for r in resources if r.type == SUBNET]
    for group in (r for r in resources if r.type in (NODE_GROUP, EKS_MANAGED_NODE_GROUP)):
        ids = group.props.get("subnetIds")
        ids = [UNKNOWN] if ids is UNKNOWN else list(ids or [])
        for subnet in _resolve(group, "subnetIds", ids, subnets, found, f"{group.name}.subnetIds"):
            value = subnet.props.get("mapPublicIpOnLaunch")
            if value is UNKNOWN:
                found.not_known(f"{subnet.name}.mapPublicIpOnLaunch")
            elif _truthy(value):
                found.fail(Violation(f"node group {group.name} uses subnet {subnet.name}, which maps public IPs on "
                                     "launch; put nodes in private subnets", group.urn))
    return found.result()


# --- the pack ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    kind: str  # "resource" or "stack"
    validate: Callable[..., list]
    settings: tuple[Setting, ...] = ()

    def config(self, raw: Mapping[str, Any] | None) -> dict[str, Any]:
        """The rule's settings: defaults overlaid with the pack config, each value checked."""
        raw = dict(raw or {})
        raw.pop("enforcementLevel", None)
        known = {s.name for s in self.settings}
        for name in raw:
            if name not in known:
                choices = ", ".join(sorted(known)) or "none"
                raise PolicyConfigError(f"policy pack config {self.name}.{name}: unknown setting; this policy takes: {choices}")
        return {s.name: _check_setting(self.name, s, raw.get(s.name, s.schema["default"])) for s in self.settings}

    def check(self, subject, raw_config: Mapping[str, Any] | None = None) -> list:
        """Run the rule: `subject` is (type, props) for a resource rule, a list of Resource for a stack rule."""
        config = self.config(raw_config)
        if self.kind == "resource":
            resource_type, props = subject
            return self.validate(resource_type, props, config)
        return self.validate(subject, config)


DEFAULT_MAX_GPU_NODES = 4

RULES: tuple[Rule, ...] = (
    Rule("imdsv2-required",
         "Launch templates and instances require IMDSv2 tokens with a hop limit of 1; node groups use a launch template.",
         "resource", imdsv2_required,
         (Setting("maxHopLimit", {"type": "integer", "minimum": 1, "maximum": 64, "default": 1},
                  "the largest httpPutResponseHopLimit allowed (1 keeps pods away from node credentials)"),)),
    Rule("no-public-ip-on-nodes",
         "Nodes get no public IP address.", "resource", no_public_ip_on_nodes),
    Rule("eks-endpoint-restricted",
         "A public EKS API endpoint lists its allowed CIDRs and none of them is 0.0.0.0/0.",
         "resource", eks_endpoint_restricted),
    Rule("ray-not-exposed",
         "Nothing of Ray is reachable from outside the cluster: no LoadBalancer, NodePort or Ingress for Ray "
         "or in the Ray namespace.",
         "resource", ray_not_exposed,
         (Setting("rayNamespaces", {"type": "array", "items": {"type": "string"}, "minItems": 1, "default": ["ray"]},
                  "give the namespaces that run Ray, e.g. [\"ray\"]"),)),
    Rule("images-by-digest",
         "Every container image in a pod spec is pinned by digest (repository@sha256:<64 hex>).",
         "resource", images_by_digest),
    Rule("efa-security-group-self-rules",
         "Each EFA interface carries a security group allowing all traffic from and to itself (both directions).",
         "stack", efa_security_group_self_rules),
    Rule("max-gpu-nodes",
         "The stack runs at most maxGpuNodes GPU nodes (sum of the GPU node groups' maxSize).",
         "stack", max_gpu_nodes,
         (Setting("maxGpuNodes", {"type": "integer", "minimum": 0, "maximum": 1000, "default": DEFAULT_MAX_GPU_NODES},
                  f"set the largest number of GPU nodes this stack may run (default {DEFAULT_MAX_GPU_NODES})"),)),
    Rule("nodes-in-private-subnets",
         "Node groups only use subnets that do not map public IPs on launch.",
         "stack", nodes_in_private_subnets),
    Rule("ray-pods-least-privileged",
         "Ray containers drop all Linux capabilities, cannot escalate privileges and run under a seccomp profile.",
         "resource", ray_pods_least_privileged),
    Rule("ray-namespace-default-deny",
         "A RayCluster's namespace has a NetworkPolicy that denies all ingress by default.",
         "stack", ray_namespace_default_deny),
)

BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}
