"""KubeRay RayJob mode (`submit --stack NAME --rayjob`): a run as a Kubernetes object that caps its own cost.

The RayJob carries the run: KubeRay (v1.7.0) creates its cluster from `rayClusterSpec` (the stack's
rayJobClusterSpec output, built by workloads.raycluster.spec, the code that builds the stack's
RayCluster), submits the entrypoint over the dashboard's HTTP API (HTTPMode: the operator's namespace
may reach the dashboard port, see workloads.network_policy), and deletes the cluster when the job ends
(shutdownAfterJobFinishes; the RayJob itself after ttlSecondsAfterFinished). `--max-hours` is
activeDeadlineSeconds (the whole job, every attempt), `--max-wait` preRunningDeadlineSeconds (until the job
runs: a p5 that never gets capacity), `--retries` backoffLimit (a new cluster and a new attempt that resumes
the same run name from its last complete checkpoint). `--rayjob stack` runs on the stack's RayCluster
(clusterSelector), where KubeRay allows no retries and deletes nothing.

The job's package cannot be uploaded by the operator from this machine: it is one zip (trainer, facts,
job.yaml; one top-level folder, as Ray wants remote working_dirs) under the run storage's `_packages/`,
named by its sha256, so the same package is uploaded once and a dry run names the URI it would use.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from facts import ray as ray_facts
from facts.errors import EXIT_FAILED, EXIT_OK, EXIT_STOPPED
from trainer.submit.target import SubmitError, Target, kubectl, run_command

API_VERSION = "ray.io/v1"
KIND = "RayJob"
SUBMISSION_MODE = "HTTPMode"
# KubeRay v1.7.0 utils/constant.go: MaxRayJobNameLength = MaxRayClusterNameLength (53) - 6; a DNS-1035 label.
MAX_NAME_LENGTH = 47
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DEFAULT_TTL_S = 600  # the finished RayJob stays this long, for `status` and `logs`; its cluster goes at once
ENTRYPOINT_NUM_CPUS = 1  # the head advertises no CPUs: the driver's pre-flight runs on a worker node, not the head
PACKAGES = "_packages"
PACKAGE_ROOT = "job"  # the zip's one top-level folder: Ray uses its contents as the working_dir
ZIP_TIME = (2020, 1, 1, 0, 0, 0)  # fixed: the same files give the same bytes and the same name
OWN, STACK = "own", "stack"


@dataclass(frozen=True)
class Caps:
    """What bounds a RayJob: wall-clock caps (None: none) and the attempts after the first."""

    max_hours: float | None = None
    max_wait_minutes: float | None = None
    retries: int = 0
    ttl_s: int = DEFAULT_TTL_S

    def problems(self, mode: str) -> list[str]:
        out = []
        if self.max_hours is not None and self.max_hours * 3600 < 1:
            out.append(f"--max-hours {self.max_hours:g}: must be positive (KubeRay needs activeDeadlineSeconds >= 1)")
        if self.max_wait_minutes is not None and self.max_wait_minutes * 60 < 1:
            out.append(f"--max-wait {self.max_wait_minutes:g}: must be positive minutes "
                       "(KubeRay needs preRunningDeadlineSeconds >= 1)")
        if self.retries < 0:
            out.append(f"--retries {self.retries}: must be 0 or more")
        if self.retries and mode == STACK:
            out.append(f"--retries {self.retries}: KubeRay retries a RayJob only with a cluster of its own (a new one "
                       "per attempt); drop --retries, or use --rayjob (not --rayjob stack)")
        if self.ttl_s < 0:
            out.append(f"--ttl {self.ttl_s}: must be 0 or more seconds")
        return out


def job_name(run_name: str) -> str:
    """The RayJob's name: the run name, which KubeRay v1.7.0 must accept (ValidateRayJobMetadata)."""
    if len(run_name) > MAX_NAME_LENGTH or not DNS1035.match(run_name):
        fixed = re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-")
        fixed = (fixed if fixed[:1].isalpha() else f"run-{fixed}")[:MAX_NAME_LENGTH].rstrip("-")
        raise SubmitError(f"--run-name {run_name}: a RayJob is named after its run, and KubeRay accepts at most "
                          f"{MAX_NAME_LENGTH} lowercase letters, digits and '-', starting with a letter and ending "
                          f"with a letter or digit; pass --run-name {fixed}")
    return run_name


