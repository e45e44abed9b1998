"""The RayCluster manifest: a pure function of the workloads' settings and the instance catalog.

One head on the system node (no GPUs, no training work) and, per worker group, one worker
pod per node of its pool that claims the whole node: every GPU, every EFA device, the EFA
huge pages and the CPU and memory left after a reserve for the kubelet and node daemons.
Moving to another GPU family changes the catalog row, not this code; another worker group
is another node pool.

The head advertises no CPUs to Ray (num-cpus 0, as KubeRay's own samples do): what Ray
Train 2.58 places on the driver's node asks for none (TrainController: num_cpus=0 with a
label selector on the driver's node, train/v2/api/data_parallel_trainer.py; its
SynchronizationActor and PreemptionWatcher: num_cpus=0; a job's entrypoint: 0 CPUs by
default), while every training worker asks for at least one CPU and so never lands on
the small system node.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from facts import images, resources
from facts import ray as ray_facts
from facts.catalog import CpuInstanceType, InstanceType
from workloads.settings import WorkerGroup, Workloads

API_VERSION = "ray.io/v1"
KIND = "RayCluster"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
RAY_TMP_VOLUME = "ray-tmp"
# Its own volume at the NCCL debug files' folder: Kubernetes creates the mount point before the
# container starts, so the folder exists before any Ray process (NCCL creates no directories).
NCCL_LOG_VOLUME = "nccl-logs"

# Left on a worker node for the OS, kubelet, eviction threshold and the daemon sets (VPC CNI,
# kube-proxy, both device plugins on GPU nodes): 10 %, at least 2 cores and 8 GiB (facts.resources: the
# trainer's memory plan reads the same worker pod memory).
NODE_RESERVE_FRACTION = resources.NODE_RESERVE_FRACTION
NODE_RESERVE_MIN_CPU = resources.NODE_RESERVE_MIN_CPU

# scaleToZero: the KubeRay autoscaler runs as a sidecar of the head, on the system node; requests
# equal limits keep the head pod Guaranteed, and it fits beside the head on the smallest system type.
AUTOSCALER_RESOURCES = {"cpu": "250m", "memory": "512Mi"}
# The ray-train service account does not automount its token (Ray code needs no Kubernetes API);
# the autoscaler does, to resize the worker group. It alone mounts a token, where clients look for it.
KUBE_API_VOLUME = "kube-api-access-autoscaler"
KUBE_API_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# Ray, not the Cluster Autoscaler, decides when a training worker goes.
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
# KubeRay v1.7.0 sets restartPolicy Never on workers only for autoscaler v2 (common/pod.go), and
# its injected environment makes Ray 2.58 run v2 anyway: say v2, and Never, explicitly. A worker
# container restarted in place (Always) re-registers as a new Ray node the autoscaler did not
# launch, so it may never be scaled away and its GPU node keeps billing.
AUTOSCALER_VERSION = "v2"
AUTOSCALED_WORKER_RESTART_POLICY = "Never"
# A spec change must reach every Ray pod at once: without an upgrade strategy KubeRay keeps running pods
# on their old template and gives only pods created later the new one, so head and workers could run
# different images and Ray versions. KubeRay v1.7.0's Recreate (raycluster_controller.go,
# shouldRecreatePodsForUpgrade) deletes every pod when the hash of the spec, replicas and workersToDelete
# left out, or the operator's version differs from the head pod's: the autoscaler's replicas recreate nothing.
UPGRADE_STRATEGY = {"type": "Recreate"}
# spec.workerGroupSpecs has no x-kubernetes-list-type in the v1.7.0 CRD: server-side apply treats it as one
# atomic field, which the autoscaler's replica patches co-own on scaled stacks. Pulumi declares the whole
# spec (never ignoreChanges: the engine would build every later object from the OLD stored worker groups)
# and takes the field back when the spec changes; an unchanged spec is not applied, so the replicas stay.
PATCH_FORCE = "pulumi.com/patchForce"

# Nothing in Ray needs a Linux capability (KubeRay's own restricted samples drop ALL); EFA devices
# come from the device plugin and NCCL over EFA runs under the runtime's default set, which has no
# IPC_LOCK either (the AWS reference deployment). RuntimeDefault: the runtime's seccomp profile.
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}
POD_SECURITY = {"seccompProfile": {"type": "RuntimeDefault"}}


class ManifestError(ValueError):
    """The inputs cannot make a valid RayCluster."""


@dataclass(frozen=True)
class PodSize:
    cpu: int
    memory_gib: int

    def quantities(self) -> dict[str, str]:
        return {"cpu": str(self.cpu), "memory": f"{self.memory_gib}Gi"}


def head_size(system: CpuInstanceType) -> PodSize:
    """Half the system node: the other half is for the kubelet, CoreDNS, the KubeRay operator and node daemons."""
    return PodSize(cpu=max(1, system.vcpus // 2), memory_gib=max(2, system.memory_gib // 2))


def worker_size(instance: InstanceType, *, efa: bool = True) -> PodSize:
    """The node minus the reserve and, on nodes with EFA, the pre-allocated huge pages."""
    return PodSize(cpu=resources.worker_cpus(instance), memory_gib=resources.worker_memory_gib(instance, efa=efa))


def worker_resources(instance: InstanceType, *, efa: bool = True) -> dict[str, str]:
    """Requests equal limits: extended resources and huge pages require it, and it gives Guaranteed QoS."""
    return {**worker_size(instance, efa=efa).quantities(), **resources.extended(instance, efa=efa)}


def worker_env(group: WorkerGroup, nccl_debug: str) -> list[dict[str, str]]:
    """NCCL over libfabric/EFA; without NVLink, intra-node traffic is faster through cudaMemcpy into shared memory.

    NCCL_DEBUG is the stack's ncclDebug for NCCL processes started by other means; `trainer submit`
    runs its GPU jobs at INFO into per-rank files, which the EFA proof reads. CPU workers run no NCCL.
    """
    if not group.gpus:
        return []
    env = {"FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": "ofi"} if group.efa else {}
    env.update({"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": nccl_debug})
    if not group.instance.nvlink:
        env["NCCL_SHM_USE_CUDA_MEMCPY"] = "1"
    return [{"name": k, "value": v} for k, v in env.items()]


def _stop_ray() -> dict:
    return {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}}


def _container(name: str, image: str, env: list[dict], resources: dict[str, str], *,
               extra_mounts: tuple[dict, ...] = (), **extra) -> dict:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "env": env,
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "lifecycle": _stop_ray(),
        "volumeMounts": [{"name": RAY_TMP_VOLUME, "mountPath": ray_facts.TMP_DIR}, *extra_mounts],
        "securityContext": _security(),
        **extra,
    }


def _security() -> dict:
    return json.loads(json.dumps(CONTAINER_SECURITY))


def _pod(settings: Workloads, container: dict, node_selector, tolerations, *,
         extra_volumes: tuple[dict, ...] = (), annotations: dict[str, str] | None = None,
         restart_policy: str | None = None) -> dict:
    spec = {
        "serviceAccountName": settings.service_account,
        "securityContext": json.loads(json.dumps(POD_SECURITY)),
        "nodeSelector": dict(node_selector),
        "containers": [container],
        "volumes": [{"name": RAY_TMP_VOLUME, "emptyDir": {}}, *extra_volumes],
    }
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    if tolerations:
        spec["tolerations"] = [t.toleration() for t in tolerations]
    pod_metadata = {"labels": {"app.kubernetes.io/part-of": settings.project}}
    if annotations:
        pod_metadata["annotations"] = dict(annotations)
    return {"metadata": pod_metadata, "spec": spec}


def kube_api_volume() -> dict:
    """What automount would give a pod (token, cluster CA, namespace), as a volume only the autoscaler mounts."""
    return {"name": KUBE_API_VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}}


def autoscaler_options(settings: Workloads, image: str) -> dict:
    """KubeRay's in-tree autoscaler (v2): removes a worker after gpuIdleTimeoutMinutes without Ray work.

    It mounts the head's own /tmp/ray volume: otherwise KubeRay gives it a separate `ray-logs`
    emptyDir there (common/pod.go, addEmptyDir), and its events never reach the head's logs,
    the dashboard or the job log.
    """
    return {
        "version": AUTOSCALER_VERSION,
        "idleTimeoutSeconds": settings.idle_timeout_minutes * 60,
        "upscalingMode": "Default",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": dict(AUTOSCALER_RESOURCES), "limits": dict(AUTOSCALER_RESOURCES)},
        "securityContext": _security(),
        "volumeMounts": [{"name": KUBE_API_VOLUME, "mountPath": KUBE_API_MOUNT, "readOnly": True},
                         {"name": RAY_TMP_VOLUME, "mountPath": ray_facts.TMP_DIR}],
    }


def worker_scaling(group: WorkerGroup) -> dict[str, int]:
    """Fixed: as many workers as nodes. Autoscaled: min..max, and no `replicas`.

    The autoscaler writes `replicas`; left out of the manifest, it starts at the CRD default (0) and
    Pulumi never claims the field, so a later `pulumi up` does not reset a running worker group.
    """
    if group.autoscaled:
        return {"minReplicas": group.min_replicas, "maxReplicas": group.max_replicas}
    return {"replicas": group.max_replicas, "minReplicas": group.min_replicas, "maxReplicas": group.max_replicas}


def metadata(settings: Workloads) -> dict:
    """Scaled stacks: Pulumi's apply wins the worker groups back from the autoscaler's patches (PATCH_FORCE)."""
    meta = {
        "name": settings.ray_cluster_name,
        "namespace": settings.namespace,
        "labels": {"app.kubernetes.io/part-of": settings.project},
    }
    if settings.autoscaled:
        meta["annotations"] = {PATCH_FORCE: "true"}
    return meta


def worker_group(settings: Workloads, group: WorkerGroup, image: str) -> dict:
    """One worker group: its pool's nodes, each claimed whole by one worker pod.

    Its Ray node labels go in the group's own `labels` field: KubeRay v1.7.0 refuses them in
    rayStartParams (utils/validation.go, validateRayGroupLabels), passes the field to `ray start
    --labels` and to the pods, and Ray 2.58's autoscaler reads only the field when it picks the group
    that a label selector needs (autoscaler/_private/kuberay/autoscaling_config.py).
    """
    mounts = ({"name": NCCL_LOG_VOLUME, "mountPath": ray_facts.NCCL_LOG_DIR},) if group.gpus else ()
    worker = _container(WORKER_CONTAINER, image, env=worker_env(group, settings.nccl_debug),
                        resources=worker_resources(group.instance, efa=group.efa), extra_mounts=mounts)
    return {
        "groupName": group.name,
        **worker_scaling(group),
        "numOfHosts": 1,
        **({"labels": dict(group.ray_labels)} if group.ray_labels else {}),
        "rayStartParams": {"num-gpus": str(group.gpus)} if group.gpus else {},
        "template": _pod(settings, worker, group.node_selector, group.tolerations,
                         extra_volumes=({"name": NCCL_LOG_VOLUME, "emptyDir": {}},) if group.gpus else (),
                         annotations={SAFE_TO_EVICT: "false"} if group.autoscaled else None,
                         restart_policy=AUTOSCALED_WORKER_RESTART_POLICY if settings.autoscaled else None),
    }


def spec(settings: Workloads, *, image: str, checkpoint_uri: str) -> dict:
    """The RayCluster spec; `image` must already be pinned by digest."""
    if not images.is_pinned(str(image), registry_required=True):
        raise ManifestError(
            f"raytrain-eks:dlcImage: the RayCluster needs an image pinned by digest "
            f"(registry/repository@sha256:<64 hex>), got {image!r}; pin tags with workloads.image.pin first")
    if not str(checkpoint_uri).startswith("s3://"):
        raise ManifestError(
            f"checkpoint URI {checkpoint_uri!r} is not s3://...: Ray Train on several nodes needs shared storage")

    head = _container(
        HEAD_CONTAINER, image,
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, {"name": ray_facts.CHECKPOINT_ENV, "value": checkpoint_uri}],
        resources=head_size(settings.head_instance).quantities(),
        ports=[{"name": name, "containerPort": port} for name, port in ray_facts.HEAD_PORTS.items()],
    )
    autoscaled = settings.autoscaled
    result = {
        "rayVersion": settings.ray_version,
        "upgradeStrategy": dict(UPGRADE_STRATEGY),
        "authOptions": {"mode": "token"},
        "enableInTreeAutoscaling": autoscaled,
        "headGroupSpec": {
            "serviceType": "ClusterIP",
            "rayStartParams": {"num-cpus": "0", "num-gpus": "0", "dashboard-host": "0.0.0.0"},
            "template": _pod(settings, head, settings.system_node_selector, (),
                             extra_volumes=(kube_api_volume(),) if autoscaled else ()),
        },
        "workerGroupSpecs": [worker_group(settings, group, image) for group in settings.worker_groups],
    }
    if autoscaled:
        result["autoscalerOptions"] = autoscaler_options(settings, image)
    return result


def manifest(settings: Workloads, *, image: str, checkpoint_uri: str) -> dict:
    """The whole ray.io/v1 RayCluster object."""
    body = spec(settings, image=image, checkpoint_uri=checkpoint_uri)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata(settings), "spec": body}
