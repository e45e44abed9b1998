"""The Helm releases as data: pinned chart versions from the configuration, repositories, placement."""
from __future__ import annotations

import pytest

from deploy.config import ConfigError
from facts import nodes
from workloads import charts

from .conftest import settings, stack_config

GPU_EFFECT = "NoSchedule"  # the node group's NO_SCHEDULE as Kubernetes spells it


def by_release(cfg):
    return {r.release: r for r in charts.releases(cfg)}


def test_charts_repositories_and_default_versions():
    releases = by_release(settings("dev"))
    assert {name: (r.chart, r.version, r.repository) for name, r in releases.items()} == {
        "nvidia-device-plugin": ("nvidia-device-plugin", "0.20.0", "https://nvidia.github.io/k8s-device-plugin"),
        "aws-efa-k8s-device-plugin": ("aws-efa-k8s-device-plugin", "v0.5.32", "https://aws.github.io/eks-charts"),
        "kuberay-operator": ("kuberay-operator", "1.7.0", "https://ray-project.github.io/kuberay-helm/"),
    }


def test_versions_follow_the_configuration():
    cfg = settings("dev", kuberayVersion="1.6.2", nvidiaDevicePluginVersion="0.19.1",
                       efaDevicePluginVersion="v0.5.40")
    assert {r.release: r.version for r in charts.releases(cfg)} == {
        "nvidia-device-plugin": "0.19.1", "aws-efa-k8s-device-plugin": "v0.5.40", "kuberay-operator": "1.6.2"}


@pytest.mark.parametrize("release", ["nvidia-device-plugin", "aws-efa-k8s-device-plugin"])
def test_device_plugins_run_only_on_gpu_nodes_and_tolerate_their_taint(release):
    chart = by_release(settings("dev"))[release]
    assert chart.runs_on == "gpu" and chart.namespace == "kube-system"
    assert chart.values["nodeSelector"] == {"role": "gpu-worker", "nvidia.com/gpu.present": "true"}
    matching = [t for t in chart.values["tolerations"]
                if t["key"] == nodes.GPU_TAINT.key and t.get("effect") == GPU_EFFECT
                and (t["operator"] == "Exists" or t.get("value") == nodes.GPU_TAINT.value)]
    assert matching, chart.values["tolerations"]


def test_operator_runs_on_the_system_node_behind_a_cluster_ip():
    chart = by_release(settings("dev"))["kuberay-operator"]
    assert chart.runs_on == "system" and chart.namespace == charts.OPERATOR_NAMESPACE
    assert chart.values["nodeSelector"] == {"role": "system"}
    assert "tolerations" not in chart.values
    assert chart.values["service"]["type"] == "ClusterIP"


def test_values_are_fresh_copies():
    cfg = settings("dev")
    charts.nvidia_device_plugin(cfg).values["tolerations"][0]["value"] = "changed"
    charts.kuberay_operator(cfg).values["nodeSelector"]["role"] = "changed"
    assert nodes.GPU_TAINT.toleration()["value"] == "true" and settings("dev").system_node_selector["role"] == "system"


def test_a_kuberay_without_token_auth_is_refused():
    with pytest.raises(ConfigError) as err:
        stack_config("dev", kuberayVersion="1.4.0")
    assert ("raytrain-eks:kuberayVersion: 1.4.0 is older than 1.5.1, the first KubeRay release whose RayCluster "
            "has authOptions") in str(err.value)
    assert stack_config("dev", kuberayVersion="1.5.1").kuberay_version == "1.5.1"


# --- scaleToZero: the Cluster Autoscaler ---------------------------------------------------------------

ROLE = "arn:aws:iam::123456789012:role/ca"


