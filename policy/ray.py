"""Rules on Ray: nothing of it reachable from outside the cluster, its pods least-privileged, its namespace
denying ingress by default."""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from facts import ray as ray_facts
from policy.model import (
    HELM_RELEASE,
    INGRESS_TYPES,
    NETWORK_POLICY,
    RAY_CLUSTER_SPECS,
    SERVICE,
    UNKNOWN,
    Findings,
    Resource,
    Violation,
    as_number,
    elements,
    get,
    truthy,
)

EXPOSED_SERVICE_TYPES = ("LoadBalancer", "NodePort")
# GCS, dashboard + Jobs API, Ray client (the head's ports), and Serve.
RAY_PORTS = frozenset({*ray_facts.HEAD_PORTS.values(), 8000})
RAY_PORT_NAMES = frozenset({*ray_facts.HEAD_PORTS, "gcs", "ray-client", "serve"})
WHY_RAY = ("Ray's dashboard and Jobs API run arbitrary code for whoever reaches them (ShadowRay, CVE-2023-48022); "
           "keep it ClusterIP and use kubectl port-forward")


def _namespace(props: Mapping[str, Any]) -> Any:
    namespace = get(props, "metadata", "namespace")
    return "default" if namespace is None else namespace


def _is_ray_port(port: Any) -> bool:
    if isinstance(port, str):
        return port in RAY_PORT_NAMES or (port.isdigit() and int(port) in RAY_PORTS)
    number = as_number(port)
    return number is not None and int(number) in RAY_PORTS


def _service_is_ray(spec: Mapping[str, Any], found: Findings) -> bool:
    selector = spec.get("selector")
    if selector is UNKNOWN:
        found.not_known("spec.selector")
    elif isinstance(selector, Mapping) and any(str(k).startswith("ray.io/") for k in selector):
        return True
    for port in elements(spec.get("ports"), "spec.ports", found):
        if isinstance(port, Mapping) and any(_is_ray_port(port.get(k)) for k in ("port", "targetPort", "name")):
            return True
    return False


def _check_service(props: Mapping[str, Any], ray_namespaces: tuple[str, ...], found: Findings) -> None:
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


def _ingress_backends(spec: Mapping[str, Any], found: Findings) -> Iterable[tuple[Any, Any]]:
    """(service name, port number or name) of every backend, v1 and v1beta1 spellings."""
    backends = [spec.get("defaultBackend"), spec.get("backend")]
    for i, rule in enumerate(elements(spec.get("rules"), "spec.rules", found)):
        for path in elements(get(rule, "http", "paths"), f"spec.rules[{i}].http.paths", found):
            backends.append(get(path, "backend"))
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


def _check_ingress(props: Mapping[str, Any], ray_namespaces: tuple[str, ...], found: Findings) -> None:
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


def _check_ray_cluster_spec(spec: Any, where: str, found: Findings) -> None:
    if spec is UNKNOWN:
        found.not_known(where)
        return
    head = f"{where}.headGroupSpec"
    checks = {
        "serviceType": lambda v: v in EXPOSED_SERVICE_TYPES,
        "headService.spec.type": lambda v: v in EXPOSED_SERVICE_TYPES,
        "enableIngress": truthy,
    }
    for path, exposes in checks.items():
        value = get(spec, "headGroupSpec", *path.split("."))
        if value is UNKNOWN:
            found.not_known(f"{head}.{path}")
        elif exposes(value):
            also = " (KubeRay creates an Ingress to the head)" if path == "enableIngress" else ""
            found.fail(f"{head}.{path} is {'true' if value is True else value}{also}: {WHY_RAY}")


def _exposing_values(values: Any, found: Findings, path: str = "values") -> Iterable[str]:
    """Paths in Helm values that ask for a LoadBalancer/NodePort service or an ingress."""
    if values is UNKNOWN:
        found.not_known(path)
    elif isinstance(values, Mapping):
        for key, value in values.items():
            here = f"{path}.{key}"
            if key in ("type", "serviceType") and value in EXPOSED_SERVICE_TYPES:
                yield f"{here}={value}"
            elif key == "enableIngress" and truthy(value):
                yield f"{here}=true"
            elif key == "ingress" and isinstance(value, Mapping) and truthy(value.get("enabled")):
                yield f"{here}.enabled=true"
            else:
                yield from _exposing_values(value, found, here)
    elif isinstance(values, list):
        for i, value in enumerate(values):
            yield from _exposing_values(value, found, f"{path}[{i}]")


