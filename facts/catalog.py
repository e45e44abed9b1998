"""Instance catalog: the hardware facts every other module sizes itself from.

Node pools' launch templates (EFA interfaces), the RayCluster's worker resources
(GPUs, EFA devices, huge pages, CPU, memory), the Cluster Autoscaler's node
templates, the trainer's communication estimate, the cost estimate and the policy
pack's GPU cap all read these rows, so moving a stack to another GPU family is a
one-line configuration change, and adding a GPU type is one row here.

Prices are on-demand Linux prices per hour in us-east-1 as listed on the EC2
pricing page (https://aws.amazon.com/ec2/pricing/on-demand/); they drift, so they
are estimates, not bills. P-series prices are after AWS's June 2025 price cut.
A price with no public us-east-1 listing says so in `price_note`. GPU memory is
what EC2 reports (DescribeInstanceTypes GpuInfo, MiB), not the datasheet's GB.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from facts.resources import EFA_HUGEPAGES_REQUEST

EC2_DOCS = "https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html"
EFA_DOCS = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types"
PRICING = "https://aws.amazon.com/ec2/pricing/on-demand/ (us-east-1, Linux)"
HUGEPAGES_DOCS = "https://docs.aws.amazon.com/eks/latest/userguide/node-efa.html"
GPUDIRECT_NOTE = "aws-ofi-nccl issue 547: g5/g6/g6e have EFA without GPUDirect RDMA"

# Per-GPU bandwidth inside a node, GB/s in one direction, for the communication estimate: NVLink by chip
# (an NVLink chip not listed is taken at 300), else PCIe Gen4 x16 (L4, L40S, A10G: 32 GB/s raw, ~25 usable).
NVLINK_GBYTES_PER_S = {"A100": 300.0, "H100": 450.0, "H200": 450.0, "B200": 900.0}
PCIE_GBYTES_PER_S = 25.0

@dataclass(frozen=True)
class GpuInstanceType:
    name: str
    gpus: int
    gpu_model: str
    gpu_memory_mib: int  # per GPU, as EC2 reports it
    gpu_bf16_tflops: float  # dense, per GPU, datasheet
    vcpus: int
    memory_gib: int
    efa_interfaces: int  # one per network card
    gpudirect_rdma: bool
    nvlink: bool
    network_gbps: int
    hugepages_2mi: str | None
    price_per_hour: float
    sources: tuple[str, ...]
    price_note: str | None = None  # set when the price is an estimate rather than a published list price

    @property
    def efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def gpu_memory_gib(self) -> float:
        return round(self.gpu_memory_mib / 1024, 2)

    @property
    def intra_node_gbytes_per_s(self) -> float:
        if not self.nvlink:
            return PCIE_GBYTES_PER_S
        return NVLINK_GBYTES_PER_S.get(self.gpu_model.split()[-1], 300.0)


@dataclass(frozen=True)
class CpuInstanceType:
    name: str
    vcpus: int
    memory_gib: int
    price_per_hour: float
    sources: tuple[str, ...] = (EC2_DOCS, PRICING)
    price_note: str | None = None

    # What a GPU row has, as a CPU type has it: code sizing a node reads either kind.
    gpus = 0
    gpu_model = None
    efa_interfaces = 0
    efa = False
    nvlink = False
    hugepages_2mi = None


def _gpu(name, gpus, model, mem_mib, tflops, vcpus, ram, efa, rdma, nvlink, gbps, price, extra=(), price_note=None):
    return GpuInstanceType(
        name=name, gpus=gpus, gpu_model=model, gpu_memory_mib=mem_mib, gpu_bf16_tflops=tflops,
        vcpus=vcpus, memory_gib=ram, efa_interfaces=efa, gpudirect_rdma=rdma, nvlink=nvlink,
        network_gbps=gbps, hugepages_2mi=EFA_HUGEPAGES_REQUEST if efa else None,
        price_per_hour=price, sources=(EC2_DOCS, EFA_DOCS, PRICING, HUGEPAGES_DOCS, *extra), price_note=price_note,
    )


L4 = ("https://www.nvidia.com/en-us/data-center/l4/ (121 TFLOP/s dense bf16)", GPUDIRECT_NOTE)
L40S = ("https://www.nvidia.com/en-us/data-center/l40s/ (362 TFLOP/s dense bf16)", GPUDIRECT_NOTE)
A100 = ("https://www.nvidia.com/en-us/data-center/a100/ (312 TFLOP/s dense bf16)",)
H100 = ("https://www.nvidia.com/en-us/data-center/h100/ (989 TFLOP/s dense bf16, SXM)",)
H200 = ("https://www.nvidia.com/en-us/data-center/h200/ (989 TFLOP/s dense bf16)",)

GPU_TYPES: dict[str, GpuInstanceType] = {t.name: t for t in (
    _gpu("g6.12xlarge", 4, "NVIDIA L4", 22888, 121.0, 48, 192, 1, False, False, 40, 4.6016, L4),
    _gpu("g6.48xlarge", 8, "NVIDIA L4", 22888, 121.0, 192, 768, 1, False, False, 100, 13.3504, L4),
    _gpu("g6e.12xlarge", 4, "NVIDIA L40S", 45776, 362.0, 48, 384, 1, False, False, 100, 10.4926, L40S),
    _gpu("g6e.48xlarge", 8, "NVIDIA L40S", 45776, 362.0, 192, 1536, 4, False, False, 400, 30.1308, L40S),
    _gpu("p4d.24xlarge", 8, "NVIDIA A100", 40960, 312.0, 96, 1152, 4, True, True, 400, 21.9576, A100),
    _gpu("p5.48xlarge", 8, "NVIDIA H100", 81920, 989.0, 192, 2048, 32, True, True, 3200, 55.04, H100),
    _gpu("p5e.48xlarge", 8, "NVIDIA H200", 144384, 989.0, 192, 2048, 32, True, True, 3200, 63.296, H200,
         price_note="estimate: AWS publishes no us-east-1 On-Demand price for p5e.48xlarge (it is sold through "
                    "Capacity Blocks); this is p5en.48xlarge's list price"),
)}

# GPU types that exist but have no EFA: named so the error can say why they are refused.
NON_EFA_GPU_TYPES = frozenset({
    "g4dn.xlarge", "g4dn.12xlarge", "g5.xlarge", "g5.2xlarge", "g5.12xlarge",
    "g6.xlarge", "g6.2xlarge", "g6.4xlarge", "g6e.xlarge", "g6e.2xlarge", "p3.2xlarge",
})

CPU_TYPES: dict[str, CpuInstanceType] = {t.name: t for t in (
    CpuInstanceType("m7i.large", 2, 8, 0.1008),
    CpuInstanceType("m7i.xlarge", 4, 16, 0.2016),
    CpuInstanceType("m7i.2xlarge", 8, 32, 0.4032),
    CpuInstanceType("m7i.4xlarge", 16, 64, 0.8064),
    CpuInstanceType("m6i.xlarge", 4, 16, 0.192),
    CpuInstanceType("m6i.2xlarge", 8, 32, 0.384),
    CpuInstanceType("m5.xlarge", 4, 16, 0.192),
    CpuInstanceType("m5.2xlarge", 8, 32, 0.384),
)}

HOURS_PER_MONTH = 730  # AWS's own convention for monthly prices
EKS_CONTROL_PLANE_PER_HOUR = 0.10  # standard support; extended support is 0.60 (https://aws.amazon.com/eks/pricing/)
NAT_GATEWAY_PER_HOUR = 0.045  # https://aws.amazon.com/vpc/pricing/ (NAT gateway, us-east-1)
PUBLIC_IPV4_PER_HOUR = 0.005  # https://aws.amazon.com/vpc/pricing/ (public IPv4 address, in use)
GP3_PER_GB_MONTH = 0.08  # https://aws.amazon.com/ebs/pricing/ (gp3 storage, us-east-1; baseline IOPS and throughput free)
# Billed by use, so not in the hourly total; the plan lists them.
NAT_GATEWAY_PER_GB = 0.045  # https://aws.amazon.com/vpc/pricing/ (data processed; S3 goes through the free gateway endpoint)
LOG_INGESTION_PER_GB = 0.50  # https://aws.amazon.com/cloudwatch/pricing/ (standard logs ingested, us-east-1)
LOG_STORAGE_PER_GB_MONTH = 0.03  # https://aws.amazon.com/cloudwatch/pricing/ (archived logs)


InstanceType = GpuInstanceType | CpuInstanceType

# EC2 instance families with GPUs (P, G, and Graviton G: g5g): what the policy pack caps and the
# Service Quotas family a type bills under.
_GPU_FAMILY = re.compile(r"^(p|g|gr)\d+[a-z0-9-]*\.")


def instance_type(name: str) -> InstanceType | None:
    """The catalog row of `name`, GPU or CPU; None when the catalog does not know it."""
    return GPU_TYPES.get(name) or CPU_TYPES.get(name)


def is_gpu_type(name: str) -> bool:
    """True for any EC2 type of a GPU family, in the catalog or not (g4dn.xlarge, p3.2xlarge, ...)."""
    return name in GPU_TYPES or bool(_GPU_FAMILY.match(name))


def quota_family(name: str) -> str:
    """The EC2 vCPU quota family an instance type counts against: "P", "G" or "standard"."""
    if not is_gpu_type(name):
        return "standard"
    return "P" if name.startswith("p") else "G"
