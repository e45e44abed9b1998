"""The RayCluster manifest as a pure function: CRD validity, head, workers, environment, auth, sizing."""
from __future__ import annotations

import copy
import math

import jsonschema
import pytest

from deploy.config import ConfigError
from facts import catalog, nodes
from facts import ray as ray_facts
from tests.guards import nonempty
from workloads import raycluster
from workloads.raycluster import ManifestError

from .conftest import settings, stack_config

IMAGE = "public.ecr.aws/deep-learning-containers/ray@sha256:" + "ab" * 32
CHECKPOINTS = "s3://raytrain-ckpt-example"
EXPECTED_DEVICES = {"g6.12xlarge": (4, 1), "p5.48xlarge": (8, 32)}  # the numbers: GPUs, EFA devices


def build(stack="dev", **overrides):
    return raycluster.manifest(settings(stack, **overrides), image=IMAGE, checkpoint_uri=CHECKPOINTS)


def head_of(manifest):
    spec = manifest["spec"]["headGroupSpec"]
    return spec, spec["template"]["spec"], spec["template"]["spec"]["containers"][0]


def worker_of(manifest):
    (group,) = manifest["spec"]["workerGroupSpecs"]
    return group, group["template"]["spec"], group["template"]["spec"]["containers"][0]


def env_of(container):
    return {e["name"]: e["value"] for e in container["env"]}


def quantity_gib(text: str) -> float:
    units = {"Mi": 1 / 1024, "Gi": 1, "Ti": 1024}
    for unit, factor in units.items():
        if text.endswith(unit):
            return float(text[:-2]) * factor
    raise ValueError(text)


# EKS's kubelet reservation (AL2023 EKS AMI): CPU 6% of the first core, 1% of the second, 0.5% of
# the next two, 0.25% of the rest; memory 255Mi + 11Mi per pod (max pods capped at 110 below 30
# vCPUs, 250 above) plus the 100Mi eviction threshold. About 5% of nominal memory is never visible.
def allocatable(vcpus: int, memory_gib: int, *, efa: bool) -> tuple[float, float]:
    millicores = [60, 10, 5, 5] + [2.5] * max(0, vcpus - 4)
    cpu = vcpus - sum(millicores[:vcpus]) / 1000
    max_pods = 110 if vcpus < 30 else 250
    memory = memory_gib * 0.95 - (255 + 11 * max_pods + 100) / 1024 - (5128 * 2 / 1024 if efa else 0)
    return cpu, memory


# Requests of the other pods: aws-node 25m, kube-proxy 100m on every node; CoreDNS 2 x (100m,
# 70Mi) and the KubeRay operator (100m, 512Mi) on the system node; the EFA plugin (10m, 20Mi) on GPU nodes.
SYSTEM_NODE_OTHERS = (0.025 + 0.1 + 0.2 + 0.1, (140 + 512) / 1024)
GPU_NODE_OTHERS = (0.025 + 0.1 + 0.01, 20 / 1024)


@pytest.mark.parametrize("stack", ["dev", "p5"])
def test_validates_against_the_kuberay_v1_crd(stack, raycluster_schema, strict_raycluster_schema):
    manifest = build(stack)
    raycluster_schema.validate(manifest)
    strict_raycluster_schema.validate(manifest)  # and no field the CRD does not know


@pytest.mark.parametrize("gpu_type", sorted(catalog.GPU_TYPES))
def test_every_catalog_gpu_type_gives_a_valid_manifest(gpu_type, strict_raycluster_schema):
    strict_raycluster_schema.validate(build(gpuNodeType=gpu_type))


def test_strict_schema_catches_a_misplaced_field(strict_raycluster_schema, raycluster_schema):
    manifest = build()
    manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["tolerations"] = []
    raycluster_schema.validate(manifest)
    with pytest.raises(jsonschema.ValidationError, match="tolerations"):
        strict_raycluster_schema.validate(manifest)


def test_identity_version_auth_and_service_account():
    cfg = settings("dev", rayVersion="2.55.0", rayNamespace="training")
    manifest = raycluster.manifest(cfg, image=IMAGE, checkpoint_uri=CHECKPOINTS)
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayCluster")
    assert manifest["metadata"]["name"] == cfg.ray_cluster_name
    assert manifest["metadata"]["namespace"] == "training"
    assert manifest["spec"]["rayVersion"] == "2.55.0"
    assert manifest["spec"]["authOptions"] == {"mode": "token"}
    assert manifest["spec"]["enableInTreeAutoscaling"] is False
    for _, pod, container in (head_of(manifest), worker_of(manifest)):
        assert pod["serviceAccountName"] == cfg.service_account == "ray-train"
        assert container["image"] == IMAGE
        assert "hostNetwork" not in pod and container["securityContext"]["privileged"] is False


