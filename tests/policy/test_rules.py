"""Each rule of the policy pack on hand-built resources: compliant and violating cases."""
from __future__ import annotations

import copy

import pytest

from policy import model, rules
from policy.model import UNKNOWN, PolicyConfigError, Resource
from tests.guards import nonempty

from . import rule_named

DIGEST = "public.ecr.aws/deep-learning-containers/ray@sha256:" + "0123456789abcdef" * 4


def check(rule: str, resource_type: str, props: dict, **config) -> list[str]:
    return rule_named(rule).check((resource_type, props), config)


# --- imdsv2-required ---------------------------------------------------------------

GOOD_METADATA = {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1.0}


@pytest.mark.parametrize("resource_type", [model.LAUNCH_TEMPLATE, model.INSTANCE])
def test_imdsv2_accepts_tokens_required_and_one_hop(resource_type):
    assert check("imdsv2-required", resource_type, {"metadataOptions": GOOD_METADATA}) == []
    assert check("imdsv2-required", resource_type, {"metadataOptions": {"httpEndpoint": "disabled"}}) == []


@pytest.mark.parametrize("options, expected", [
    (None, "metadataOptions is not set"),
    ({**GOOD_METADATA, "httpTokens": "optional"}, "httpTokens is 'optional'"),
    ({"httpTokens": "required"}, "httpPutResponseHopLimit is None"),
    ({**GOOD_METADATA, "httpPutResponseHopLimit": 2}, "httpPutResponseHopLimit is 2"),
])
def test_imdsv2_violations(options, expected):
    props = {} if options is None else {"metadataOptions": options}
    (message,) = check("imdsv2-required", model.LAUNCH_TEMPLATE, props)
    assert expected in message


def test_imdsv2_hop_limit_is_configurable():
    props = {"metadataOptions": {**GOOD_METADATA, "httpPutResponseHopLimit": 2}}
    assert check("imdsv2-required", model.LAUNCH_TEMPLATE, props, maxHopLimit=2) == []


def test_imdsv2_node_group_needs_a_launch_template():
    assert check("imdsv2-required", model.NODE_GROUP, {"launchTemplate": {"id": "lt-1", "version": "1"}}) == []
    (message,) = check("imdsv2-required", model.NODE_GROUP, {"instanceTypes": ["m7i.xlarge"]})
    assert "no launchTemplate" in message


def test_imdsv2_unknown_tokens_cannot_be_decided_but_known_violations_still_report():
    with pytest.raises(model.Unknown, match="metadataOptions.httpTokens"):
        check("imdsv2-required", model.LAUNCH_TEMPLATE, {"metadataOptions": {**GOOD_METADATA, "httpTokens": UNKNOWN}})
    (message,) = check("imdsv2-required", model.LAUNCH_TEMPLATE,
                       {"metadataOptions": {"httpTokens": UNKNOWN, "httpPutResponseHopLimit": 3}})
    assert "httpPutResponseHopLimit is 3" in message


# --- no-public-ip-on-nodes ---------------------------------------------------------

def test_no_public_ip_on_launch_template_interfaces():
    private = {"networkInterfaces": [{"interfaceType": "efa", "associatePublicIpAddress": "false"}]}
    assert check("no-public-ip-on-nodes", model.LAUNCH_TEMPLATE, private) == []
    assert check("no-public-ip-on-nodes", model.LAUNCH_TEMPLATE, {}) == []
    for public in ("true", True):
        props = {"networkInterfaces": [private["networkInterfaces"][0],
                                       {"deviceIndex": 1, "associatePublicIpAddress": public}]}
        (message,) = check("no-public-ip-on-nodes", model.LAUNCH_TEMPLATE, props)
        assert "networkInterfaces[1].associatePublicIpAddress" in message


def test_no_public_ip_on_instances():
    assert check("no-public-ip-on-nodes", model.INSTANCE, {"associatePublicIpAddress": False}) == []
    (message,) = check("no-public-ip-on-nodes", model.INSTANCE, {"associatePublicIpAddress": True})
    assert "public IP" in message


# --- eks-endpoint-restricted ---------------------------------------------------------

def cluster(**vpc) -> dict:
    return {"vpcConfig": {"subnetIds": ["subnet-1"], "endpointPrivateAccess": True, **vpc}}


