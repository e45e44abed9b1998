"""Ray's names and paths in the cluster: what the RayCluster declares and what the trainer and submit expect."""
from __future__ import annotations

CLUSTER_NAME = "raytrain"
SERVICE_ACCOUNT = "ray-train"  # carries the IRSA role of the checkpoint bucket
DEFAULT_NAMESPACE = "ray"
CLUSTER_LABEL = "ray.io/cluster"  # KubeRay labels every pod of a RayCluster with it (utils.RayClusterLabelKey)
AUTH_TOKEN_KEY = "auth_token"  # key of the Secret KubeRay creates for authOptions.mode token
# The Ray node label naming a worker's node pool: each pool's worker group advertises it (KubeRay's
# worker-group `labels`, which v1.7.0 passes to `ray start --labels` and refuses in rayStartParams), and
# `trainer submit --pool` selects it (Ray Train's ScalingConfig.label_selector), so a job's workers land
# on one pool only. Not under ray.io/, which Ray reserves for its own labels.
POOL_LABEL = "raytrain.io/pool"

DASHBOARD_PORT = 8265  # dashboard and Jobs API
HEAD_PORTS = {"gcs-server": 6379, "dashboard": DASHBOARD_PORT, "client": 10001}

TMP_DIR = "/tmp/ray"  # session logs; a volume of its own on every Ray pod
# Where `trainer submit` has NCCL write its per-rank debug files; the worker pods mount a volume
# there, because NCCL creates no directories.
NCCL_LOG_DIR = f"{TMP_DIR}/nccl"
# Set on the head: the jobs' default storage (the stack's checkpoint bucket).
CHECKPOINT_ENV = "CHECKPOINT_URI"
# Set by `trainer submit --address` when neither the flags nor a stack name the storage: the job's run
# folder on a single-node cluster whose head has no CHECKPOINT_URI (`~` is the head's user's home; Ray
# Train takes only absolute paths or URIs). A cluster of several nodes needs --storage-path s3://...
NODE_RUNS_ENV = "TRAINER_NODE_RUNS"
NODE_RUNS_DIR = "~/trainer-runs"


def head_service(cluster: str = CLUSTER_NAME) -> str:
    """KubeRay names the head Service <raycluster>-head-svc."""
    return f"{cluster}-head-svc"


def pool_labels(pool: str) -> dict[str, str]:
    """The Ray node labels of a pool's worker group; as a label selector, they place work on that pool."""
    return {POOL_LABEL: pool}