def ray_not_exposed(resource_type: str, props: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """No LoadBalancer, NodePort or Ingress reaches Ray, nor anything in the Ray namespace."""
    found = Findings()
    ray_namespaces = config["rayNamespaces"]
    if resource_type == SERVICE:
        _check_service(props, ray_namespaces, found)
    elif resource_type in INGRESS_TYPES:
        _check_ingress(props, ray_namespaces, found)
    elif resource_type in RAY_CLUSTER_SPECS:
        path = RAY_CLUSTER_SPECS[resource_type]
        _check_ray_cluster_spec(get(props, *path), ".".join(path), found)
        if resource_type == "kubernetes:ray.io/v1:RayService":
            serve_type = get(props, "spec", "serveService", "spec", "type")
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


# --- Ray pods run least-privileged ----------------------------------------------------

SECCOMP_CONFINED = ("RuntimeDefault", "Localhost")


def _ray_pod_templates(spec: Any, where: str, found: "Findings") -> Iterable[tuple[str, Any]]:
    if spec is UNKNOWN:
        found.not_known(where)
        return
    yield f"{where}.headGroupSpec.template.spec", get(spec, "headGroupSpec", "template", "spec")
    for i, group in enumerate(elements(get(spec, "workerGroupSpecs"), f"{where}.workerGroupSpecs", found)):
        yield f"{where}.workerGroupSpecs[{i}].template.spec", get(group, "template", "spec")


def _check_container_privileges(container: Any, where: str, found: "Findings") -> None:
    security = get(container, "securityContext")
    if security is UNKNOWN:
        found.not_known(f"{where}.securityContext")
        return
    security = security if isinstance(security, Mapping) else {}
    drop, add = get(security, "capabilities", "drop"), get(security, "capabilities", "add")
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
    found = Findings()
    path = RAY_CLUSTER_SPECS[resource_type]
    spec = get(props, *path)
    where = ".".join(path)
    for pod_path, pod in _ray_pod_templates(spec, where, found):
        if pod is UNKNOWN:
            found.not_known(pod_path)
            continue
        seccomp = get(pod, "securityContext", "seccompProfile", "type")
        for i, container in enumerate(elements(get(pod, "containers"), f"{pod_path}.containers", found)):
            own = get(container, "securityContext", "seccompProfile", "type")
            if UNKNOWN in (seccomp, own):
                found.not_known(f"{pod_path}.securityContext.seccompProfile")
            elif (own or seccomp) not in SECCOMP_CONFINED:
                found.fail(f"{pod_path}.containers[{i}]: no seccomp profile (set the pod's "
                           "securityContext.seccompProfile.type to RuntimeDefault)")
            _check_container_privileges(container, f"{pod_path}.containers[{i}]", found)
    if spec is not UNKNOWN and get(spec, "autoscalerOptions") not in (None, UNKNOWN):
        _check_container_privileges(get(spec, "autoscalerOptions"), f"{where}.autoscalerOptions", found)
    return found.result()


def _denies_all_ingress(policy: Resource) -> bool | None:
    spec = get(policy.props, "spec")
    if spec is UNKNOWN:
        return None
    selector, types, ingress = (get(spec, "podSelector"), get(spec, "policyTypes"), get(spec, "ingress"))
    if UNKNOWN in (selector, types, ingress):
        return None
    return selector in ({}, None) and "Ingress" in (types or []) and not ingress


def ray_namespace_default_deny(resources: Sequence[Resource], config: Mapping[str, Any]) -> list[Violation]:
    """The Jobs API is remote code execution behind a token: inside the cluster only Ray's own pods reach it."""
    found = Findings()
    clusters = [r for r in resources if r.type in RAY_CLUSTER_SPECS]
    policies = [r for r in resources if r.type == NETWORK_POLICY]
    for cluster in clusters:
        namespace = get(cluster.props, "metadata", "namespace")
        if namespace is UNKNOWN:
            found.not_known(f"{cluster.name}.metadata.namespace")
            continue
        verdicts = [_denies_all_ingress(p) for p in policies
                    if get(p.props, "metadata", "namespace") in (namespace, UNKNOWN)]
        if True in verdicts:
            continue
        if None in verdicts:
            found.not_known(f"NetworkPolicies of namespace {namespace}")
            continue
        found.fail(Violation(f"{cluster.type} {cluster.name}: namespace {namespace!r} has no NetworkPolicy denying "
                             "all ingress by default (podSelector {}, policyTypes [Ingress], no rules); every pod of "
                             "the cluster can reach the Ray Jobs API", cluster.urn))
    return found.result()