@pytest.mark.parametrize("props", [
    cluster(endpointPublicAccess=True, publicAccessCidrs=["203.0.113.10/32", "198.51.100.0/24"]),
    cluster(endpointPublicAccess=False),
    cluster(endpointPublicAccess=False, publicAccessCidrs=["0.0.0.0/0"]),
])
def test_eks_endpoint_compliant(props):
    assert check("eks-endpoint-restricted", model.EKS_CLUSTER, props) == []


@pytest.mark.parametrize("props, expected", [
    (cluster(endpointPublicAccess=True, publicAccessCidrs=["203.0.113.10/32", "0.0.0.0/0"]), "publicAccessCidrs[1] is 0.0.0.0/0"),
    (cluster(endpointPublicAccess=True, publicAccessCidrs=["::/0"]), "open to the whole internet"),
    (cluster(endpointPublicAccess=True), "publicAccessCidrs is empty"),
    (cluster(), "publicAccessCidrs is empty"),  # public access is AWS's default
    (cluster(endpointPublicAccess=True, publicAccessCidrs=["office"]), "not a CIDR"),
])
def test_eks_endpoint_violations(props, expected):
    (message,) = check("eks-endpoint-restricted", model.EKS_CLUSTER, props)
    assert expected in message


def test_eks_endpoint_of_the_pulumi_eks_component():
    assert check("eks-endpoint-restricted", model.EKS_COMPONENT_CLUSTER,
                 {"endpointPublicAccess": True, "publicAccessCidrs": ["203.0.113.10/32"]}) == []
    assert check("eks-endpoint-restricted", model.EKS_COMPONENT_CLUSTER,
                 {"endpointPublicAccess": True, "publicAccessCidrs": ["0.0.0.0/0"]})


# --- ray-not-exposed -------------------------------------------------------------------

def service(namespace="ray", kind=None, selector=None, ports=None, **spec) -> dict:
    body = {"selector": selector or {"app": "web"}, "ports": ports or [{"name": "http", "port": 80}], **spec}
    if kind:
        body["type"] = kind
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc", "namespace": namespace}, "spec": body}


RAY_SELECTOR = {"ray.io/cluster": "raytrain", "ray.io/node-type": "head"}


@pytest.mark.parametrize("props", [
    service("ray"),                                     # ClusterIP by default
    service("ray", "ClusterIP", RAY_SELECTOR, [{"name": "dashboard", "port": 8265}]),
    service("web", "LoadBalancer"),                     # not Ray, not in the Ray namespace
    service("web", "NodePort", ports=[{"name": "https", "port": 443}]),
])
def test_services_that_do_not_expose_ray(props):
    assert check("ray-not-exposed", model.SERVICE, props) == []


@pytest.mark.parametrize("props, expected", [
    (service("ray", "LoadBalancer"), "LoadBalancer in the Ray namespace 'ray'"),
    (service("ray", "NodePort"), "NodePort in the Ray namespace"),
    (service("default", "LoadBalancer", RAY_SELECTOR), "selecting Ray pods"),
    (service("tools", "NodePort", ports=[{"name": "x", "port": 8265}]), "selecting Ray pods or ports"),
    (service("tools", "LoadBalancer", ports=[{"name": "client", "port": 443}]), "LoadBalancer"),
    (service("ray", "ClusterIP", externalIPs=["198.51.100.7"]), "externalIPs"),
])
def test_services_that_expose_ray(props, expected):
    (message,) = check("ray-not-exposed", model.SERVICE, props)
    assert expected in message and "port-forward" in message


def test_the_ray_namespaces_are_configurable():
    props = service("training", "LoadBalancer")
    assert check("ray-not-exposed", model.SERVICE, props) == []
    assert check("ray-not-exposed", model.SERVICE, props, rayNamespaces=["ray", "training"])


def ingress(namespace, name, port) -> dict:
    return {"metadata": {"name": "ing", "namespace": namespace}, "spec": {"rules": [{"host": "x.example.com", "http": {
        "paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": name, "port": port}}}]}}]}}


INGRESS = "kubernetes:networking.k8s.io/v1:Ingress"


def test_ingress_to_other_services_is_fine():
    assert check("ray-not-exposed", INGRESS, ingress("web", "frontend", {"number": 80})) == []