def test_head_runs_on_the_system_node_without_gpus():
    head, pod, container = head_of(build())
    assert pod["nodeSelector"] == {"role": "system"}
    assert "tolerations" not in pod
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert env_of(container)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env_of(container)[ray_facts.CHECKPOINT_ENV] == CHECKPOINTS
    assert head["serviceType"] == "ClusterIP"
    assert {p["containerPort"] for p in container["ports"]} == {6379, 8265, 10001}
    assert not any(r.startswith(("nvidia.com/", "vpc.amazonaws.com/")) for r in container["resources"]["limits"])
    assert container["lifecycle"]["preStop"]["exec"]["command"][-1] == "ray stop"


@pytest.mark.parametrize("role", ["head", "worker"])
def test_ray_tmp_is_a_volume(role):
    _, pod, container = (head_of if role == "head" else worker_of)(build())
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp/ray"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume == {"name": mount["name"], "emptyDir": {}}


@pytest.mark.parametrize("system_type", sorted(catalog.CPU_TYPES))
def test_head_fits_the_system_node_beside_the_operator_and_coredns(system_type):
    _, _, container = head_of(build(systemNodeType=system_type))
    requests = container["resources"]["requests"]
    assert container["resources"]["limits"] == requests
    node = catalog.CPU_TYPES[system_type]
    cpu, memory = allocatable(node.vcpus, node.memory_gib, efa=False)
    assert float(requests["cpu"]) + SYSTEM_NODE_OTHERS[0] <= cpu
    assert quantity_gib(requests["memory"]) + SYSTEM_NODE_OTHERS[1] <= memory
    assert float(requests["cpu"]) >= 1 and quantity_gib(requests["memory"]) >= 2


@pytest.mark.parametrize("stack, gpu_type", [("dev", "g6.12xlarge"), ("p5", "p5.48xlarge")])
def test_each_worker_claims_its_whole_node(stack, gpu_type):
    cfg = settings(stack, gpuNodeCount=3)
    assert cfg.worker_groups[0].instance.name == gpu_type
    group, pod, container = worker_of(raycluster.manifest(cfg, image=IMAGE, checkpoint_uri=CHECKPOINTS))
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 3
    gpus, efa = EXPECTED_DEVICES[gpu_type]
    limits = container["resources"]["limits"]
    assert container["resources"]["requests"] == limits
    assert limits["nvidia.com/gpu"] == str(gpus) == group["rayStartParams"]["num-gpus"]
    assert limits["vpc.amazonaws.com/efa"] == str(efa)
    assert limits["hugepages-2Mi"] == catalog.GPU_TYPES[gpu_type].hugepages_2mi == "5120Mi"
    assert pod["nodeSelector"]["role"] == "gpu-worker"
    assert pod["tolerations"] == [nodes.GPU_TAINT.toleration()]


@pytest.mark.parametrize("gpu_type", sorted(catalog.GPU_TYPES))
def test_worker_cpu_and_memory_are_the_node_minus_a_reserve_and_fit(gpu_type):
    gpu = catalog.GPU_TYPES[gpu_type]
    _, _, container = worker_of(build(gpuNodeType=gpu_type))
    limits = container["resources"]["limits"]
    cpu, memory = float(limits["cpu"]), quantity_gib(limits["memory"])
    assert gpu.vcpus * 0.85 <= cpu <= gpu.vcpus - 2  # most of the node, not all of it
    assert gpu.memory_gib * 0.8 <= memory <= gpu.memory_gib - 8
    node_cpu, node_memory = allocatable(gpu.vcpus, gpu.memory_gib, efa=gpu.efa)
    assert cpu + GPU_NODE_OTHERS[0] <= node_cpu
    assert memory + GPU_NODE_OTHERS[1] <= node_memory


