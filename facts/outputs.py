"""The stack outputs: what the Pulumi program exports and what `trainer submit --stack` reads back."""
from __future__ import annotations

CLUSTER_NAME = "clusterName"
REGION = "region"
GPU_AVAILABILITY_ZONE = "gpuAvailabilityZone"
GPU_AVAILABILITY_ZONE_ID = "gpuAvailabilityZoneId"
KUBECONFIG = "kubeconfig"  # secret
CHECKPOINT_BUCKET_URI = "checkpointBucketUri"
RAY_IRSA_ROLE_ARN = "rayIrsaRoleArn"
RAY_NAMESPACE = "rayNamespace"
RAY_HEAD_SERVICE = "rayHeadService"
RAY_CLUSTER_NAME = "rayClusterName"
GPU_NODE_TYPE = "gpuNodeType"  # the first GPU node pool's instance type
GPU_NODE_COUNT = "gpuNodeCount"  # and its largest size
NODE_POOLS = "nodePools"  # {pool name: {POOL_...: value}}, every pool
POOL_INSTANCE_TYPE = "instanceType"
POOL_MAX_SIZE = "maxSize"
POOL_GPUS_PER_NODE = "gpusPerNode"
POOL_RAY_WORKER_GROUP = "rayWorkerGroup"  # None: no Ray workers on the pool
POOL_DISK_SIZE_GIB = "diskSizeGib"  # the root volume of each node: where a node caches the prepared data
POOL_RAY_LABELS = "rayLabels"  # the Ray node labels of its worker group: what `submit --pool` selects
DASHBOARD_PORT_FORWARD = "dashboardPortForward"
ESTIMATED_COST_PER_HOUR = "estimatedCostPerHour"
DLC_IMAGE = "dlcImage"
# The rayClusterSpec of a RayJob's own cluster (`trainer submit --rayjob`): the RayCluster's spec, same code.
RAY_JOB_CLUSTER_SPEC = "rayJobClusterSpec"
CLUSTER_AUTOSCALER_ROLE_ARN = "clusterAutoscalerRoleArn"  # only when a node pool scales to zero

SECRET = (KUBECONFIG,)
# What `trainer submit --stack` cannot work without.
REQUIRED_BY_SUBMIT = (RAY_NAMESPACE, RAY_HEAD_SERVICE, KUBECONFIG)