@pytest.mark.parametrize("props", [
    ingress("web", "raytrain-head-svc", {"number": 80}),
    ingress("web", "proxy", {"number": 8265}),
    ingress("web", "proxy", {"name": "dashboard"}),
    ingress("ray", "anything", {"number": 80}),
    {"metadata": {"namespace": "web"}, "spec": {"defaultBackend": {"service": {"name": "raytrain-head-svc",
                                                                               "port": {"number": 10001}}}}},
])
def test_ingress_to_ray_is_refused(props):
    (message,) = check("ray-not-exposed", INGRESS, props)
    assert "Ray" in message


def test_legacy_ingress_backend_spelling():
    props = {"metadata": {"namespace": "web"}, "spec": {"backend": {"serviceName": "x", "servicePort": 8265}}}
    assert check("ray-not-exposed", "kubernetes:extensions/v1beta1:Ingress", props)


RAY_CLUSTER = "kubernetes:ray.io/v1:RayCluster"


LEAST_PRIVILEGE = {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}


def ray_cluster(**head) -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "raytrain", "namespace": "ray"},
            "spec": {"headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"},
                                       "template": {"spec": {
                                           "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                                           "containers": [{"name": "ray-head", "image": DIGEST,
                                                           "securityContext": dict(LEAST_PRIVILEGE)}]}},
                                       **head}}}


def test_ray_cluster_head_service_cluster_ip_with_dashboard_host_is_fine():
    assert check("ray-not-exposed", RAY_CLUSTER, ray_cluster(serviceType="ClusterIP")) == []
    assert check("ray-not-exposed", RAY_CLUSTER, ray_cluster()) == []


@pytest.mark.parametrize("head, expected", [
    ({"serviceType": "LoadBalancer"}, "headGroupSpec.serviceType is LoadBalancer"),
    ({"serviceType": "NodePort"}, "headGroupSpec.serviceType is NodePort"),
    ({"headService": {"spec": {"type": "LoadBalancer"}}}, "headService.spec.type is LoadBalancer"),
    ({"enableIngress": True}, "enableIngress is true"),
])
def test_ray_cluster_head_exposed(head, expected):
    (message,) = check("ray-not-exposed", RAY_CLUSTER, ray_cluster(**head))
    assert expected in message


def test_ray_job_and_ray_service_embed_a_cluster_spec():
    job = {"spec": {"entrypoint": "python train.py", "rayClusterSpec": ray_cluster(serviceType="NodePort")["spec"]}}
    (message,) = check("ray-not-exposed", "kubernetes:ray.io/v1:RayJob", job)
    assert "spec.rayClusterSpec.headGroupSpec.serviceType is NodePort" in message
    serve = {"spec": {"rayClusterConfig": ray_cluster()["spec"], "serveService": {"spec": {"type": "LoadBalancer"}}}}
    (message,) = check("ray-not-exposed", "kubernetes:ray.io/v1:RayService", serve)
    assert "serveService" in message


def test_helm_releases_for_ray_keep_services_internal():
    operator = {"name": "kuberay-operator", "chart": "kuberay-operator", "namespace": "kuberay-system",
                "values": {"service": {"type": "ClusterIP"}}}
    assert check("ray-not-exposed", model.HELM_RELEASE, operator) == []
    exposed = copy.deepcopy(operator)
    exposed["values"]["service"]["type"] = "LoadBalancer"
    (message,) = check("ray-not-exposed", model.HELM_RELEASE, exposed)
    assert "values.service.type=LoadBalancer" in message
    in_ray_ns = {"name": "dash", "chart": "grafana", "namespace": "ray", "values": {"ingress": {"enabled": True}}}
    (message,) = check("ray-not-exposed", model.HELM_RELEASE, in_ray_ns)
    assert "values.ingress.enabled=true" in message
    unrelated = {"name": "web", "chart": "nginx", "namespace": "web", "values": {"service": {"type": "LoadBalancer"}}}
    assert check("ray-not-exposed", model.HELM_RELEASE, unrelated) == []


def test_ray_service_with_unknown_type_is_undecided():
    with pytest.raises(model.Unknown, match="spec.type"):
        check("ray-not-exposed", model.SERVICE, service("ray", UNKNOWN))