@pytest.mark.parametrize("gpu_type", sorted(catalog.GPU_TYPES))
def test_worker_environment(gpu_type):
    _, _, container = worker_of(build(gpuNodeType=gpu_type))
    env = env_of(container)
    assert env["FI_PROVIDER"] == "efa"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_DEBUG"] == "INFO"
    assert ray_facts.CHECKPOINT_ENV not in env  # read on the head only, by the job's driver
    nvlink = catalog.GPU_TYPES[gpu_type].nvlink
    assert ("NCCL_SHM_USE_CUDA_MEMCPY" in env) is (not nvlink)
    if not nvlink:
        assert env["NCCL_SHM_USE_CUDA_MEMCPY"] == "1"


def test_nccl_debug_is_configurable_and_validated():
    _, _, container = worker_of(build(ncclDebug="WARN"))
    assert env_of(container)["NCCL_DEBUG"] == "WARN"
    with pytest.raises(ConfigError, match="raytrain-eks:ncclDebug: 'LOUD' is not supported; use one of"):
        stack_config("dev", ncclDebug="LOUD")


def test_worker_tolerates_exactly_the_gpu_node_taint():
    _, pod, _ = worker_of(build())
    (toleration,) = pod["tolerations"]
    # what the node group's taint says, in Kubernetes' spelling
    taint = nodes.GPU_TAINT.node_group()
    effect = "".join(part.capitalize() for part in taint["effect"].split("_"))  # NO_SCHEDULE -> NoSchedule
    assert (toleration["key"], toleration["operator"], toleration["value"], toleration["effect"]) == (
        taint["key"], "Equal", taint["value"], effect)


@pytest.mark.parametrize("image", [
    "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1",
    "public.ecr.aws/deep-learning-containers/ray@sha256:abc",
])
def test_refuses_an_image_not_pinned_by_digest(image):
    with pytest.raises(ManifestError, match=r"raytrain-eks:dlcImage: .*pinned by digest"):
        raycluster.manifest(settings("dev"), image=image, checkpoint_uri=CHECKPOINTS)


def test_refuses_local_checkpoint_storage():
    with pytest.raises(ManifestError, match="needs shared storage"):
        raycluster.manifest(settings("dev"), image=IMAGE, checkpoint_uri="/tmp/checkpoints")


def test_is_pure():
    cfg = settings("dev")
    first = raycluster.manifest(cfg, image=IMAGE, checkpoint_uri=CHECKPOINTS)
    snapshot = copy.deepcopy(first)
    _, pod, _ = worker_of(first)
    pod["tolerations"][0]["value"] = "changed"
    pod["nodeSelector"]["role"] = "changed"
    assert nodes.GPU_TAINT.toleration()["value"] == "true"
    assert settings("dev").worker_groups[0].node_selector["role"] == "gpu-worker"
    assert raycluster.manifest(cfg, image=IMAGE, checkpoint_uri=CHECKPOINTS) == snapshot


def test_reserve_constants_are_what_the_sizing_uses():
    gpu = catalog.GPU_TYPES["g6.12xlarge"]
    size = raycluster.worker_size(gpu)
    assert size.cpu == gpu.vcpus - max(2, math.ceil(gpu.vcpus * 0.1)) == 43
    assert size.memory_gib == 192 - 20 - 11 == 161


def test_the_crd_schema_is_really_applied(raycluster_schema):
    manifest = build()
    del manifest["spec"]["workerGroupSpecs"][0]["groupName"]
    with pytest.raises(jsonschema.ValidationError, match="'groupName' is a required property"):
        raycluster_schema.validate(manifest)
    manifest = build()
    manifest["spec"]["authOptions"]["mode"] = "password"
    with pytest.raises(jsonschema.ValidationError, match="'password' is not one of"):
        raycluster_schema.validate(manifest)


# --- scaleToZero: the KubeRay in-tree autoscaler ---------------------------------------------------------

def autoscaled(stack="dev", **overrides):
    return build(stack, scaleToZero=True, **overrides)


@pytest.mark.parametrize("stack", ["dev", "p5"])
def test_autoscaled_manifest_validates_against_the_crd(stack, raycluster_schema, strict_raycluster_schema):
    manifest = autoscaled(stack)
    raycluster_schema.validate(manifest)
    strict_raycluster_schema.validate(manifest)


@pytest.mark.parametrize("gpu_type", sorted(catalog.GPU_TYPES))
def test_every_catalog_gpu_type_gives_a_valid_autoscaled_manifest(gpu_type, strict_raycluster_schema):
    strict_raycluster_schema.validate(autoscaled(gpuNodeType=gpu_type))