def test_cluster_autoscaler_chart_version_and_image_follow_the_configuration():
    chart = charts.cluster_autoscaler(settings("dev", scaleToZero=True), role_arn=ROLE)
    assert (chart.chart, chart.version, chart.repository, chart.namespace, chart.runs_on) == (
        "cluster-autoscaler", "9.59.0", "https://kubernetes.github.io/autoscaler", "kube-system", "system")
    assert chart.values["image"] == {"repository": "registry.k8s.io/autoscaling/cluster-autoscaler", "tag": "v1.36.1"}
    older = charts.cluster_autoscaler(settings("dev", scaleToZero=True, kubernetesVersion="1.35",
                                                   clusterAutoscalerVersion="9.54.0"), role_arn=ROLE)
    assert (older.version, older.values["image"]["tag"]) == ("9.54.0", "v1.35.2")


def test_cluster_autoscaler_uses_its_own_irsa_role_and_runs_on_the_system_node():
    cfg = settings("dev", scaleToZero=True, clusterName="lab")
    values = charts.cluster_autoscaler(cfg, role_arn=ROLE).values
    assert values["rbac"]["serviceAccount"] == {"create": True, "name": "cluster-autoscaler",
                                                "annotations": {"eks.amazonaws.com/role-arn": ROLE}}
    assert values["autoDiscovery"] == {"clusterName": "lab", "tags": [
        "k8s.io/cluster-autoscaler/enabled", "k8s.io/cluster-autoscaler/lab"]}
    assert values["awsRegion"] == cfg.region and values["cloudProvider"] == "aws"
    assert values["nodeSelector"] == {"role": "system"} and "tolerations" not in values
    assert values["service"]["type"] == "ClusterIP"
    assert values["resources"]["requests"]["memory"] == values["resources"]["limits"]["memory"]


def test_cluster_autoscaler_is_not_among_the_fixed_releases():
    assert "cluster-autoscaler" not in by_release(settings("dev", scaleToZero=True))


def test_cluster_autoscaler_values_are_fresh_copies():
    cfg = settings("dev", scaleToZero=True)
    values = charts.cluster_autoscaler(cfg, role_arn=ROLE).values
    values["nodeSelector"]["role"] = "changed"
    values["extraArgs"]["expander"] = "random"
    again = charts.cluster_autoscaler(cfg, role_arn=ROLE).values
    assert again["nodeSelector"] == {"role": "system"} and again["extraArgs"]["expander"] == "least-waste"


@pytest.mark.parametrize("kubernetes, too_old, oldest_ok", [("1.34", "9.46.6", "9.47.0"), ("1.35", "9.53.0", "9.54.0"),
                                                            ("1.36", "9.53.0", "9.54.0")])
def test_the_oldest_autoscaler_chart_follows_the_kubernetes_version(kubernetes, too_old, oldest_ok):
    """CA 1.35/1.36 watch resource.k8s.io objects; charts before 9.54.0 grant no RBAC for them (never scales)."""
    with pytest.raises(ConfigError) as err:
        stack_config("dev", scaleToZero=True, kubernetesVersion=kubernetes, clusterAutoscalerVersion=too_old)
    assert f"raytrain-eks:clusterAutoscalerVersion: {too_old} is older than" in str(err.value) \
        or f"raytrain-eks:clusterAutoscalerVersion: chart {too_old} is older than {oldest_ok}" in str(err.value)
    assert "never scales" in str(err.value)
    cfg = settings("dev", scaleToZero=True, kubernetesVersion=kubernetes, clusterAutoscalerVersion=oldest_ok)
    assert charts.cluster_autoscaler(cfg, role_arn=ROLE).version == oldest_ok


def test_a_dra_era_chart_message_names_the_kubernetes_version():
    with pytest.raises(ConfigError) as err:
        stack_config("dev", scaleToZero=True, kubernetesVersion="1.35", clusterAutoscalerVersion="9.50.0")
    assert ("clusterAutoscalerVersion: chart 9.50.0 is older than 9.54.0, the first whose ClusterRole lets Cluster "
            "Autoscaler 1.35 watch resource.k8s.io (DRA) objects") in str(err.value)