# --- images-by-digest --------------------------------------------------------------------

def deployment(*images, init=()) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": {"spec": {
        "initContainers": [{"name": f"init{i}", "image": im} for i, im in enumerate(init)],
        "containers": [{"name": f"c{i}", "image": im} for i, im in enumerate(images)]}}}}


def test_images_by_digest_compliant():
    assert check("images-by-digest", "kubernetes:apps/v1:Deployment", deployment(DIGEST, init=[DIGEST])) == []
    tagged_and_digested = DIGEST.replace("/ray@", "/ray:train-ml-cuda-v1.1@")
    assert check("images-by-digest", "kubernetes:core/v1:Pod",
                 {"spec": {"containers": [{"name": "x", "image": tagged_and_digested}]}}) == []
    assert check("images-by-digest", model.LAUNCH_TEMPLATE, {"imageId": "ami-123"}) == []


@pytest.mark.parametrize("image", [
    "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1",
    "busybox",
    "repo@sha256:" + "0" * 63,
    "repo@sha256:" + "A" * 64,
    "repo@sha512:" + "0" * 64,
    None,
])
def test_images_not_by_digest(image):
    (message,) = check("images-by-digest", "kubernetes:apps/v1:Deployment", deployment(DIGEST, init=[image]))
    assert "spec.template.spec.initContainers[0] (init0)" in message and "not pinned by digest" in message


def test_images_in_every_ray_cluster_pod_template():
    body = ray_cluster()
    body["spec"]["workerGroupSpecs"] = [{"groupName": "gpu", "template": {"spec": {"containers": [
        {"name": "ray-worker", "image": "rayproject/ray:2.58.0"}]}}}]
    (message,) = check("images-by-digest", RAY_CLUSTER, body)
    assert "spec.workerGroupSpecs[0].template.spec.containers[0] (ray-worker)" in message
    cron = {"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x:1"}]}}}}}}
    assert check("images-by-digest", "kubernetes:batch/v1:CronJob", cron)


def test_unknown_image_is_checked_at_up_time():
    with pytest.raises(model.Unknown):
        check("images-by-digest", RAY_CLUSTER, {"spec": {"headGroupSpec": {"template": {"spec": {
            "containers": [{"name": "ray-head", "image": UNKNOWN}]}}}}})


# --- stack rules: EFA self rules ---------------------------------------------------------------

def efa_stack(*, ingress=True, egress=True, rule_style="vpc", known_ids=True) -> list[Resource]:
    """A GPU launch template with an EFA interface, the cluster SG and the EFA SG with its rules.

    known_ids=False is a first preview: IDs are unknown, references resolve through property dependencies.
    """
    sg_id = "sg-efa" if known_ids else UNKNOWN
    group = Resource(model.SECURITY_GROUP, "gpu-efa", {"vpcId": "vpc-1"}, "urn:sg", sg_id)
    template = Resource(model.LAUNCH_TEMPLATE, "gpu-lt", {"networkInterfaces": [{
        "interfaceType": "efa", "deviceIndex": 0, "networkCardIndex": 0,
        "securityGroups": ["sg-cluster", sg_id]}]}, "urn:lt", "lt-1", {"networkInterfaces": ("urn:cluster", "urn:sg")})
    refs = {"securityGroupId": ("urn:sg",), "referencedSecurityGroupId": ("urn:sg",), "sourceSecurityGroupId": ("urn:sg",)}
    stack = [group, template]
    for direction, wanted in (("ingress", ingress), ("egress", egress)):
        if not wanted:
            continue
        if rule_style == "vpc":
            typ = model.VPC_INGRESS if direction == "ingress" else model.VPC_EGRESS
            stack.append(Resource(typ, f"efa-{direction}", {"securityGroupId": sg_id, "referencedSecurityGroupId": sg_id,
                                                          "ipProtocol": "-1"}, f"urn:{direction}", None, refs))
        elif rule_style == "ec2":
            stack.append(Resource(model.SG_RULE, f"efa-{direction}", {"type": direction, "securityGroupId": sg_id,
                                                                     "self": True, "protocol": "all", "fromPort": 0,
                                                                     "toPort": 0}, f"urn:{direction}", None, refs))
        else:
            stack[0] = Resource(group.type, group.name, {**stack[0].props, direction: [
                {"protocol": "-1", "self": True, "fromPort": 0, "toPort": 0}]}, group.urn, group.id)
    return stack