def package(working_dir: Path) -> tuple[bytes, str]:
    """The staged folder as a deterministic zip under one top-level folder, and its sha256."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(p for p in working_dir.rglob("*") if p.is_file()):
            info = zipfile.ZipInfo(f"{PACKAGE_ROOT}/{path.relative_to(working_dir).as_posix()}", ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes())
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def package_uri(storage: str, digest: str) -> str:
    return f"{storage.rstrip('/')}/{PACKAGES}/{digest}.zip"


def manifest(*, name: str, namespace: str, entrypoint: str, runtime_env: dict, caps: Caps,
             cluster_spec: dict | None = None, cluster: str | None = None, labels: dict | None = None) -> dict:
    """The ray.io/v1 RayJob: with `cluster_spec` a cluster of its own, else `cluster` by clusterSelector."""
    import yaml

    if (cluster_spec is None) == (cluster is None):
        raise ValueError("pass exactly one of cluster_spec (a cluster of its own) or cluster (clusterSelector)")
    spec: dict = {
        "entrypoint": entrypoint,
        "runtimeEnvYAML": yaml.safe_dump(runtime_env, sort_keys=True),
        "submissionMode": SUBMISSION_MODE,
        "entrypointNumCpus": ENTRYPOINT_NUM_CPUS,
    }
    if caps.max_hours is not None:
        spec["activeDeadlineSeconds"] = max(1, round(caps.max_hours * 3600))
    if caps.max_wait_minutes is not None:
        spec["preRunningDeadlineSeconds"] = max(1, round(caps.max_wait_minutes * 60))
    if cluster_spec is not None:
        spec.update(backoffLimit=caps.retries, shutdownAfterJobFinishes=True, ttlSecondsAfterFinished=caps.ttl_s,
                    rayClusterSpec=json.loads(json.dumps(cluster_spec)))
    else:
        spec["clusterSelector"] = {ray_facts.CLUSTER_LABEL: cluster}
    meta = {"name": job_name(name), "namespace": namespace, **({"labels": dict(labels)} if labels else {})}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}


def head_env(cluster_spec: dict, name: str) -> str | None:
    """An environment variable of the cluster spec's head container (CHECKPOINT_URI: the stack's bucket)."""
    for container in cluster_spec["headGroupSpec"]["template"]["spec"]["containers"]:
        for item in container.get("env", []):
            if item.get("name") == name:
                return item.get("value")
    return None


# --- the Kubernetes API, through kubectl (as the rest of `submit`) ------------------------------------------

def get(target: Target, name: str) -> dict | None:
    """The RayJob as the API server has it, or None when there is none of that name."""
    try:
        return json.loads(run_command([*kubectl(target), "get", "rayjob", name, "-o", "json", "--ignore-not-found"],
                                      f"reading RayJob {name}") or "null")
    except ValueError:
        raise SubmitError(f"reading RayJob {name}: kubectl did not print JSON") from None


def create(target: Target, body: dict) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="rayjob-") as f:
        json.dump(body, f)
        f.flush()
        run_command([*kubectl(target), "create", "-f", f.name], f"creating RayJob {body['metadata']['name']}")


def delete(target: Target, name: str) -> None:
    run_command([*kubectl(target), "delete", "rayjob", name, "--ignore-not-found", "--wait=true"],
                f"deleting RayJob {name}", timeout=300)


TERMINAL = ("Complete", "Failed")


def attempt(status: dict) -> int:
    """Which attempt runs (or ran last): KubeRay counts the finished ones in status.failed / status.succeeded."""
    done = int(status.get("failed") or 0) + int(status.get("succeeded") or 0)
    return max(1, done + (0 if status.get("jobDeploymentStatus") in TERMINAL else 1))


def describe(job: dict) -> str:
    """One line: the deployment and Ray job status, the attempt out of the allowed ones, the cluster, the job id."""
    status, spec = job.get("status") or {}, job["spec"]
    allowed = 1 + int(spec.get("backoffLimit") or 0)
    parts = [f"RayJob {job['metadata']['name']}: {status.get('jobDeploymentStatus') or 'New'}",
             f"Ray job {status.get('jobStatus') or 'not submitted yet'}",
             f"attempt {attempt(status)} of {allowed}"]
    if status.get("failed"):
        parts.append(f"{status['failed']} failed")
    if status.get("rayClusterName"):
        parts.append(f"cluster {status['rayClusterName']}")
    if status.get("jobId"):
        parts.append(f"job id {status['jobId']}")
    line = ", ".join(parts)
    reason = " ".join(filter(None, (status.get("reason"), status.get("message"))))
    return f"{line} ({reason})" if reason else line


def exit_code(job: dict) -> int:
    status = job.get("status") or {}
    deployment = status.get("jobDeploymentStatus")
    if deployment == "Failed":
        return EXIT_FAILED
    if status.get("jobStatus") == "STOPPED":
        return EXIT_STOPPED
    return EXIT_OK


def cluster_target(target: Target, job: dict) -> Target:
    """The head of the RayJob's current cluster (its own, or the selected one), for `logs`."""
    status = job.get("status") or {}
    cluster = status.get("rayClusterName") or (job["spec"].get("clusterSelector") or {}).get(ray_facts.CLUSTER_LABEL)
    if not cluster or not status.get("jobId"):
        raise SubmitError(f"RayJob {job['metadata']['name']} has no Ray job yet ({describe(job)}); try again once "
                          "its cluster is up")
    return Target(None, target.namespace, ray_facts.head_service(cluster), cluster, target.kubeconfig)
