"""The Helm releases as Helm runs them: each pinned chart archive rendered by a real `helm template` with
exactly the values the program hands to Helm, for every shipped stack, for scaleToZero, and for the
node-pools example of docs/configuration.md (a second GPU type and a CPU pool).

Assertions are on the rendered objects, read the way the scheduler reads them: a pod runs on a
node only if its nodeSelector and required node affinity match the node's labels and its
tolerations cover the node's NoSchedule taints. The nodes are the program's own node groups.
The EFA chart is rendered from v0.5.30, the newest public archive (the pin stays v0.5.32).
Helm and the archives come from `python -m tests.upstream fetch`.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass

import pytest
import yaml

from deploy import config, offline
from facts import images as image_references
from tests import upstream
from tests.examples import documented_stack
from tests.guards import nonempty
from workloads import charts

from .conftest import StackRun, run_stack, stack_config

RELEASE = "kubernetes:helm.sh/v3:Release"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ARCHIVES = {
    "kuberay-operator": "kuberay-operator-1.7.0.tgz",
    "nvidia-device-plugin": "nvidia-device-plugin-0.20.0.tgz",
    "aws-efa-k8s-device-plugin": "aws-efa-k8s-device-plugin-v0.5.30.tgz",
    "cluster-autoscaler": "cluster-autoscaler-9.59.0.tgz",
}
STACKS = {"dev": {}, "p5": {}, "dev-scaleToZero": {"raytrain-eks:scaleToZero": True},
          "p5-scaleToZero": {"raytrain-eks:scaleToZero": True}, "pools": None}  # pools: docs/configuration.md's example


@dataclass(frozen=True)
class Node:
    role: str
    labels: dict
    taints: tuple


@dataclass
class Rendered:
    stack: str
    cfg: object
    objects: dict           # release -> rendered objects
    values: dict            # release -> the values Pulumi passes
    nodes: dict             # role -> Node


def _effect(effect: str) -> str:
    return "".join(part.capitalize() for part in effect.split("_"))


def _nodes(run) -> dict[str, Node]:
    nodes = {}
    for group in run.result.of_type(NODE_GROUP):
        labels = {**group.inputs["labels"], "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "node.kubernetes.io/instance-type": group.inputs["instanceTypes"][0]}
        taints = tuple({"key": t["key"], "value": t.get("value"), "effect": _effect(t["effect"])}
                       for t in group.inputs.get("taints") or ())
        nodes[labels["role"]] = Node(labels["role"], labels, taints)
    return nodes


def helm_template(release: str, chart: str, namespace: str, values: dict, kube_version: str, tmp_path) -> list[dict]:
    values_file = tmp_path / f"{release}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    proc = subprocess.run([str(upstream.helm()), "template", release, str(upstream.path(ARCHIVES[chart])),
                           "--namespace", namespace, "--kube-version", f"v{kube_version}.0", "-f", str(values_file)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


_RENDERS: dict[str, Rendered] = {}


def render_stack(variant: str, tmp_path_factory) -> Rendered:
    """Every release of one stack variant, rendered once per test session."""
    if variant not in _RENDERS:
        stack = variant.split("-")[0]
        if STACKS[variant] is None:
            run = StackRun(offline.run(documented_stack(variant), stack=variant))
            cfg = config.load(documented_stack(variant), stack=variant)
        else:
            run = run_stack(stack, **STACKS[variant])
            cfg = stack_config(stack, **{k.split(":")[1]: v for k, v in STACKS[variant].items()})
        tmp = tmp_path_factory.mktemp(variant)
        objects, values = {}, {}
        for r in run.result.of_type(RELEASE):
            inputs = offline.plain(r.inputs)
            values[inputs["name"]] = inputs["values"]
            objects[inputs["name"]] = helm_template(inputs["name"], inputs["chart"], inputs["namespace"],
                                                    inputs["values"], cfg.kubernetes_version, tmp)
        _RENDERS[variant] = Rendered(variant, cfg, objects, values, _nodes(run))
    return _RENDERS[variant]


@pytest.fixture(params=sorted(STACKS))
def rendered(request, tmp_path_factory) -> Rendered:
    return render_stack(request.param, tmp_path_factory)


@pytest.fixture(params=sorted(v for v, o in STACKS.items() if o or o is None))
def autoscaled(request, tmp_path_factory) -> Rendered:
    return render_stack(request.param, tmp_path_factory)


# --- reading rendered objects as the scheduler does ----------------------------------------------

def workloads(objects: list[dict], kind: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] in ((kind,) if kind else ("Deployment", "DaemonSet", "StatefulSet"))]


def _expression(expr: dict, labels: dict) -> bool:
    key, op, values = expr["key"], expr["operator"], [str(v) for v in expr.get("values") or ()]
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not modelled")


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations or ():
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint["key"]):
            return True
        if t.get("key") == taint["key"] and str(t.get("value")) == str(taint["value"]):
            return True
    return False


def schedulable(pod_spec: dict, node: Node) -> bool:
    if any(node.labels.get(k) != str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if terms and not any(all(_expression(e, node.labels) for e in term.get("matchExpressions") or ()) for term in terms):
        return False
    return all(_tolerates(pod_spec.get("tolerations"), t) for t in node.taints if t["effect"] in ("NoSchedule", "NoExecute"))


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def images(objects: list[dict]) -> set[str]:
    return {c["image"] for w in workloads(objects) for c in (*pod_spec(w).get("initContainers", ()),
                                                             *pod_spec(w)["containers"])}


# --- the device plugins ------------------------------------------------------------------------------

@pytest.mark.parametrize("release", ["nvidia-device-plugin", "aws-efa-k8s-device-plugin"])
def test_device_plugins_run_on_every_gpu_node_and_nowhere_else(rendered, release):
    daemonsets = workloads(rendered.objects[release], "DaemonSet")
    assert daemonsets
    gpu, system = rendered.nodes["gpu-worker"], rendered.nodes["system"]
    plugin = [d for d in daemonsets if schedulable(pod_spec(d), gpu)]
    assert len(plugin) == 1, [d["metadata"]["name"] for d in daemonsets]  # the plugin itself (not NVIDIA's MPS daemon)
    assert all(not schedulable(pod_spec(d), system) for d in daemonsets)
    assert any(t.get("key") == "nvidia.com/gpu" for t in pod_spec(plugin[0])["tolerations"])


@pytest.mark.parametrize("release", ["nvidia-device-plugin", "aws-efa-k8s-device-plugin"])
def test_with_a_second_gpu_pool_the_device_plugins_run_on_both_and_not_on_cpu_pools(release, tmp_path_factory):
    rendered = render_stack("pools", tmp_path_factory)
    assert set(rendered.nodes) == {"system", "gpu-worker", "l40s-worker", "data-worker"}
    (plugin,) = [d for d in workloads(rendered.objects[release], "DaemonSet") if "mps" not in d["metadata"]["name"]]
    where = {role for role, node in rendered.nodes.items() if schedulable(pod_spec(plugin), node)}
    assert where == {"gpu-worker", "l40s-worker"}


def test_the_nvidia_mps_daemon_stays_off_our_nodes(rendered):
    """The chart renders an MPS control daemon for nodes labelled nvidia.com/mps.capable; ours are not."""
    (mps,) = [d for d in workloads(rendered.objects["nvidia-device-plugin"], "DaemonSet")
              if "mps" in d["metadata"]["name"]]
    assert not any(schedulable(pod_spec(mps), node) for node in rendered.nodes.values())


def test_the_efa_plugin_allows_this_stacks_gpu_type(rendered):
    (daemonset,) = workloads(rendered.objects["aws-efa-k8s-device-plugin"], "DaemonSet")
    terms = pod_spec(daemonset)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    allowed = {v for term in terms["nodeSelectorTerms"] for e in term["matchExpressions"]
               if e["key"] == "node.kubernetes.io/instance-type" for v in e["values"]}
    efa_types = {p.instance_type for p in rendered.cfg.node_pools if p.efa}
    assert efa_types and efa_types <= allowed


# --- the KubeRay operator ----------------------------------------------------------------------------

def test_the_operator_runs_on_the_system_node_only_behind_a_cluster_ip(rendered):
    objects = rendered.objects["kuberay-operator"]
    (deployment,) = workloads(objects, "Deployment")
    assert schedulable(pod_spec(deployment), rendered.nodes["system"])
    assert not schedulable(pod_spec(deployment), rendered.nodes["gpu-worker"])
    services = [o for o in objects if o["kind"] == "Service"]
    assert services and all(s["spec"].get("type", "ClusterIP") == "ClusterIP" for s in services)
    assert {o["kind"] for o in objects} >= {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"}


# --- the Cluster Autoscaler (scaleToZero) ------------------------------------------------------------

def test_the_cluster_autoscaler_only_with_scale_to_zero(rendered):
    assert ("cluster-autoscaler" in rendered.objects) is rendered.cfg.scale_to_zero


def test_the_autoscaler_runs_the_configured_image_with_our_flags_on_the_system_node(autoscaled):
    rendered = autoscaled
    objects = rendered.objects["cluster-autoscaler"]
    cfg = rendered.cfg
    (deployment,) = workloads(objects, "Deployment")
    spec = pod_spec(deployment)
    assert schedulable(spec, rendered.nodes["system"]) and not schedulable(spec, rendered.nodes["gpu-worker"])
    (container,) = spec["containers"]
    assert container["image"].startswith(f"{charts.AUTOSCALER_IMAGE}:{cfg.cluster_autoscaler_image_tag}")
    flags = set(container["command"])
    assert "--cloud-provider=aws" in flags
    assert (f"--node-group-auto-discovery=asg:tag=k8s.io/cluster-autoscaler/enabled,"
            f"k8s.io/cluster-autoscaler/{cfg.cluster_name}") in flags
    for name, value in nonempty(charts.autoscaler_args().items(), "Cluster Autoscaler arguments"):
        assert f"--{name}={value}" in flags
    env = {e["name"]: e.get("value") for e in container.get("env", ())}
    assert env["AWS_REGION"] == cfg.region


def test_the_autoscaler_service_account_carries_its_irsa_role(autoscaled):
    rendered = autoscaled
    objects = rendered.objects["cluster-autoscaler"]
    (deployment,) = workloads(objects, "Deployment")
    account = pod_spec(deployment)["serviceAccountName"]
    (sa,) = [o for o in objects if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == account]
    role = rendered.values["cluster-autoscaler"]["rbac"]["serviceAccount"]["annotations"][charts.IRSA_ANNOTATION]
    assert sa["metadata"]["annotations"][charts.IRSA_ANNOTATION] == role and role.startswith("arn:aws:iam::")


def test_the_autoscaler_may_read_dra_objects_and_nothing_with_wildcards(autoscaled):
    """CA 1.35/1.36 wait for resource.k8s.io informers: the rendered ClusterRole must let them list and watch."""
    objects = autoscaled.objects["cluster-autoscaler"]
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    rules = role["rules"]
    dra = [r for r in rules if "resource.k8s.io" in r.get("apiGroups", ())]
    assert dra and {"resourceslices", "deviceclasses", "resourceclaims"} <= {x for r in dra for x in r["resources"]}
    assert all({"list", "watch"} <= set(r["verbs"]) for r in dra)
    assert not any("*" in r.get("verbs", ()) or "*" in r.get("resources", ()) for r in rules)
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == [pod_spec(workloads(objects, "Deployment")[0])["serviceAccountName"]]


# --- images ------------------------------------------------------------------------------------------

def test_every_rendered_image_is_the_pinned_one_from_our_values(rendered):
    """No chart default slips through: every container runs repository:tag@sha256 from the values."""
    from workloads import image as pinning

    for release, objects in nonempty(rendered.objects.items(), "rendered releases"):
        values = rendered.values[release]["image"]
        assert images(objects) == {f"{values['repository']}:{values['tag']}"}, release
        assert values["tag"].endswith("@" + pinning.PLACEHOLDER_DIGEST)  # the offline plan's digest
        assert image_references.is_pinned(next(iter(images(objects))))