def efa(stack, **config):
    return rule_named("efa-security-group-self-rules").check(stack, config)


@pytest.mark.parametrize("style", ["vpc", "ec2", "inline"])
@pytest.mark.parametrize("known_ids", [True, False])
def test_efa_group_with_both_self_rules(style, known_ids):
    assert efa(efa_stack(rule_style=style, known_ids=known_ids)) == []


@pytest.mark.parametrize("style", ["vpc", "ec2", "inline"])
@pytest.mark.parametrize("known_ids", [True, False])
def test_efa_group_missing_the_outbound_self_rule(style, known_ids):
    (violation,) = efa(efa_stack(egress=False, rule_style=style, known_ids=known_ids))
    assert "lacks the all-traffic egress rule" in violation.message and violation.urn == "urn:sg"


def test_efa_group_missing_both_directions():
    (violation,) = efa(efa_stack(ingress=False, egress=False))
    assert "egress and ingress" in violation.message


def test_efa_rules_must_cover_all_protocols_and_reference_the_group_itself():
    stack = efa_stack()
    tcp_only = Resource(model.VPC_EGRESS, "efa-egress", {**stack[3].props, "ipProtocol": "tcp"}, "urn:egress")
    assert "egress" in efa([*stack[:3], tcp_only])[0].message
    to_world = Resource(model.VPC_EGRESS, "efa-egress", {"securityGroupId": "sg-efa", "cidrIpv4": "0.0.0.0/0",
                                                         "ipProtocol": "-1"}, "urn:egress")
    assert "egress" in efa([*stack[:3], to_world])[0].message


def test_efa_interface_with_only_groups_from_outside_the_stack():
    template = Resource(model.LAUNCH_TEMPLATE, "gpu-lt", {"networkInterfaces": [{
        "interfaceType": "efa-only", "securityGroups": ["sg-cluster"]}]}, "urn:lt")
    (violation,) = efa([template])
    assert "not declared in this stack (sg-cluster)" in violation.message


def test_efa_unresolvable_unknown_groups_are_undecided_and_non_efa_templates_are_ignored():
    template = Resource(model.LAUNCH_TEMPLATE, "gpu-lt", {"networkInterfaces": [{
        "interfaceType": "efa", "securityGroups": UNKNOWN}]}, "urn:lt")
    with pytest.raises(model.Unknown):
        efa([template])
    plain = Resource(model.LAUNCH_TEMPLATE, "system-lt", {"networkInterfaces": [{"securityGroups": ["sg-1"]}]})
    assert efa([plain]) == []


# --- stack rules: GPU nodes ---------------------------------------------------------------------

def node_group(name, instance_type, max_size, ami="AL2023_x86_64_STANDARD", **extra) -> Resource:
    props = {"instanceTypes": [instance_type] if instance_type else [], "amiType": ami,
             "scalingConfig": {"minSize": 1.0, "desiredSize": float(max_size), "maxSize": float(max_size)}, **extra}
    return Resource(model.NODE_GROUP, name, props, f"urn:{name}", f"{name}-id")


def gpus(stack, **config):
    return rule_named("max-gpu-nodes").check(stack, config)


def test_gpu_nodes_within_the_default_cap():
    assert rules.DEFAULT_MAX_GPU_NODES == 4
    stack = [node_group("system", "m7i.xlarge", 10), node_group("gpu", "g6.12xlarge", 4, "AL2023_x86_64_NVIDIA")]
    assert gpus(stack) == []


def test_gpu_nodes_over_the_cap_count_every_gpu_group_and_instance():
    stack = [node_group("system", "m7i.xlarge", 10), node_group("gpu", "g6.12xlarge", 2),
             node_group("p5", "p5.48xlarge", 2),
             Resource(model.INSTANCE, "debug-box", {"instanceType": "g5.xlarge"}, "urn:debug")]
    (violation,) = gpus(stack)
    assert "can run 5 GPU nodes (gpu: 2, p5: 2, debug-box: 1), more than maxGpuNodes=4" in violation.message
    assert gpus(stack, maxGpuNodes=5) == []