def test_workers_scale_between_zero_and_the_gpu_node_count(raycluster_schema):
    manifest = autoscaled(gpuNodeCount=3, gpuIdleTimeoutMinutes=4)
    spec = manifest["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    options = spec["autoscalerOptions"]
    assert options["idleTimeoutSeconds"] == 240
    assert options["image"] == IMAGE  # the same digest-pinned image as head and workers
    group, _, container = worker_of(manifest)
    assert (group["minReplicas"], group["maxReplicas"]) == (0, 3)
    # The autoscaler owns `replicas`; the API server fills it in with the CRD default, which must be 0.
    assert "replicas" not in group
    replicas = raycluster_schema.schema["properties"]["spec"]["properties"]["workerGroupSpecs"]["items"][
        "properties"]["replicas"]
    assert replicas["default"] == 0
    assert container["resources"]["limits"]["nvidia.com/gpu"] == group["rayStartParams"]["num-gpus"] == "4"


def test_cluster_autoscaler_never_evicts_a_ray_worker():
    group, _, _ = worker_of(autoscaled())
    assert group["template"]["metadata"]["annotations"] == {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    assert "annotations" not in worker_of(build())[0]["template"]["metadata"]


def test_only_the_autoscaler_sidecar_gets_a_kubernetes_api_token():
    manifest = autoscaled()
    _, pod, head = head_of(manifest)
    options = manifest["spec"]["autoscalerOptions"]
    assert "automountServiceAccountToken" not in pod  # the service account keeps it off for Ray's own containers
    (mount,) = [m for m in options["volumeMounts"] if m["name"] == raycluster.KUBE_API_VOLUME]
    assert mount == {"name": raycluster.KUBE_API_VOLUME, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                     "readOnly": True}
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    sources = volume["projected"]["sources"]
    assert [s["serviceAccountToken"]["path"] for s in sources if "serviceAccountToken" in s] == ["token"]
    assert [i["path"] for s in sources if "configMap" in s for i in s["configMap"]["items"]] == ["ca.crt"]
    assert [i["path"] for s in sources if "downwardAPI" in s for i in s["downwardAPI"]["items"]] == ["namespace"]
    assert all(m["mountPath"] != mount["mountPath"] for m in nonempty(head["volumeMounts"], "head volume mounts"))
    assert options["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                          "capabilities": {"drop": ["ALL"]}}


@pytest.mark.parametrize("system_type", sorted(catalog.CPU_TYPES))
def test_head_and_autoscaler_sidecar_fit_beside_the_cluster_autoscaler(system_type):
    from workloads import charts

    manifest = autoscaled(systemNodeType=system_type)
    _, _, container = head_of(manifest)
    sidecar = manifest["spec"]["autoscalerOptions"]["resources"]
    assert sidecar["requests"] == sidecar["limits"]  # with the head's requests == limits: a Guaranteed pod
    ca = charts.cluster_autoscaler(settings("dev", scaleToZero=True), role_arn="arn:x").values["resources"]["requests"]
    millicores = lambda q: float(q[:-1]) / 1000 if q.endswith("m") else float(q)  # noqa: E731
    cpu = millicores(container["resources"]["requests"]["cpu"]) + millicores(sidecar["requests"]["cpu"]) \
        + millicores(ca["cpu"]) + SYSTEM_NODE_OTHERS[0]
    memory = quantity_gib(container["resources"]["requests"]["memory"]) + quantity_gib(sidecar["requests"]["memory"]) \
        + quantity_gib(ca["memory"]) + SYSTEM_NODE_OTHERS[1]
    node = catalog.CPU_TYPES[system_type]
    node_cpu, node_memory = allocatable(node.vcpus, node.memory_gib, efa=False)
    assert cpu <= node_cpu and memory <= node_memory


def test_autoscaled_manifest_is_pure():
    cfg = settings("dev", scaleToZero=True)
    first = raycluster.manifest(cfg, image=IMAGE, checkpoint_uri=CHECKPOINTS)
    snapshot = copy.deepcopy(first)
    first["spec"]["autoscalerOptions"]["resources"]["limits"]["cpu"] = "9"
    first["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["annotations"].clear()
    assert raycluster.AUTOSCALER_RESOURCES["cpu"] == "250m"
    assert raycluster.manifest(cfg, image=IMAGE, checkpoint_uri=CHECKPOINTS) == snapshot


# --- what KubeRay v1.7.0 does with the manifest (ray-operator/controllers/ray/common/pod.go) --------------

def kuberay_worker_restart_policy(manifest) -> str:
    """DefaultWorkerPodTemplate: Never only with autoscaling and autoscalerOptions.version v2, else the template's."""
    spec = manifest["spec"]
    template = spec["workerGroupSpecs"][0]["template"]["spec"]
    v2 = spec.get("enableInTreeAutoscaling") and (spec.get("autoscalerOptions") or {}).get("version") == "v2"
    return "Never" if v2 else template.get("restartPolicy", "Always")


def kuberay_autoscaler_mounts(manifest) -> dict[str, str]:
    """BuildPod's addEmptyDir: a separate `ray-logs` emptyDir at /tmp/ray unless the sidecar mounts one there."""
    mounts = {m["mountPath"]: m["name"] for m in manifest["spec"]["autoscalerOptions"].get("volumeMounts", [])}
    mounts.setdefault("/tmp/ray", "ray-logs")
    return mounts


def test_autoscaler_v2_is_explicit_and_workers_never_restart_in_place(raycluster_schema):
    """Ray's KubeRay autoscaling guide asks for restartPolicy Never; KubeRay sets it only for an explicit v2."""
    manifest = autoscaled()
    options = manifest["spec"]["autoscalerOptions"]
    assert options["version"] == "v2"
    enum = raycluster_schema.schema["properties"]["spec"]["properties"]["autoscalerOptions"]["properties"]["version"]
    assert "v2" in enum["enum"]
    _, pod, _ = worker_of(manifest)
    assert pod["restartPolicy"] == "Never" == kuberay_worker_restart_policy(manifest)
    fixed = build()
    assert "restartPolicy" not in worker_of(fixed)[1] and "autoscalerOptions" not in fixed["spec"]


def test_autoscaler_sidecar_writes_into_the_heads_ray_logs():
    manifest = autoscaled()
    _, pod, head = head_of(manifest)
    (head_tmp,) = [m for m in head["volumeMounts"] if m["mountPath"] == "/tmp/ray"]
    assert kuberay_autoscaler_mounts(manifest)["/tmp/ray"] == head_tmp["name"]
    assert head_tmp["name"] in {v["name"] for v in pod["volumes"]}


def test_the_nccl_debug_files_folder_is_its_own_volume_on_every_worker():
    """The folder submit's NCCL_DEBUG_FILE points into exists before any process of the pod starts."""
    from trainer import efa
    from trainer.submit.job import job_environment

    folder = efa.debug_file_dir(job_environment(_gpu_job(), None, {})["NCCL_DEBUG_FILE"])
    for manifest in (build(), autoscaled(), build("p5")):
        _, pod, container = worker_of(manifest)
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(folder)]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume == {"name": raycluster.NCCL_LOG_VOLUME, "emptyDir": {}}
        assert str(folder).startswith(ray_facts.TMP_DIR + "/")  # nested in /tmp/ray: `kubectl cp` finds it there


def _gpu_job():
    from trainer.config import load as config

    return config.parse(["--model", "m", "--dataset", "d.jsonl", "--device", "gpu"])


@pytest.mark.parametrize("manifest", [build(), build(scaleToZero=True)], ids=["fixed", "scaleToZero"])
def test_every_ray_container_drops_all_capabilities_under_the_runtime_seccomp_profile(manifest):
    pods = [head_of(manifest)[1], worker_of(manifest)[1]]
    containers = [pod["containers"][0] for pod in pods]
    if "autoscalerOptions" in manifest["spec"]:
        containers.append(manifest["spec"]["autoscalerOptions"])
    for pod in pods:
        assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    for container in containers:
        security = container["securityContext"]
        assert security["capabilities"] == {"drop": ["ALL"]} and "add" not in security["capabilities"]
        assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False


def test_the_head_advertises_no_cpus_to_ray():
    head, _, _ = head_of(build())
    assert head["rayStartParams"]["num-cpus"] == "0" and head["rayStartParams"]["num-gpus"] == "0"


def test_every_stack_kind_recreates_its_pods_on_a_spec_change():
    """KubeRay v1.7.0 keeps running pods on their old template unless upgradeStrategy is Recreate; the
    scaled stack's apply takes the worker groups back from the autoscaler's patches (pulumi.com/patchForce)."""
    for manifest in (build(), autoscaled()):
        assert manifest["spec"]["upgradeStrategy"] == {"type": "Recreate"}
    assert autoscaled()["metadata"]["annotations"] == {raycluster.PATCH_FORCE: "true"}
    assert "annotations" not in build()["metadata"]