@pytest.mark.parametrize("group", [
    node_group("g", "p6-b200.48xlarge", 3),
    node_group("g", "gr6.4xlarge", 3),
    node_group("g", None, 3, "BOTTLEROCKET_x86_64_NVIDIA"),
    node_group("g", None, 3, "AL2_x86_64_GPU"),
])
def test_gpu_node_groups_are_recognised_by_family_or_ami(group):
    assert gpus([group], maxGpuNodes=2)


def test_gpu_type_from_the_launch_template_of_the_node_group():
    template = Resource(model.LAUNCH_TEMPLATE, "lt", {"instanceType": "p5.48xlarge"}, "urn:lt", "lt-1")
    group = node_group("g", None, 3, launchTemplate={"id": "lt-1", "version": "1"})
    assert gpus([template, group], maxGpuNodes=2)
    assert gpus([Resource(template.type, "lt", {"instanceType": "m7i.large"}, "urn:lt", "lt-1"), group],
                maxGpuNodes=2) == []


def test_gpu_cap_with_unknown_size_is_undecided():
    group = node_group("g", "g6.12xlarge", 1)
    group.props["scalingConfig"]["maxSize"] = UNKNOWN
    with pytest.raises(model.Unknown):
        gpus([group])


# --- stack rules: private subnets -----------------------------------------------------------------

def test_node_groups_only_in_subnets_without_public_ips():
    private = Resource(model.SUBNET, "private-a", {"mapPublicIpOnLaunch": False}, "urn:a", "subnet-a")
    public = Resource(model.SUBNET, "public-a", {"mapPublicIpOnLaunch": True}, "urn:b", "subnet-b")
    group = node_group("system", "m7i.xlarge", 1, subnetIds=["subnet-a"])
    check_subnets = rule_named("nodes-in-private-subnets").check
    assert check_subnets([private, public, group]) == []
    group.props["subnetIds"].append("subnet-b")
    (violation,) = check_subnets([private, public, group])
    assert "uses subnet public-a, which maps public IPs" in violation.message and violation.urn == "urn:system"
    unknown_ids = Resource(group.type, "g2", {"subnetIds": [UNKNOWN]}, "urn:g2", None, {"subnetIds": ("urn:b",)})
    assert check_subnets([private, public, unknown_ids])


# --- configuration ------------------------------------------------------------------------------------

def test_every_setting_has_a_valid_default_and_a_schema_type():
    for rule in nonempty(rules.RULES, "rules of the pack"):
        for setting in rule.settings:
            assert setting.schema["type"] in ("integer", "array")
        assert set(rule.config({})) == {s.name for s in rule.settings}


@pytest.mark.parametrize("rule, config, expected", [
    ("max-gpu-nodes", {"maxGpuNodes": "four"}, "max-gpu-nodes.maxGpuNodes: 'four' is not a whole number"),
    ("max-gpu-nodes", {"maxGpuNodes": -1}, "max-gpu-nodes.maxGpuNodes: -1 is out of range"),
    ("max-gpu-nodes", {"maxGpuNodes": 2.5}, "is not a whole number"),
    ("max-gpu-nodes", {"maxGPUNodes": 2}, "max-gpu-nodes.maxGPUNodes: unknown setting; this policy takes: maxGpuNodes"),
    ("ray-not-exposed", {"rayNamespaces": "ray"}, "rayNamespaces: 'ray' is not a non-empty list"),
    ("ray-not-exposed", {"rayNamespaces": []}, "is not a non-empty list"),
    ("imdsv2-required", {"maxHopLimit": 0}, "maxHopLimit: 0 is out of range; set a whole number from 1 to 64"),
])
def test_bad_config_names_the_setting_and_the_fix(rule, config, expected):
    with pytest.raises(PolicyConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        rule_named(rule).config(config)


def test_config_from_the_engine_integer_floats_and_enforcement_level_are_accepted():
    assert rule_named("max-gpu-nodes").config({"maxGpuNodes": 2.0, "enforcementLevel": "advisory"}) == {"maxGpuNodes": 2}


# --- images-by-digest: the Helm releases' images --------------------------------------------------------

HELM = "kubernetes:helm.sh/v3:Release"


def test_a_helm_release_image_pinned_by_digest_passes():
    values = {"image": {"repository": "quay.io/kuberay/operator", "tag": "v1.7.0@sha256:" + "ab" * 32}}
    assert check("images-by-digest", HELM, {"chart": "kuberay-operator", "values": values}) == []


@pytest.mark.parametrize("values, says", [
    ({}, "values.image is not set"),
    ({"image": {"repository": "quay.io/kuberay/operator", "tag": "v1.7.0"}}, "'v1.7.0' is not pinned by digest"),
    ({"image": {"repository": "nvcr.io/nvidia/k8s-device-plugin"}}, "None is not pinned by digest"),
])
def test_a_helm_release_image_by_tag_only_is_refused(values, says):
    (message,) = check("images-by-digest", HELM, {"chart": "x", "values": values})
    assert says in message


# --- ray-pods-least-privileged -----------------------------------------------------------------------------

def test_least_privileged_ray_pods_pass():
    assert check("ray-pods-least-privileged", RAY_CLUSTER, ray_cluster()) == []
    assert check("ray-pods-least-privileged", "kubernetes:apps/v1:Deployment", {"spec": {}}) == []


@pytest.mark.parametrize("change, says", [
    (lambda c: c["securityContext"].pop("capabilities"), "capabilities must drop ALL"),
    (lambda c: c["securityContext"].update(capabilities={"drop": ["ALL"], "add": ["IPC_LOCK"]}), "add none"),
    (lambda c: c["securityContext"].update(allowPrivilegeEscalation=True), "allowPrivilegeEscalation false"),
    (lambda c: c.pop("securityContext"), "capabilities must drop ALL"),
])
def test_a_ray_container_with_privileges_is_refused(change, says):
    body = ray_cluster()
    change(body["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0])
    messages = check("ray-pods-least-privileged", RAY_CLUSTER, body)
    assert any(says in m for m in messages), messages


def test_a_ray_pod_without_a_seccomp_profile_is_refused_and_the_autoscaler_is_checked_too():
    body = ray_cluster()
    del body["spec"]["headGroupSpec"]["template"]["spec"]["securityContext"]
    body["spec"]["autoscalerOptions"] = {"securityContext": {"allowPrivilegeEscalation": False}}
    messages = check("ray-pods-least-privileged", RAY_CLUSTER, body)
    assert any("no seccomp profile" in m for m in messages)
    assert any(m.startswith("spec.autoscalerOptions: capabilities must drop ALL") for m in messages)


def test_the_programs_rayclusters_are_least_privileged_in_a_default_deny_namespace(plans):
    rule = next(r for r in rules.RULES if r.name == "ray-namespace-default-deny")
    for name, plan in nonempty(plans.items(), "plans"):
        (cluster,) = plan.of_type(RAY_CLUSTER)
        assert check("ray-pods-least-privileged", RAY_CLUSTER, cluster.inputs) == [], name
        assert rule.validate(plan.stack_resources(), {}) == [], name


# --- ray-namespace-default-deny -------------------------------------------------------------------------

def _stack_with(*policies) -> list:
    cluster = model.Resource(RAY_CLUSTER, "ray-raycluster", ray_cluster(), "urn:ray")
    return [cluster, *(model.Resource(model.NETWORK_POLICY, f"np{i}", p, f"urn:np{i}") for i, p in enumerate(policies))]


DENY = {"metadata": {"namespace": "ray"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}


def test_a_default_deny_policy_in_the_ray_namespace_passes():
    rule = next(r for r in rules.RULES if r.name == "ray-namespace-default-deny")
    assert rule.validate(_stack_with(DENY), {}) == []


@pytest.mark.parametrize("policies", [
    (),
    ({"metadata": {"namespace": "other"}, "spec": DENY["spec"]},),
    ({"metadata": {"namespace": "ray"}, "spec": {"podSelector": {"matchLabels": {"a": "b"}}, "policyTypes": ["Ingress"]}},),
    ({"metadata": {"namespace": "ray"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]}},),
])
def test_a_ray_namespace_without_default_deny_is_refused(policies):
    rule = next(r for r in rules.RULES if r.name == "ray-namespace-default-deny")
    (violation,) = rule.validate(_stack_with(*policies), {})
    assert "has no NetworkPolicy denying all ingress" in violation.message and violation.urn == "urn:ray"
